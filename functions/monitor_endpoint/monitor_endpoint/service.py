"""One window of the endpoint's capture -> its MonitoringWindow, metrics and (when drifted) one message.

The steps, each a function below: which window; which model served it (the endpoint history, else the
champion) and its baseline; the window's features from the capture reader; the statistics
(``statistics.judge``); the document, written once (a conditional PUT: the same window asked twice
answers the first document and sends nothing again); the metrics; the SNS message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from d2ops_core import images as rule
from d2ops_core import s3_layout
from d2ops_core.capture_files import SkippedLine, read_capture_window
from d2ops_core.champion import read_champion, read_endpoint_history
from d2ops_core.documents.capture import CaptureError, CaptureRecord
from d2ops_core.documents.detections import InvocationResponse
from d2ops_core.documents.monitoring import MonitoringBaseline, MonitoringWindow, StatisticVerdict
from d2ops_core.monitoring_baseline import BaselineError, read_monitoring_baseline
from d2ops_core.monitoring_features import FeatureSample, ImageFeatures, answer_features
from d2ops_core.s3_probe import key_listed
from monitor_endpoint.models import MonitorEvent, MonitorResult
from monitor_endpoint.statistics import Thresholds, judge

NAMESPACE = "d2ops/Monitoring"
DRIFTED_METRIC = "Drifted"
RECORDS_METRIC = "Records"
MAX_PROBLEMS = 20
# Capture reaches S3 minutes after the requests (SageMaker buffers it): the default window is the last
# full one that ended at least this long ago.
SETTLE = timedelta(minutes=15)
_METRICS_PER_CALL = 500
_METRIC_NAME_LIMIT = 255  # CloudWatch's; a class name may be longer


@dataclass(frozen=True)
class Settings:
    bucket: str
    endpoint: str
    topic_arn: str | None
    thresholds: Thresholds
    window_minutes: int = 60


class WindowNotBegun(Exception):
    """The asked window starts after now: there is no traffic of it to judge yet."""


def window_of(event: MonitorEvent, settings: Settings, now: datetime) -> tuple[datetime, datetime]:
    """``[start, end)``: the event's window, else the last full one (windows are aligned to the epoch, so an
    hourly window is a clock hour) that ended at least :data:`SETTLE` before ``now``.

    An asked window that has not begun is refused: its verdict is written once, so a future window judged now
    (``too_few_records``) would keep that verdict when its traffic came. One asked before it settled is the
    caller's choice (``d2ops demo --loop`` asks for the window it just sent, its capture already flushed).
    """
    length = timedelta(minutes=event.window_minutes or settings.window_minutes)
    if event.window_start is not None:
        start = event.window_start if event.window_start.tzinfo else event.window_start.replace(tzinfo=UTC)
        start = start.astimezone(UTC)
        if start > now:  # compared before adding the length: a start near datetime.max cannot overflow
            raise WindowNotBegun(f"the window {window_iso(start)} has not begun (now {window_iso(now)}): there is "
                                 "no capture of it to judge yet")
        return start, start + length
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + ((now - SETTLE) - epoch) // length * length
    return end - length, end


def window_iso(start: datetime) -> str:
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def serving_run(s3: Any, bucket: str, endpoint: str, start: datetime, end: datetime) -> str | None:
    """The run whose model served most of ``[start, end)`` by the endpoint's history; without a history,
    the champion's; None before any deployment."""
    history = read_endpoint_history(s3, bucket, endpoint)
    best: tuple[timedelta, str] | None = None
    for period in history.served if history else []:
        served_from = _moment(period.served_from)
        served_to = _moment(period.served_to) if period.served_to else end
        overlap = min(end, served_to) - max(start, served_from)
        if overlap > timedelta(0) and (best is None or overlap > best[0]):
            best = (overlap, period.run_id)
    if best is not None:
        return best[1]
    champion = read_champion(s3, bucket)
    return champion.run_id if champion and champion.endpoint_name == endpoint else None


