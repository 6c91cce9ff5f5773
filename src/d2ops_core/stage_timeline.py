"""A run's steps read the way people read a run: by stage, loops as one line, expected misses as misses.

The status API's timeline (``GET /runs/{runId}``: one step per state visit, each with its status,
times and error) is exact and long: a deployment polls "Wait for endpoint ... Count endpoint check"
ten times, and the first run's endpoint lookup ends with the error the definition catches to create
the endpoint. ``summarise`` turns those steps into ``StageRun``s of ``Line``s (d2ops_core.pipeline_stages
says which stage, which loop, which miss); ``human_duration`` writes seconds as people say them.
``d2ops status``, ``d2ops graph`` and the console's state graph (through the status API) read the same.

Standard library only: the status API reads it through the CoreLayer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from d2ops_core.pipeline_stages import FAILURE_RECORDS, FRAMES, STAGES, Stage, expected_miss, loop_of, stage_of

# succeeded; missed: an error that was the expected outcome (d2ops_core.pipeline_stages.EXPECTED_MISSES);
# caught: an error the run routed on (its failure path, a retry); failed: the error the run ended on
LineStatus = Literal["succeeded", "missed", "caught", "failed", "running"]
StageStatus = Literal["succeeded", "caught", "failed", "running", "not reached"]

OTHER = Stage("other", "Other states", ())  # a state of another definition's version: shown, never lost


@dataclass
class Step:
    """One visit of one state (the status API's StateStep)."""

    name: str
    status: str  # running | succeeded | failed
    entered_at: str | None = None
    exited_at: str | None = None
    duration_seconds: float | None = None
    error: str | None = None


@dataclass
class Line:
    """One line of the timeline: one state's visit, a repeated state's visits, or a loop's rounds."""

    title: str
    status: LineStatus
    states: list[str]
    rounds: int = 1  # the loop's Wait visits, or the repeated state's visits
    seconds: float | None = None
    error: str | None = None
    note: str | None = None  # what an expected miss meant
    loop: bool = False


@dataclass
class StageRun:
    stage: Stage
    status: StageStatus
    seconds: float | None
    lines: list[Line] = field(default_factory=list)


def human_duration(seconds: float | None) -> str:
    """Seconds as people say them: '0.4s', '12s', '9m 40s', '2h 05m' ('-' when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 0.05:
        return "0s"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def _span(steps: Sequence[Step]) -> float | None:
    """From the first step's entry to the last step's exit; the known durations summed when a time is missing."""
    start, end = _when(steps[0].entered_at), _when(steps[-1].exited_at)
    if start is not None and end is not None:
        return round((end - start).total_seconds(), 3)
    known = [s.duration_seconds for s in steps if s.duration_seconds is not None]
    return round(sum(known), 3) if known else None


def as_steps(steps: Iterable[Step | Mapping[str, Any] | Any]) -> list[Step]:
    """Steps from the status API's JSON (dicts), its pydantic StateSteps, or Steps."""
    found = []
    for step in steps:
        if isinstance(step, Step):
            found.append(step)
            continue
        data = step if isinstance(step, Mapping) else step.model_dump()
        found.append(Step(name=data["name"], status=data["status"], entered_at=data.get("entered_at"),
                          exited_at=data.get("exited_at"), duration_seconds=data.get("duration_seconds"),
                          error=data.get("error")))
    return found


def steps_from_history(events: Sequence[Mapping[str, Any]], execution_status: str) -> list[Step]:
    """The status API's per-visit steps from a GetExecutionHistory event list (``d2ops graph`` has the history,
    not the API's answer): a visit is failed when an error event came while it was open."""
    steps: list[Step] = []
    open_steps: dict[str, Step] = {}
    last_open: Step | None = None
    for event in events:
        kind: str = event["type"]
        when = event["timestamp"]
        if kind.endswith("StateEntered"):
            step = Step(name=event["stateEnteredEventDetails"]["name"], status="running",
                        entered_at=when.isoformat())
            steps.append(step)
            open_steps[step.name] = step
            last_open = step
        elif kind.endswith("StateExited"):
            done = open_steps.pop(event["stateExitedEventDetails"]["name"], None)
            if done is not None:
                done.exited_at = when.isoformat()
                entered = _when(done.entered_at)
                done.duration_seconds = round((when - entered).total_seconds(), 3) if entered else None
                done.status = "failed" if done.error else "succeeded"
        else:
            error = next((str(d["error"]) for k, d in event.items()
                          if k.endswith("EventDetails") and isinstance(d, Mapping) and d.get("error")), None)
            if error and last_open is not None:
                last_open.error = error
    if execution_status != "RUNNING":
        for step in open_steps.values():
            step.status = "failed"
    return steps


def _stage(name: str) -> Stage:
    try:
        return stage_of(name)
    except KeyError:
        return OTHER


def _visit_status(index: int, steps: Sequence[Step]) -> tuple[LineStatus, str | None]:
    step = steps[index]
    if step.status == "running":
        return "running", None
    if step.status != "failed":
        return "succeeded", None
    if step.exited_at is None:  # the run ended here
        return "failed", None
    miss = expected_miss(step.name, step.error, (s.name for s in steps[index + 1:]))
    if miss:
        return "missed", miss.meaning
    # caught, and routed straight to the failure's record (or the failure path): this is where the run failed
    # (the Fail state at the end only names it)
    routed = steps[index + 1].name if index + 1 < len(steps) else None
    failed = routed is not None and (routed in FAILURE_RECORDS or _stage(routed).key == "failure")
    return ("failed" if failed else "caught"), None


_WORST: tuple[LineStatus, ...] = ("failed", "running", "caught", "missed", "succeeded")


def _worst(statuses: Iterable[LineStatus]) -> LineStatus:
    present = set(statuses)
    return next(s for s in _WORST if s in present)


def lines_of(steps: Sequence[Step]) -> list[Line]:
    """The steps as lines: a loop's consecutive visits (with at least one round) as one, a state visited
    several times in a row (a Map's item task) as one, every other visit as itself."""
    return [line for line, _ in _grouped(steps)]


def _grouped(steps: Sequence[Step]) -> list[tuple[Line, Sequence[Step]]]:
    statuses = [_visit_status(i, steps) for i in range(len(steps))]
    lines: list[tuple[Line, Sequence[Step]]] = []
    i = 0
    while i < len(steps):
        loop = loop_of(steps[i].name)
        j = i + 1
        if loop is not None:
            while j < len(steps) and steps[j].name in loop.states:
                j += 1
            rounds = sum(s.name == loop.head for s in steps[i:j])
            if rounds == 0:
                j = i + 1
        if loop is None or j == i + 1:
            while j < len(steps) and steps[j].name == steps[i].name:
                j += 1
            loop, rounds = None, j - i
        group = steps[i:j]
        status = _worst(s for s, _ in statuses[i:j])
        errors = [s.error for s, (st, _) in zip(group, statuses[i:j], strict=True) if s.error and st != "missed"]
        notes = [note for _, note in statuses[i:j] if note]
        names = list(dict.fromkeys(s.name for s in group))
        lines.append((Line(title=loop.title if loop else steps[i].name, status=status, states=names,
                           rounds=rounds, seconds=_span(group), error=errors[-1] if errors else None,
                           note=notes[-1] if notes else None, loop=loop is not None), group))
        i = j
    return lines


def summarise(steps: Iterable[Step | Mapping[str, Any] | Any]) -> list[StageRun]:
    """The run's steps grouped into the stages it went through, in order (a stage the run came back to,
    like the failure path's notification, is one group per stay)."""
    runs: list[StageRun] = []
    spans: list[list[Step]] = []
    for line, visits in _grouped([s for s in as_steps(steps) if s.name not in FRAMES]):
        stage = _stage(line.states[0])
        if not runs or runs[-1].stage is not stage:
            runs.append(StageRun(stage=stage, status="succeeded", seconds=None))
            spans.append([])
        runs[-1].lines.append(line)
        spans[-1] += visits
    for i, (run, visits) in enumerate(zip(runs, spans, strict=True)):
        run.seconds = _span(visits)
        worst = _worst(line.status for line in run.lines)
        run.status = "succeeded" if worst == "missed" else worst
        if i + 1 < len(runs) and runs[i + 1].stage.key == "failure" and run.stage.key != "failure":
            run.status = "failed"  # the run left this stage for its failure path: it failed here
    return runs


def line_title(line: Line) -> str:
    """'Wait for endpoint \u00d710' for a loop or a repeated state, the state's name otherwise."""
    return f"{line.title} \u00d7{line.rounds}" if line.loop or line.rounds > 1 else line.title


def stage_statuses(runs: Sequence[StageRun]) -> dict[str, StageStatus]:
    """Each stage of STAGES (and OTHER when used) with the run's outcome in it: the worst of its stays."""
    found: dict[str, StageStatus] = {s.key: "not reached" for s in STAGES}
    order: tuple[StageStatus, ...] = ("failed", "running", "caught", "succeeded")
    for run in runs:
        now = found.get(run.stage.key, "not reached")
        found[run.stage.key] = run.status if now == "not reached" else min(now, run.status, key=order.index)
    return found
