"""A training job's live progress in the status API: its log through its MetricDefinitions into CloudWatch
(the offline SageMaker's publisher, as SageMaker does), read back with GetMetricData (moto) by the status
API's own code, and the pure pieces between (d2ops_core.training_progress: pairing, downsampling)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from d2ops.offline.job_metrics import MetricPublisher, publishable
from d2ops_core import metrics, platform
from d2ops_core.training_progress import MAX_SERIES_POINTS, Progress, downsample, progress_from_series
from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import service  # noqa: E402

JOB = "shapes-v1-abc-train"


def step(iteration: int, total: int = 250, loss: float = 0.5, host: str = "algo-1") -> list[str]:
    """The lines rank 0 prints at one logged iteration, as the local runner writes them to the job's log."""
    values = {"train:loss": loss, "train:lr": 0.02, "train:iter_seconds": 0.25, "train:images_per_second": 16.0}
    return [f"[{host}] {metrics.format_metric_line(n, v, iteration, total)}" for n, v in values.items()]


# ----- downsampling --------------------------------------------------------------------------------
def test_a_short_curve_is_kept_as_it_is_and_a_long_one_is_averaged_to_the_bound() -> None:
    """Catches: a series answered unbounded (a 28-day job's curve in every poll), the newest point lost
    (the curve would stop short of where the job is), runs summed or taken at their first point."""
    short = [(float(i), 1.0 / (i + 1)) for i in range(10)]
    assert downsample(short, 10) == short
    long = [(float(i), float(i % 2)) for i in range(1, 1001)]  # a loss alternating 1, 0
    out = downsample(long, 100)
    assert len(out) == 100
    assert out[-1][0] == 1000.0  # the newest iteration
    assert out[0] == (10.0, 0.5)  # the first run of ten points: at its last iteration, their mean
    assert [x for x, _ in out] == sorted(x for x, _ in out)
    assert all(y == pytest.approx(0.5) for _, y in out)
    assert len(downsample([(float(i), 1.0) for i in range(5000)])) == MAX_SERIES_POINTS
    with pytest.raises(ValueError, match="max_points"):
        downsample(short, 0)


def test_values_that_are_not_numbers_are_left_off_the_curve() -> None:
    """Catches: a NaN or infinite loss drawn (an SVG path with NaN) or averaged into its neighbours."""
    curve = [(1.0, 0.9), (2.0, math.nan), (3.0, math.inf), (4.0, 0.7)]
    assert downsample(curve, 10) == [(1.0, 0.9), (4.0, 0.7)]
    assert downsample([(float(i), math.nan if i % 3 == 0 else 1.0) for i in range(300)], 50)[-1][1] == 1.0


@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(allow_nan=True, allow_infinity=True, width=32)),
                max_size=600), st.integers(1, 300))
def test_downsampling_is_bounded_ordered_and_ends_at_the_newest_point(raw: list[tuple[int, float]],
                                                                      bound: int) -> None:
    points = sorted((float(x), y) for x, y in raw)
    out = downsample(points, bound)
    finite = [p for p in points if math.isfinite(p[1])]
    assert len(out) == min(bound, len(finite))
    assert [x for x, _ in out] == sorted(x for x, _ in out)
    if finite:
        assert out[-1][0] == finite[-1][0]
        low, high = min(y for _, y in finite), max(y for _, y in finite)
        assert all(low - 1e-6 * abs(low) <= y <= high + 1e-6 * abs(high) for _, y in out)


# ----- series -> progress -------------------------------------------------------------------------------
def test_published_series_read_as_progress_and_a_curve_over_iterations() -> None:
    """Catches: a loss paired with the wrong period's iteration, the total or speed read from the oldest
    period, progress claimed before the job published an iteration."""
    series = {"train:iteration": [(60.0, 40.0), (120.0, 90.0), (180.0, 120.0)],
              "train:total_iterations": [(60.0, 250.0), (180.0, 250.0)],
              "train:loss": [(60.0, 1.5), (120.0, 0.9), (180.0, 0.81)],
              "train:lr": [(180.0, 0.02)], "train:iter_seconds": [(60.0, 9.0), (180.0, 0.29)],
              "train:images_per_second": [(180.0, 13.8)]}
    progress, curve = progress_from_series(series)
    assert progress == Progress(120, 250, loss=0.81, images_per_second=13.8, seconds_per_iteration=0.29,
                                learning_rate=0.02)
    assert progress.seconds_left == pytest.approx(130 * 0.29)
    assert curve == [(40.0, 1.5), (90.0, 0.9), (120.0, 0.81)]
    assert progress_from_series({"train:loss": [(60.0, 1.0)]}) == (None, [])
    assert progress_from_series({}) == (None, [])


