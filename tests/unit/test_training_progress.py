"""Training progress from the job's own metric lines: the parser, the formatter, the throttle, the follower.

What `d2ops run` / `d2ops demo` print while "Train model" waits (d2ops.offline.log_progress and the
follower in d2ops.offline.progress). The real trainers' lines are checked where they really train:
tests/integration/test_training_jobs.py (torchvision, two hosts), test_detectron2_training.py, and
the offline pipeline end to end (tests/e2e/test_offline_pipeline.py).
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st

from d2ops.local import jobs as local_jobs
from d2ops.local.job_log import host_line, split_host_line
from d2ops.offline.log_progress import LineSplitter, Progress, ProgressParser, ProgressReporter, format_progress
from d2ops.offline.progress import TrainingProgressFollower, _LogTail
from d2ops_core import metrics

TOTAL = 250


def step(iteration: int, *, loss: float = 0.5, seconds: float = 0.25, batch: int = 4, total: int = TOTAL,
         host: str = "algo-1") -> list[str]:
    """The lines rank 0 prints at one logged iteration, as the local runner writes them."""
    values = {"train:loss": loss, "train:lr": 0.02, "train:iter_seconds": seconds,
              "train:images_per_second": batch / seconds}
    return [f"[{host}] {metrics.format_metric_line(name, value, iteration, total)}" for name, value in values.items()]


def parse(lines: list[str]) -> Progress | None:
    """Where a log that holds these lines, and ended there, says the job is."""
    parser = ProgressParser()
    for line in lines:
        parser.feed(line)
    parser.flush()
    return parser.progress


# ----- the one line a user reads ---------------------------------------------------------------------
def test_a_logged_iteration_reads_as_progress_loss_speed_and_time_left() -> None:
    progress = parse(["[algo-1] training fasterrcnn on 160 images", *step(120, loss=0.8121, seconds=0.29)])
    assert progress == Progress(120, TOTAL, loss=0.8121, images_per_second=13.793103, seconds_per_iteration=0.29)
    # 130 iterations left at 0.29 s: 37.7 s, shown rounded up
    assert format_progress("Train model", progress) == \
        "Train model: iter 120/250 (48%)  loss 0.812  13.8 img/s  ~0:38 left"


def test_the_last_iteration_has_no_time_left_and_long_runs_show_hours() -> None:
    assert format_progress("Train model", parse(step(TOTAL, loss=0.25))) == \
        "Train model: iter 250/250 (100%)  loss 0.250  16.0 img/s"
    hours = parse(step(1, seconds=2.0, total=90_000))
    assert format_progress("T", hours).endswith("  ~49:59:58 left")
    assert format_progress("T", parse(step(1, seconds=1e9, total=2))).endswith("~100+ h left")
    # 99.9 % is not "100%" before the job is there
    assert "(99%)" in format_progress("T", parse(step(999, total=1000)))
    # slow CPUs and big losses read as well as the usual ones
    assert format_progress("T", parse(step(3, loss=123456.0, seconds=20.0))) == \
        "T: iter 3/250 (1%)  loss 1.23e+05  0.20 img/s  ~1:22:20 left"


def test_lines_of_other_metrics_hosts_and_values_the_job_never_prints_change_nothing() -> None:
    base = step(40)
    noise = ["[algo-2] " + metrics.format_metric_line("train:loss", 9.0, 80, TOTAL),  # another host
             "[algo-1] " + metrics.format_metric_line("val:bbox_AP", 0.5, 80),  # not training progress
             "[algo-1] d2ops-metric train:loss=nan iter=80/250",  # NaN: not a number SageMaker's regex takes
             "[algo-1] d2ops-metric train:loss=0.3",  # no iteration: cannot say where the job is
             "[algo-1] d2ops-metric train:made_up=1 iter=80/250",
             "[algo-1] iter 80/250 loss 9 (the trainer's human line)",
             "[algo-1] d2ops-metric train:loss=0.3 iter=" + "9" * 5000,  # int() would refuse 5000 digits
             "local runner: stopping the job"]
    assert parse(base + noise) == parse(base)


def test_a_huge_loss_is_shown_as_it_is_and_a_zero_step_time_or_endless_speed_are_left_out() -> None:
    lines = ["[algo-1] d2ops-metric train:loss=1e999 iter=10/250",  # what float() makes of it: inf
             "[algo-1] d2ops-metric train:iter_seconds=0 iter=10/250",
             "[algo-1] d2ops-metric train:images_per_second=1e999 iter=10/250"]
    assert format_progress("T", parse(lines)) == "T: iter 10/250 (4%)  loss inf"


def test_the_job_runner_writes_the_host_prefix_the_progress_reader_splits_off() -> None:
    written: list[str] = []
    streams = local_jobs._Streams(written.append)
    for host, iteration in (("algo-1", 20), ("algo-2", 90)):
        lines = [metrics.format_metric_line(name, value, iteration, TOTAL)
                 for name, value in (("train:loss", 0.5), ("train:images_per_second", 16.0))]
        streams.follow(host, io.StringIO("".join(f"{line}\n" for line in lines)))
        streams.join()  # one host after the other: algo-1 prints first, so it is the one followed
    assert split_host_line(written[0]) == ("algo-1", "d2ops-metric train:loss=0.500000 iter=20/250")
    assert parse(written) == Progress(20, TOTAL, loss=0.5, images_per_second=16.0)
    assert split_host_line("local runner: stopping the job") == (None, "local runner: stopping the job")


@given(st.from_regex(r"algo-[1-9][0-9]{0,3}", fullmatch=True), st.text().filter(lambda t: "\n" not in t))
def test_a_hosts_line_splits_back_into_the_host_and_the_line_it_printed(host: str, line: str) -> None:
    assert split_host_line(host_line(host, line)) == (host, line)


# ----- Hypothesis: hostile, partial, interleaved lines ------------------------------------------------
_numbers = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)
_steps = st.lists(st.tuples(st.integers(1, 10**6), _numbers, _numbers), min_size=1, max_size=8)


@st.composite
def _noise(draw: st.DrawFn) -> str:
    """A log line that is not the lead host's training metric line."""
    kind = draw(st.sampled_from(["other-host", "val", "text", "cut", "no-iter"]))
    iteration = draw(st.integers(0, 10**9))
    value = draw(_numbers)
    if kind == "other-host":
        host = draw(st.sampled_from(["algo-2", "algo-3", "", "rank1"]))
        return f"[{host}] " + metrics.format_metric_line("train:loss", value, iteration, max(1, iteration))
    if kind == "val":
        return "[algo-1] " + metrics.format_metric_line("val:bbox_AP50", min(value, 1.0), iteration)
    if kind == "no-iter":
        return "[algo-1] " + metrics.format_metric_line("train:loss", value)
    if kind == "cut":  # a line cut before its value: what a half-written line can look like
        line = metrics.format_metric_line("train:loss", value, iteration)
        return "[algo-1] " + line[:draw(st.integers(0, line.index("=")))]
    text = draw(st.text(max_size=80).filter(lambda t: "\n" not in t and "\r" not in t))
    assume(not re.match(r"\s*d2ops-metric", text))
    return "[algo-1] " + text


