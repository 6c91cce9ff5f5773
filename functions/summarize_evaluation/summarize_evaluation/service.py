"""Read evaluation.json and pick the primary metric by name for the quality gate."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from d2ops_core.documents.evaluation import EvaluationReport, ModelScores
from d2ops_core.runs import key_listed, parse_s3_uri
from summarize_evaluation.models import ClassRegression, EvaluationSummary, SummarizeEvent

MAX_REPORT_BYTES = 10 * 1024 * 1024
# The floor is compared with numbers read from JSON; rounding keeps 0.5 - 0.01 at 0.49.
FLOOR_DIGITS = 9
# The summary travels in the state payload: the worst classes are listed, all are counted.
MAX_LISTED_REGRESSIONS = 10


class EvaluationReportNotFound(Exception):
    """The evaluation job finished but its report is not where the plan says."""


class EvaluationReportInvalid(Exception):
    """The report is malformed or lacks the primary metric."""


def read_report(s3: Any, uri: str) -> EvaluationReport:
    bucket, key = parse_s3_uri(uri)
    # Listed first (d2ops_core.runs.key_listed): a GET of a missing report may answer 403 here.
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


def _class_ap(scores: ModelScores, name: str, metric: str, who: str) -> float | None:
    value = scores.per_class.get(name, {}).get(metric)
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise EvaluationReportInvalid(f"{who} per_class[{name!r}].{metric} = {value} is not a fraction in [0, 1]")
    return value


def class_regressions(report: EvaluationReport, metric: str, max_class_regression: float,
                      min_class_instances: int) -> list[ClassRegression]:
    """Classes the challenger does worse on than the champion by more than the margin, worst first.

    Only classes with at least ``min_class_instances`` val instances are judged: the AP of a
    class seen three times swings by chance. A class the champion has an AP for and the
    challenger has none (it predicts nothing of it) counts as AP 0. Pure: no I/O.
    """
    if report.champion is None:
        return []
    found = []
    for name, instances in report.class_instances.items():
        if instances < min_class_instances:
            continue
        champion = _class_ap(report.champion, name, metric, "champion")
        if champion is None:  # no AP for the champion either: nothing to compare with
            continue
        challenger = _class_ap(report.challenger, name, metric, "challenger") or 0.0
        drop = round(champion - challenger, FLOOR_DIGITS)  # 0.5 - 0.45 stays 0.05, as the margin reads
        if drop > max_class_regression:
            found.append(ClassRegression(class_name=name, metric=metric, challenger_ap=challenger,
                                         champion_ap=champion, drop=drop, instances=instances))
    return sorted(found, key=lambda r: (-r.drop, r.class_name))


def class_gate_reason(regressions: list[ClassRegression], max_class_regression: float) -> str:
    """One line naming the regressed classes with both APs and their instance counts ('' when none)."""
    if not regressions:
        return ""
    listed = regressions[:MAX_LISTED_REGRESSIONS]
    parts = [f"{r.class_name} {r.challenger_ap:.3f} vs {r.champion_ap:.3f} ({r.instances} instances)" for r in listed]
    more = f" and {len(regressions) - len(listed)} more" if len(regressions) > len(listed) else ""
    return (f"challenger {listed[0].metric} trails the champion by more than {max_class_regression:g} on "
            f"{len(regressions)} class{'es' if len(regressions) > 1 else ''} (challenger vs champion): "
            f"{', '.join(parts)}{more}")


def summarize(report: EvaluationReport, event: SummarizeEvent) -> EvaluationSummary:
    # The plan names the metric from the manifest's task, so a report that calls bbox_AP
    # primary cannot let a segmentation model through on its box AP.
    gate = event.gate
    metric = gate.primary_metric or report.primary_metric
    challenger = primary_value(report.challenger, metric, "challenger")
    champion = primary_value(report.champion, metric, "champion") if report.champion is not None else None
    floor = round(max(0.0, champion - gate.max_regression), FLOOR_DIGITS) if champion is not None else 0.0
    regressions = []
    if gate.max_class_regression is not None and gate.min_class_instances is not None:
        regressions = class_regressions(report, metric, gate.max_class_regression, gate.min_class_instances)
    return EvaluationSummary(
        report_uri=event.report_uri, primary_metric=metric, challenger_value=challenger,
        challenger_metrics={k: v for k, v in report.challenger.metrics.items() if math.isfinite(v)},
        has_champion=champion is not None, champion_value=champion, champion_floor=floor,
        min_map=gate.min_map, max_regression=gate.max_regression,
        max_class_regression=gate.max_class_regression, min_class_instances=gate.min_class_instances,
        class_regressed=bool(regressions), class_regression_count=len(regressions),
        class_regressions=regressions[:MAX_LISTED_REGRESSIONS],
        class_gate_reason=class_gate_reason(regressions, gate.max_class_regression or 0.0))