# ----- log -> CloudWatch (moto) -> the status API ---------------------------------------------------------
@pytest.fixture
def cloudwatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        yield boto3.client("cloudwatch")


def _write(log: Path, text: str) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(text)


def _job(started: datetime, status: str = "InProgress", ended: datetime | None = None) -> dict[str, Any]:
    job = {"TrainingJobName": JOB, "TrainingJobStatus": status, "TrainingStartTime": started}
    return {**job, "TrainingEndTime": ended} if ended else job


def test_a_running_jobs_log_reaches_the_status_api_through_cloudwatch(cloudwatch: Any, tmp_path: Path) -> None:
    """The offline path end to end but for the trainer: lines written as a job writes them (a line in two
    writes, hostile lines between) are published while the job runs and read back by the status API.

    Catches: a publisher that takes half-written lines (a loss of 0.7 read as 0.), other hosts' or
    non-training lines as progress, NaN/huge values sent to CloudWatch (it refuses the whole call),
    a status API querying another namespace/dimension than the one published to, a time left shown
    for an ended job."""
    started = datetime.now(UTC) - timedelta(seconds=5)
    log = tmp_path / "job.log"
    publisher = MetricPublisher(cloudwatch, JOB, log, metrics.METRIC_DEFINITIONS, interval=0.05).start()
    _write(log, "\n".join(["[algo-1] loading 160 images", *step(10, loss=1.25)]) + "\n")
    line = step(20, loss=0.75)[0]
    cut = line.index("=0.75") + 3
    first, rest = line[:cut], line[cut:]
    _write(log, first)  # "...train:loss=0.7": cut in the middle of its number
    time.sleep(0.3)  # the publisher reads the half line at least once
    _write(log, rest + "\n" + "\n".join(step(20, loss=0.75)[1:]) + "\n")
    _write(log, "\n".join([
        "[algo-1] d2ops-metric train:loss=nan iter=30/250",  # no number SageMaker's regex takes
        "[algo-1] d2ops-metric train:loss=1e999",  # a float, but infinite: CloudWatch refuses it
        # a loss (SageMaker's regex takes it) but no iteration (at most 15 digits, then no digit)
        "[algo-1] d2ops-metric train:loss=0.5 iter=" + "9" * 5000,
        "[algo-1] " + metrics.format_metric_line("val:bbox_AP", 0.4, 20)]) + "\n")
    deadline = time.monotonic() + 10
    while publisher.published < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    publisher.stop()

    answer = service.training_progress(cloudwatch, _job(started))
    assert answer is not None
    assert (answer.iteration, answer.total_iterations, answer.period_seconds) == (20, 250, 60)
    # one 60 s period holds every line: its mean loss; time left from the job's own seconds per iteration
    mean = (1.25 + 0.75 + 0.5) / 3
    assert answer.loss == pytest.approx(mean) and answer.learning_rate == pytest.approx(0.02)
    assert answer.seconds_left == pytest.approx(230 * 0.25) and answer.fraction == pytest.approx(0.08)
    assert [(p.iteration, p.loss) for p in answer.loss_series] == [(20, pytest.approx(mean))]
    values = cloudwatch.get_metric_statistics(
        Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricName="train:loss", StartTime=started,
        EndTime=datetime.now(UTC) + timedelta(minutes=1), Period=60, Statistics=["Minimum", "Maximum", "SampleCount"],
        Dimensions=[{"Name": platform.TRAINING_METRICS_DIMENSION, "Value": JOB}])["Datapoints"]
    # no half line (0.7), no NaN or infinite value
    assert [(v["Minimum"], v["Maximum"], v["SampleCount"]) for v in values] == [(0.5, 1.25, 3)]

    ended = service.training_progress(cloudwatch, _job(started, "Completed", datetime.now(UTC)))
    assert ended is not None and ended.iteration == 20 and ended.seconds_left is None
    assert service.training_progress(cloudwatch, {"TrainingJobName": JOB}) is None  # not started yet
    assert service.training_progress(cloudwatch, {**_job(started), "TrainingJobName": "other-job"}) is None