@given(_steps, st.lists(st.tuples(st.integers(0, 40), _noise()), max_size=12))
def test_interleaved_noise_never_changes_where_the_job_is(steps: list[tuple[int, float, float]],
                                                          noise: list[tuple[int, str]]) -> None:
    clean = [line for iteration, loss, seconds in steps for line in step(iteration, loss=loss, seconds=seconds,
                                                                         total=10**6)]
    mixed = clean[1:]
    for position, line in noise:
        mixed.insert(min(position, len(mixed)), line)
    mixed.insert(0, clean[0])  # the lead host: the first to print a training line
    assert parse(mixed) == parse(clean)


@given(st.lists(st.one_of(_noise(), st.text(max_size=200),
                          st.builds(lambda i, t, v, n: f"[algo-1] d2ops-metric {n}={v} iter={i}/{t}",
                                    st.integers(0, 10**15), st.integers(0, 10**15),
                                    st.sampled_from(["0", "-3", "1e999", "-1e999", "1e-999", "7.5", ".5"]),
                                    st.sampled_from(metrics.TRAIN_METRICS))), max_size=30))
def test_whatever_the_log_holds_the_line_is_one_short_sane_line(lines: list[str]) -> None:
    progress = parse(lines)
    if progress is None:
        return
    text = format_progress("Train model", progress)
    assert "\n" not in text and len(text) < 160, text
    percent = re.search(r"\((\d+)%\)", text)
    assert percent is None or 0 <= int(percent[1]) <= 100
    left = progress.seconds_left
    assert left is None or (left >= 0 and not math.isnan(left))


@given(st.lists(st.binary(max_size=40) | st.sampled_from([b"\n", "é€".encode(), b"d2ops-metric "]), max_size=30),
       st.lists(st.integers(1, 50), min_size=1, max_size=10))
