"""Read evaluation.json and pick the primary metric by name for the quality gate."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from d2ops.runs import key_listed, parse_s3_uri
from summarize_evaluation.models import EvaluationReport, EvaluationSummary, ModelScores, SummarizeEvent

MAX_REPORT_BYTES = 10 * 1024 * 1024
# The floor is compared with numbers read from JSON; rounding keeps 0.5 - 0.01 at 0.49.
FLOOR_DIGITS = 9


class EvaluationReportNotFound(Exception):
    """The evaluation job finished but its report is not where the plan says."""


class EvaluationReportInvalid(Exception):
    """The report is malformed or lacks the primary metric."""


def read_report(s3: Any, uri: str) -> EvaluationReport:
    bucket, key = parse_s3_uri(uri)
    # Listed first (d2ops.runs.key_listed): a GET of a missing report may answer 403 here.
    if not key_listed(s3, bucket, key):
        raise EvaluationReportNotFound(f"{uri} does not exist")
    try:
        obj = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey as exc:
        raise EvaluationReportNotFound(f"{uri} does not exist") from exc
    if obj["ContentLength"] > MAX_REPORT_BYTES:
        raise EvaluationReportInvalid(f"{uri} is {obj['ContentLength']} bytes, more than {MAX_REPORT_BYTES}")
    try:
        return EvaluationReport.model_validate_json(obj["Body"].read())
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise EvaluationReportInvalid(f"{uri}: {where}: {first['msg']}") from exc


def primary_value(scores: ModelScores, metric: str, who: str) -> float:
    if metric not in scores.metrics:
        raise EvaluationReportInvalid(f"{who} has no {metric!r} (metrics: {sorted(scores.metrics)})")
    value = scores.metrics[metric]
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise EvaluationReportInvalid(f"{who} {metric} = {value} is not a fraction in [0, 1]")
    return value


def summarize(report: EvaluationReport, event: SummarizeEvent) -> EvaluationSummary:
    # The plan names the metric from the manifest's task, so a report that calls bbox_AP
    # primary cannot let a segmentation model through on its box AP.
    metric = event.gate.primary_metric or report.primary_metric
    challenger = primary_value(report.challenger, metric, "challenger")
    champion = primary_value(report.champion, metric, "champion") if report.champion is not None else None
    floor = round(max(0.0, champion - event.gate.max_regression), FLOOR_DIGITS) if champion is not None else 0.0
    return EvaluationSummary(
        report_uri=event.report_uri, primary_metric=metric, challenger_value=challenger,
        challenger_metrics={k: v for k, v in report.challenger.metrics.items() if math.isfinite(v)},
        has_champion=champion is not None, champion_value=champion, champion_floor=floor,
        min_map=event.gate.min_map, max_regression=event.gate.max_regression)