def test_a_long_job_is_read_in_minutes_and_answered_as_a_bounded_curve(cloudwatch: Any) -> None:
    """Catches: a curve answered point for point for a long job, a period CloudWatch would refuse for a
    start this old (no data at all), pages of GetMetricData not followed."""
    started = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=7)
    dims = [{"Name": platform.TRAINING_METRICS_DIMENSION, "Value": JOB}]
    data = []
    for minute in range(7 * 60):
        at = started + timedelta(minutes=minute, seconds=30)
        data += [{"MetricName": "train:iteration", "Value": float(minute * 10), "Timestamp": at, "Dimensions": dims},
                 {"MetricName": "train:total_iterations", "Value": 5000.0, "Timestamp": at, "Dimensions": dims},
                 {"MetricName": "train:loss", "Value": 2.0 / (minute + 1), "Timestamp": at, "Dimensions": dims}]
    for i in range(0, len(data), 1000):
        cloudwatch.put_metric_data(Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricData=data[i:i + 1000])
    answer = service.training_progress(cloudwatch, _job(started))
    assert answer is not None and answer.period_seconds == 60
    assert answer.iteration == 4190 and answer.total_iterations == 5000
    assert len(answer.loss_series) == MAX_SERIES_POINTS
    assert answer.loss_series[-1].iteration == 4190
    losses = [p.loss for p in answer.loss_series]
    assert losses == sorted(losses, reverse=True)  # the falling curve stays a falling curve


def test_values_published_under_the_host_dimension_are_read_too(cloudwatch: Any) -> None:
    """Catches: a status API that finds nothing when SageMaker files the values under Host "<job>/algo-1"
    (the dimension of its documented instance metrics) rather than TrainingJobName, or that mixes another
    host's values in."""
    started = datetime.now(UTC) - timedelta(seconds=30)
    for host, iteration in (("algo-1", 40.0), ("algo-2", 99.0)):
        cloudwatch.put_metric_data(Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricData=[
            {"MetricName": name, "Value": value, "Timestamp": started + timedelta(seconds=10),
             "Dimensions": [{"Name": "Host", "Value": f"{JOB}/{host}"}]}
            for name, value in (("train:iteration", iteration), ("train:total_iterations", 250.0),
                                ("train:loss", 0.6))])
    answer = service.training_progress(cloudwatch, _job(started))
    assert answer is not None and (answer.iteration, answer.total_iterations) == (40, 250)


def test_an_unreadable_cloudwatch_leaves_progress_out_not_the_run(cloudwatch: Any, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Catches: a CloudWatch error (AccessDenied: a stack without the new permission) failing GET /runs/{id}."""
    from botocore.exceptions import ClientError

    def refuse(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed"}}, "GetMetricData")

    monkeypatch.setattr(cloudwatch, "get_metric_data", refuse)
    assert service.training_progress(cloudwatch, _job(datetime.now(UTC))) is None


def test_metric_periods_follow_cloudwatchs_retention() -> None:
    """Catches: a period that returns no data points for an old start (CloudWatch's rule)."""
    assert platform.metric_period(0) == 60
    assert platform.metric_period(14 * 86400) == 60
    assert platform.metric_period(20 * 86400) == 300
    assert platform.metric_period(100 * 86400) == 3600


def test_only_what_cloudwatch_accepts_is_published() -> None:
    assert publishable(0.0) and publishable(-3.5) and publishable(2.0 ** 360)
    assert not publishable(math.nan) and not publishable(math.inf) and not publishable(2.0 ** 361)


# ----- d2ops status ------------------------------------------------------------------------------------------
def test_d2ops_status_prints_the_latest_progress_line_as_the_demo_does() -> None:
    """Catches: `d2ops status` dropping the API's progress, a line in another format than the one
    `d2ops demo`/`d2ops run` print (d2ops_core.training_progress.format_progress), a time left shown
    for an ended job (the API leaves seconds_left out then)."""
    from d2ops.commands.status import format_run

    progress = {"iteration": 120, "total_iterations": 250, "fraction": 0.48, "loss": 0.8121, "learning_rate": 0.02,
                "images_per_second": 13.8, "seconds_per_iteration": 0.29, "seconds_left": 37.7,
                "updated_at": "2026-11-26T23:20:00+00:00", "period_seconds": 60, "loss_series": []}
    run = {"run_id": "r", "status": "RUNNING", "current_state": "Train model", "timeline": [],
           "training": {"job_name": "r-train", "status": "InProgress", "metrics": {}, "progress": progress}}
    lines = format_run(run)
    assert "    progress: iter 120/250 (48%)  loss 0.812  13.8 img/s  ~0:38 left  lr 0.02  " \
           "(as of 2026-11-26T23:20:00+00:00)" in lines
    ended = format_run({**run, "training": {**run["training"], "progress": {**progress, "seconds_left": None}}})
    assert not any("left" in line for line in ended)
    assert not any("progress:" in line for line in format_run({**run, "training": {"job_name": "r-train"}}))