def test_a_log_read_in_any_chunks_gives_the_same_whole_lines(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    whole = LineSplitter()
    expected = whole.feed(data) + whole.flush()
    chunked, splitter, position, i = [], LineSplitter(), 0, 0
    while position < len(data):
        size = cuts[i % len(cuts)]
        chunk = data[position:position + size]
        lines = splitter.feed(chunk)
        # a line is handed out only once its newline arrived: never half of one
        assert len(lines) == data[:position + size].count(b"\n") - data[:position].count(b"\n")
        chunked += lines
        position, i = position + size, i + 1
    assert chunked + splitter.flush() == expected
    decoded = [line.rstrip("\r") for line in data.decode("utf-8", "replace").split("\n")]
    assert expected == (decoded[:-1] if decoded[-1] == "" else decoded)


# ----- how often it speaks -------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_at_most_one_line_per_interval_but_the_first_and_the_last_at_once() -> None:
    clock = Clock()
    reporter = ProgressReporter("Train model", min_interval=5.0, clock=clock)
    assert reporter.feed(["[algo-1] loading"]) is None  # nothing to say before a metric line
    assert reporter.feed(step(20)).startswith("Train model: iter 20/250")  # the first at once
    clock.now = 1.0
    assert reporter.feed(step(40)) is None  # too soon
    clock.now = 4.9
    assert reporter.feed([]) is None
    clock.now = 5.0
    assert reporter.feed(step(60)).startswith("Train model: iter 60/250")  # 5 s after the last one
    assert reporter.feed(step(60)) is None  # the same iteration again says nothing new
    clock.now = 5.5
    assert reporter.feed(step(250)).startswith("Train model: iter 250/250 (100%)")  # the end, at once
    assert reporter.finish() is None  # already said


def test_finish_says_where_the_job_ended_when_that_was_held_back() -> None:
    clock = Clock()
    reporter = ProgressReporter("Train model", min_interval=5.0, clock=clock)
    reporter.feed(step(20))
    clock.now = 1.0
    assert reporter.feed(step(40)) is None
    assert reporter.finish().startswith("Train model: iter 40/250 (16%)")
    assert ProgressReporter("Train model").finish() is None  # a job that never printed a metric line


def test_an_iteration_whose_lines_are_still_coming_is_not_printed_with_the_last_ones_speed() -> None:
    clock = Clock()
    reporter = ProgressReporter("Train model", min_interval=5.0, clock=clock)
    assert reporter.feed(step(20)) == "Train model: iter 20/250 (8%)  loss 0.500  16.0 img/s  ~0:58 left"
    clock.now = 10.0
    slower = step(40, loss=0.25, seconds=0.5)
    assert reporter.feed(slower[:3]) is None  # loss, lr, seconds per iteration: images/s not read yet
    # the same iteration, once whole: its own speed and time left (210 iterations at 0.5 s)
    assert reporter.feed(slower[3:]) == "Train model: iter 40/250 (16%)  loss 0.250  8.00 img/s  ~1:45 left"


def test_an_iteration_without_speed_lines_is_whole_when_the_next_one_starts_or_the_log_ends() -> None:
    def untimed(iteration: int) -> list[str]:  # detectron2 times no step in its first iterations
        return [f"[algo-1] {metrics.format_metric_line(name, value, iteration, TOTAL)}"
                for name, value in (("train:loss", 0.5), ("train:lr", 0.02))]

    reporter = ProgressReporter("Train model", min_interval=0.0, clock=Clock())
    assert reporter.feed(untimed(20)) is None  # its speed may still come
    assert reporter.feed(untimed(40)) == "Train model: iter 20/250 (8%)  loss 0.500"
    assert reporter.finish() == "Train model: iter 40/250 (16%)  loss 0.500"


# ----- the follower, on history events and a log that grows ---------------------------------------
def _events(job: str, resource: str = "createTrainingJob.sync", state: str = "Train model") -> dict[str, dict]:
    details = {"resourceType": "sagemaker", "resource": resource}
    return {"entered": {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": state}},
            "scheduled": {"type": "TaskScheduled", "taskScheduledEventDetails": {
                **details, "region": "us-east-1", "parameters": json.dumps({"TrainingJobName": job})}},
            "succeeded": {"type": "TaskSucceeded", "taskSucceededEventDetails": {**details, "output": "{}"}}}


def _follower(tmp_path: Path, run_id: str | None = "run-1") -> tuple[TrainingProgressFollower, list[str], Clock]:
    """A follower of run-1's (or a run not known yet's) jobs, whose logs are tmp_path/<job>/job.log; what it printed."""
    clock, printed = Clock(), []
    follower = TrainingProgressFollower(lambda name: tmp_path / name / "job.log", printed.append, lambda: "[t]",
                                        run_id=run_id, min_interval=5.0, clock=clock)
    return follower, printed, clock


def _schedule(follower: TrainingProgressFollower, job: str, run: str = "run-1", **kwargs: str) -> dict[str, dict]:
    """What the follower hears when a run's state starts a job: the state entered, the job scheduled."""
    events = _events(job, **kwargs)
    follower(run, events["entered"])
    follower(run, events["scheduled"])
    return events


def _log_two_steps(follower: TrainingProgressFollower, clock: Clock, log: Path, later: float) -> None:
    """The job logs iteration 20, then (at ``later`` seconds) iteration 40; the follower polls after each."""
    _append(log, step(20))
    follower.poll()
    clock.now = later
    _append(log, step(40))
    follower.poll()


def _append(path: Path, lines: list[str], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as log:
        log.write("".join(f"{line}\n" for line in lines) + tail)


def test_the_follower_prints_progress_while_the_state_waits_and_where_the_job_ended(tmp_path: Path) -> None:
    follower, printed, clock = _follower(tmp_path)
    events = _schedule(follower, "shapes-v1-train")
    follower.poll()  # the job is still downloading its channels: no log yet
    log = tmp_path / "shapes-v1-train" / "job.log"
    assert len(printed) == 1
    # a line being written when the follower reads waits for its newline
    _append(log, ["[algo-1] local runner: ...", *step(20)], tail="[algo-1] d2ops-metric train:loss=0.4 iter=4")
    follower.poll()
    assert printed == [f"[t]      Train model: training job shapes-v1-train, log {log}",  # where to look, at once
                       "[t]      Train model: iter 20/250 (8%)  loss 0.500  16.0 img/s  ~0:58 left"]
    _append(log, ["0/250", *step(40, loss=0.25)])  # the half line completed: loss 0.4 at 40, then 0.25
    clock.now = 2.0
    follower.poll()  # 2 s after the last line: held back
    assert len(printed) == 2
    clock.now = 7.0
    follower.poll()  # nothing new in the log, but what was held back is old enough now
    assert printed[-1] == "[t]      Train model: iter 40/250 (16%)  loss 0.250  16.0 img/s  ~0:53 left"
    clock.now = 20.0
    follower.poll()
    assert len(printed) == 3  # nothing new: nothing said
    _append(log, step(60))
    clock.now = 21.0
    follower.poll()
    _append(log, step(80))
    clock.now = 22.0
    follower.poll()
    assert len(printed) == 4 and "iter 60/250" in printed[-1]
    follower("run-1", events["succeeded"])  # the state's task ended: the rest of the log at once
    assert printed[-1].startswith("[t]      Train model: iter 80/250 (32%)")
    _append(log, step(100))
    clock.now = 60.0
    follower.poll()
    assert len(printed) == 5  # no longer following


def test_the_follower_ignores_other_runs_other_jobs_and_logs_without_metric_lines(tmp_path: Path) -> None:
    follower, printed, _ = _follower(tmp_path)
    _schedule(follower, "other-run-train", run="run-2")
    _append(tmp_path / "other-run-train" / "job.log", step(20))
    follower.poll()
    _schedule(follower, "shapes-v1-eval", resource="createProcessingJob.sync", state="Evaluate")
    _append(tmp_path / "shapes-v1-eval" / "job.log", step(20))
    follower.poll()
    assert printed == []
    _schedule(follower, "shapes-v1-train")  # a job that fails before its first logged iteration
    _append(tmp_path / "shapes-v1-train" / "job.log", ["[algo-1] Traceback ...", "[algo-1] ConfigError: ..."])
    follower.poll()
    follower("run-1", {"type": "TaskFailed", "taskFailedEventDetails": {
        "resourceType": "sagemaker", "resource": "createTrainingJob.sync", "error": "States.TaskFailed"}})
    follower.finish()
    assert printed == [f"[t]      Train model: training job shapes-v1-train, log {tmp_path}/shapes-v1-train/job.log"]


def test_a_run_that_ends_while_its_job_runs_stops_the_follower(tmp_path: Path) -> None:
    follower, printed, clock = _follower(tmp_path)
    _schedule(follower, "shapes-v1-train")
    log = tmp_path / "shapes-v1-train" / "job.log"
    _log_two_steps(follower, clock, log, later=1.0)
    follower("run-1", {"type": "ExecutionAborted", "executionAbortedEventDetails": {}})
    assert [line.split(":", 1)[1][:12] for line in printed] == [" training jo", " iter 20/250", " iter 40/250"]
    _append(log, step(60))
    follower.poll()
    assert len(printed) == 3


def test_a_follower_that_learns_its_run_late_follows_that_runs_job_and_no_other(tmp_path: Path) -> None:
    follower, printed, clock = _follower(tmp_path, run_id=None)  # the trigger has not answered yet
    other = _schedule(follower, "other-run-train", run="run-2")  # another run live in the same work directory
    _append(tmp_path / "other-run-train" / "job.log", step(20))
    follower.poll()
    assert printed == []  # whose job it is is not known yet: nothing said
    follower.run_id = "run-1"
    _append(tmp_path / "other-run-train" / "job.log", step(40))
    follower.poll()
    follower("run-2", other["succeeded"])  # run-2's events no longer reach it: it must not be following run-2's job
    assert printed == []
    # run-1's job, scheduled before the follower knew run-1 was its run; meanwhile run-2 starts a job and
    # ends, and run-3 fails: none of that is run-1's job's end
    late, printed, clock = _follower(tmp_path, run_id=None)
    _schedule(late, "shapes-v1-train")
    _schedule(late, "other-run-train", run="run-2", state="Train other")
    late("run-2", other["succeeded"])
    late("run-2", {"type": "ExecutionSucceeded", "executionSucceededEventDetails": {}})
    late("run-3", {"type": "ExecutionFailed", "executionFailedEventDetails": {"error": "DatasetRejected"}})
    late.run_id = "run-1"
    log = tmp_path / "shapes-v1-train" / "job.log"
    _log_two_steps(late, clock, log, later=10.0)
    assert printed == [f"[t]      Train model: training job shapes-v1-train, log {log}",
                       "[t]      Train model: iter 20/250 (8%)  loss 0.500  16.0 img/s  ~0:58 left",
                       "[t]      Train model: iter 40/250 (16%)  loss 0.500  16.0 img/s  ~0:53 left"]


def test_a_job_that_ended_before_the_follower_learnt_its_run_is_told_where_it_ended(tmp_path: Path) -> None:
    follower, printed, _ = _follower(tmp_path, run_id=None)
    events = _schedule(follower, "shapes-v1-train")
    log = tmp_path / "shapes-v1-train" / "job.log"
    _append(log, step(20))
    follower("run-1", events["succeeded"])
    assert printed == []
    follower.run_id = "run-1"
    follower.poll()
    _append(log, step(40))
    follower.poll()  # the job ended: no longer following it
    assert printed == [f"[t]      Train model: training job shapes-v1-train, log {log}",
                       "[t]      Train model: iter 20/250 (8%)  loss 0.500  16.0 img/s  ~0:58 left"]


def test_the_log_tail_hands_out_each_line_once_and_starts_over_on_a_new_log(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    tail = _LogTail(log)
    assert tail.read() == []  # not there yet
    _append(log, ["one", "two"], tail="thr")
    assert tail.read() == ["one", "two"]
    _append(log, ["ee"])
    assert tail.read() == ["three"] and tail.read() == []
    replaced = tmp_path / "new.log"  # a job of the same name started again: a new file, longer than the old
    _append(replaced, ["a new job's first line", "its second line", "its third line"])
    replaced.replace(log)
    assert tail.read() == ["a new job's first line", "its second line", "its third line"]
    log.write_text("cut\n")  # truncated in place
    assert tail.read() == ["cut"]
    _append(log, [], tail="no newline at the end")
    assert tail.read(to_end=True) == ["no newline at the end"]
    tail.close()


def test_a_new_log_in_the_old_ones_place_is_read_from_its_start_even_with_the_old_inode_number(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    _append(log, ["the first job's line"])
    tail = _LogTail(log)
    assert tail.read() == ["the first job's line"]
    # A job of the same name started again: its log deleted and written anew, longer than the old one.
    # ext4 (this machine's /tmp) gives the new file the number just freed unless something holds the old one open.
    log.unlink()
    _append(log, ["a new job's first line", "its second line"])
    assert tail.read() == ["a new job's first line", "its second line"]
    tail.close()