def _moment(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def record_features(record: CaptureRecord, thresholds: dict[str, float], where: str) -> ImageFeatures:
    """A captured invocation's features; ``ValueError`` (naming ``where``) when a side is missing or unreadable."""
    data = record.captureData
    if data.endpointInput is None or data.endpointOutput is None:
        raise ValueError(f"{where}: captured without its {'input' if data.endpointInput is None else 'output'}")
    try:
        answer = InvocationResponse.model_validate_json(data.endpointOutput.raw())
    except ValidationError as exc:
        raise ValueError(f"{where}: the captured answer is not the endpoint's JSON "
                         f"({exc.errors(include_url=False)[0]['msg']})") from None
    try:
        return answer_features(data.endpointInput.raw(), answer, thresholds, where)
    except (CaptureError, rule.ImageRejected) as exc:
        raise ValueError(f"{where}: {exc}") from None


def window_features(records: Iterator[CaptureRecord], baseline: MonitoringBaseline | None,
                    problems: list[str]) -> tuple[FeatureSample, int]:
    """The window's feature sample and how many records were read; each unreadable record's problem appended."""
    sample = FeatureSample(list(baseline.class_names) if baseline else [])
    thresholds = dict(baseline.score_thresholds) if baseline else {}
    count = 0
    for record in records:
        count += 1
        try:
            sample.add(record_features(record, thresholds, f"event {record.eventMetadata.eventId}"))
        except ValueError as exc:
            problems.append(str(exc))
    return sample, count


def monitor(event: MonitorEvent, settings: Settings, s3: Any, cloudwatch: Any, sns: Any,
            now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> MonitorResult:
    start, end = window_of(event, settings, now())
    key = s3_layout.monitoring_window_key(settings.endpoint, window_iso(start))
    uri = s3_layout.s3_uri(settings.bucket, key)
    if key_listed(s3, settings.bucket, key):
        return _result(_read_window(s3, settings.bucket, key), uri, already=True, notified=False)
    run_id = serving_run(s3, settings.bucket, settings.endpoint, start, end)
    baseline_problems: list[str] = []
    try:
        baseline = read_monitoring_baseline(s3, settings.bucket, run_id) if run_id else None
    except BaselineError as exc:  # the window says which object, judged no_baseline: not a failure every hour
        baseline, baseline_problems = None, [str(exc)]
    skipped: list[SkippedLine] = []
    problems: list[str] = []
    sample, records = window_features(read_capture_window(s3, settings.bucket, settings.endpoint, start, end,
                                                          skipped=skipped), baseline, problems)
    problems = baseline_problems + [str(line) for line in skipped] + problems
    verdict, statistics = judge(baseline, sample, settings.thresholds)
    window = MonitoringWindow(endpoint=settings.endpoint, model_run_id=run_id, window_start=start, window_end=end,
                              records=records, unreadable=len(problems), problems=problems[:MAX_PROBLEMS],
                              verdict=verdict, statistics=statistics, computed_at=now())
    if not _write_once(s3, settings.bucket, key, window.model_dump_json(indent=1).encode()):
        # Another invocation wrote the window first: it publishes, this one answers its document.
        return _result(_read_window(s3, settings.bucket, key), uri, already=True, notified=False)
    put_metrics(cloudwatch, window)
    notified = False
    if window.verdict == "drifted" and settings.topic_arn:
        sns.publish(TopicArn=settings.topic_arn, Subject=subject(window), Message=message(window, uri))
        notified = True
    return _result(window, uri, already=False, notified=notified)


def _read_window(s3: Any, bucket: str, key: str) -> MonitoringWindow:
    return MonitoringWindow.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _write_once(s3: Any, bucket: str, key: str, body: bytes) -> bool:
    """PUT only if absent (S3 conditional write); False when the key exists already."""
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


def _result(window: MonitoringWindow, uri: str, *, already: bool, notified: bool) -> MonitorResult:
    return MonitorResult(endpoint=window.endpoint, window_start=window.window_start, verdict=window.verdict,
                         records=window.records, drifted=[s.statistic for s in window.drifted_statistics],
                         window_uri=uri, already_computed=already, notified=notified)


def metric_data(window: MonitoringWindow) -> list[dict[str, Any]]:
    """One datum per statistic (its test's value), ``Drifted`` (1/0, only for a compared window) and ``Records``,
    each with the Endpoint dimension. Timestamped now, not at the window's start: an alarm evaluates the latest
    period, and a window is judged after it settled (the window itself is in its document)."""
    dimensions = [{"Name": "Endpoint", "Value": window.endpoint}]
    data: list[dict[str, Any]] = [{"MetricName": RECORDS_METRIC, "Value": float(window.records), "Unit": "Count"}]
    if window.verdict in ("ok", "drifted"):
        data.append({"MetricName": DRIFTED_METRIC, "Value": 1.0 if window.verdict == "drifted" else 0.0,
                     "Unit": "None"})
        data.extend({"MetricName": s.statistic[:_METRIC_NAME_LIMIT], "Value": s.value, "Unit": "None"}
                    for s in window.statistics)
    return [{**d, "Dimensions": dimensions} for d in data]


def put_metrics(cloudwatch: Any, window: MonitoringWindow) -> None:
    data = metric_data(window)
    for i in range(0, len(data), _METRICS_PER_CALL):
        cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=data[i:i + _METRICS_PER_CALL])


def subject(window: MonitoringWindow) -> str:
    moved = len(window.drifted_statistics)
    text = f"d2ops: {window.endpoint} drifted ({moved} statistics, {window_iso(window.window_start)})"
    return text if len(text) <= 100 else text[:99] + "…"  # SNS's subject limit


def describe(statistic: StatisticVerdict) -> str:
    """``brightness: KS D 0.91 > 0.2 (p 3e-29); mean 0.50 -> 0.25``."""
    name = "KS D" if statistic.test == "ks" else "PSI"
    line = f"{statistic.statistic}: {name} {statistic.value:.3g} > {statistic.threshold:g}"
    if statistic.p_value is not None:
        line += f" (p {statistic.p_value:.2g})"
    if statistic.baseline is not None and statistic.window is not None:
        line += f"; mean {statistic.baseline:.3g} -> {statistic.window:.3g}"
    return line


def message(window: MonitoringWindow, uri: str) -> str:
    moved = window.drifted_statistics
    return "\n".join([
        f"The endpoint {window.endpoint} drifted from its baseline (model of run {window.model_run_id}) in "
        f"{window_iso(window.window_start)} .. {window_iso(window.window_end)} ({window.records} captured "
        f"requests): {len(moved)} of {len(window.statistics)} statistics moved.",
        "", *(f"- {describe(s)}" for s in moved), "",
        f"The window: {uri} (docs/monitoring.md says what each statistic means)."])
