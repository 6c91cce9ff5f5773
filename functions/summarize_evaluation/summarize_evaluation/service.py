"""Read evaluation.json and pick the primary metric by name for the quality gate."""

from __future__ import annotations

import bisect
import itertools
import math
import unicodedata
from typing import Any, Literal

from pydantic import ValidationError

from d2ops_core import gate as gate_rule
from d2ops_core import platform
from d2ops_core.documents.evaluation import Comparison, DifferenceInterval, EvaluationReport, ModelScores
from d2ops_core.gate import ap_text, limit_text
from d2ops_core.s3_layout import parse_s3_uri
from d2ops_core.s3_probe import key_listed
from d2ops_core.score_thresholds import registry_value
from summarize_evaluation.models import ClassRegression, EvaluationSummary, Refusal, SummarizeEvent

MAX_REPORT_BYTES = 10 * 1024 * 1024
# The floor is compared with numbers read from JSON; rounding keeps 0.5 - 0.01 at 0.49.
FLOOR_DIGITS = 9
# The comparison's point estimates are the report's own APs, recomputed by the bootstrap's scorer.
POINT_TOLERANCE = 1e-6
# The summary travels in the state payload: the worst classes are listed, all are counted.
MAX_LISTED_REGRESSIONS = 10
# The Model Registry description is "<dataset name> <version>: <gate reason>" (the ASL's "Register model
# version"). The name and version come from the dataset's S3 key (any characters but '/', up to S3's
# 1,024-byte keys), the class names from its annotations: neither is bounded, so both shares are
# bounded here. The numeric gate reasons (a metric name and four numbers) fit in what is left.
DESCRIPTION_HEAD_MAX = 200  # "<name> <version>: "
CLASS_GATE_DESCRIPTION_MAX = platform.MODEL_PACKAGE_DESCRIPTION_MAX - DESCRIPTION_HEAD_MAX
# Control characters that separate words become spaces; anything else outside the allowed categories
# becomes U+FFFD (a symbol, so allowed), keeping the count of characters and where one was.
_SPACES = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x1f\x85")


Decision = Literal["approved", "rejected"]


class EvaluationReportNotFound(Exception):
    """The evaluation job finished but its report is not where the plan says."""


class EvaluationReportInvalid(Exception):
    """The report is malformed or lacks the primary metric."""


def read_report(s3: Any, uri: str) -> EvaluationReport:
    bucket, key = parse_s3_uri(uri)
    # Listed first (d2ops_core.s3_probe.key_listed): a GET of a missing report may answer 403 here.
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


def _fraction(value: float, what: str) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise EvaluationReportInvalid(f"{what} = {value} is not a fraction in [0, 1]")
    return value


def beyond(interval: DifferenceInterval, tolerance: float) -> bool:
    """Whether the drop beyond ``tolerance`` is significant (d2ops_core.gate.regression_beyond: the
    interval's upper end below -tolerance; a challenger is refused only when even its best case is)."""
    return gate_rule.regression_beyond(interval.high, tolerance)


def more_val_images(interval: DifferenceInterval, val_images: int, tolerance: float) -> int | None:
    """About how many more val images would narrow the interval to the tolerance, where that could change
    the decision (d2ops_core.gate)."""
    return gate_rule.more_val_images(interval.low, interval.high, val_images, tolerance)


def interval_text(interval: DifferenceInterval) -> str:
    return gate_rule.interval_text(interval.difference, interval.low, interval.high, interval.confidence)


def check_comparison(report: EvaluationReport, metric: str, challenger: float, champion: float) -> Comparison:
    """The report's comparison, refused when it is not of the metric the gate judges or not of these scores."""
    comparison = report.comparison
    if comparison is None:  # the report's own validator requires it with a champion; kept for the type checker
        raise EvaluationReportInvalid("the report has a champion but no comparison")
    if comparison.metric != metric:
        raise EvaluationReportInvalid(f"comparison is of {comparison.metric}, the gate judges {metric}")
    overall = comparison.overall
    for who, point, value in (("challenger", overall.challenger, challenger), ("champion", overall.champion, champion)):
        if abs(_fraction(point, f"comparison.overall.{who}") - value) > POINT_TOLERANCE:
            raise EvaluationReportInvalid(f"comparison.overall.{who} {point} is not the {who}'s {metric} {value}")
    return comparison


def class_regressions(report: EvaluationReport, metric: str, max_class_regression: float,
                      min_class_instances: int) -> list[ClassRegression]:
    """Classes on which the challenger trails the champion significantly by more than the margin, worst first.

    Only classes with at least ``min_class_instances`` val instances are judged (the job's
    comparison has their Bonferroni-adjusted intervals; a judged class missing from it is an
    invalid report, never a class waved through). Pure: no I/O.
    """
    if report.champion is None or report.comparison is None:
        return []
    found = []
    for name, instances in report.class_instances.items():
        if instances < min_class_instances:
            continue
        interval = report.comparison.per_class.get(name)
        if interval is None:
            raise EvaluationReportInvalid(f"comparison.per_class lacks {name!r} ({instances} val instances; classes "
                                          f"with at least {min_class_instances} are judged)")
        challenger = _fraction(interval.challenger, f"comparison.per_class[{name!r}].challenger")
        champion = _fraction(interval.champion, f"comparison.per_class[{name!r}].champion")
        if beyond(interval, max_class_regression):
            found.append(ClassRegression(class_name=name, metric=metric, challenger_ap=challenger,
                                         champion_ap=champion, drop=round(champion - challenger, FLOOR_DIGITS),
                                         instances=instances, interval=interval))
    return sorted(found, key=lambda r: (-r.drop, r.class_name))


def class_gate_reason(regressions: list[ClassRegression], max_class_regression: float) -> str:
    """One line naming the regressed classes with both APs, the interval and the instance counts ('' when none)."""
    if not regressions:
        return ""
    listed = regressions[:MAX_LISTED_REGRESSIONS]
    parts = [f"{r.class_name} {ap_text(r.challenger_ap)} vs {ap_text(r.champion_ap)}, {interval_text(r.interval)} "
             f"({r.instances} instances)" for r in listed]
    more = f" and {len(regressions) - len(listed)} more" if len(regressions) > len(listed) else ""
    return (f"challenger {listed[0].metric} trails the champion by more than {limit_text(max_class_regression)} "
            f"on {len(regressions)} class{'es' if len(regressions) > 1 else ''} (challenger vs champion): "
            f"{'; '.join(parts)}{more}")


def registry_text(text: str) -> str:
    """``text`` with every character SageMaker's description pattern refuses replaced (platform table)."""
    allowed = platform.MODEL_PACKAGE_DESCRIPTION_CATEGORIES
    return "".join(c if unicodedata.category(c)[0] in allowed else " " if c in _SPACES else "\ufffd" for c in text)


def _units(text: str) -> int:
    """Length in UTF-16 code units: what a Java service counts; never fewer than Python's characters."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (and UTF-16 units), ending with an ellipsis and how
    many characters were left out, so a reader knows it was cut and by how much."""
    if _units(text) <= limit:
        return text
    ends = list(itertools.accumulate(_units(c) for c in text))  # ends[i]: units of text[:i + 1]
    keep = bisect.bisect_right(ends, limit)  # the most characters that fit without a suffix
    while True:  # the suffix's length depends on the count it names: give back characters until it fits
        suffix = f"\u2026 ({len(text) - keep} more characters)"
        if (ends[keep - 1] if keep else 0) + _units(suffix) <= limit or keep == 0:
            return text[:keep] + suffix
        keep -= 1


def description_head(name: str, version: str) -> str:
    """``"<name> <version>: "``, cleaned and bounded to DESCRIPTION_HEAD_MAX characters."""
    return bounded(registry_text(f"{name} {version}"), DESCRIPTION_HEAD_MAX - 2) + ": "


# The gate's refusals, in the order they are judged (the first that holds is the decision).
REFUSALS: tuple[Refusal, ...] = ("below_min_map", "regressed", "class_regressed")


def first_refusal(summary: EvaluationSummary) -> Refusal | None:
    """The first of the summary's refusal booleans that holds (None: it passes): the decision `summarize`
    writes into ``refused_by``, which the "Quality gate" Choice state branches on."""
    return next((refusal for refusal in REFUSALS if getattr(summary, refusal)), None)


def decision(summary: EvaluationSummary) -> Decision:
    return "approved" if summary.refused_by is None else "rejected"


def gate_reason(summary: EvaluationSummary) -> str:
    """The reason of the decision the "Quality gate" Choice state takes on ``summary``."""
    metric, challenger = summary.primary_metric, summary.challenger_value
    versus = wider = ""
    if summary.interval is not None:
        versus = f"vs champion {ap_text(summary.interval.champion)}: {interval_text(summary.interval)}"
    if summary.more_val_images is not None:
        wider = (f"; the interval is wider than the tolerance: about {summary.more_val_images} more val images "
                 f"({summary.val_images} now) would narrow it to \u00b1{limit_text(summary.max_regression)}")
    refusal = summary.refused_by
    if refusal == "below_min_map":
        return f"challenger {metric} {ap_text(challenger)} is below the threshold {limit_text(summary.min_map)}" + (
            f"; {versus}{wider}" if versus else "")
    if refusal == "regressed":
        return (f"challenger {metric} {ap_text(challenger)} {versus}, beyond the tolerance "
                f"{limit_text(summary.max_regression)}{wider}")
    if refusal == "class_regressed":
        return summary.class_gate_reason + (f"; overall {versus}" if versus else "")
    reason = f"challenger {metric} {ap_text(challenger)} reaches the threshold {limit_text(summary.min_map)}"
    if versus:
        reason += (f"; {versus}, no significant regression beyond the tolerance "
                   f"{limit_text(summary.max_regression)}{wider}")
    return reason


def summarize(report: EvaluationReport, event: SummarizeEvent) -> EvaluationSummary:
    """The gate's decision, made once: the booleans the Choice state tests and the reason it records.

    Refused when the challenger's point AP is below MinMap, or when the paired-bootstrap interval of
    challenger - champion lies wholly below -MaxRegression (the regression beyond the tolerance is
    significant), overall or on a judged class (-MaxClassRegression); approved otherwise.
    """
    # The plan names the metric from the manifest's task, so a report that calls bbox_AP
    # primary cannot let a segmentation model through on its box AP.
    gate = event.gate
    metric = gate.primary_metric or report.primary_metric
    challenger = primary_value(report.challenger, metric, "challenger")
    champion = primary_value(report.champion, metric, "champion") if report.champion is not None else None
    floor = round(max(0.0, champion - gate.max_regression), FLOOR_DIGITS) if champion is not None else 0.0
    comparison = check_comparison(report, metric, challenger, champion) if champion is not None else None
    interval = comparison.overall if comparison is not None else None
    regressions = []
    reason = ""
    if gate.max_class_regression is not None and gate.min_class_instances is not None:
        regressions = class_regressions(report, metric, gate.max_class_regression, gate.min_class_instances)
        reason = class_gate_reason(regressions, gate.max_class_regression)
    summary = EvaluationSummary(
        report_uri=event.report_uri, primary_metric=metric, challenger_value=challenger,
        challenger_metrics={k: v for k, v in report.challenger.metrics.items() if math.isfinite(v)},
        has_champion=champion is not None, champion_value=champion, champion_floor=floor,
        min_map=gate.min_map, max_regression=gate.max_regression,
        max_class_regression=gate.max_class_regression, min_class_instances=gate.min_class_instances,
        below_min_map=challenger < gate.min_map,
        regressed=interval is not None and beyond(interval, gate.max_regression),
        interval=interval, val_images=report.val_images,
        resamples=comparison.resamples if comparison is not None else None,
        more_val_images=more_val_images(interval, report.val_images, gate.max_regression) if interval else None,
        class_regressed=bool(regressions), class_regression_count=len(regressions),
        class_regressions=regressions[:MAX_LISTED_REGRESSIONS],
        class_gate_reason=reason,
        class_gate_description=bounded(registry_text(reason), CLASS_GATE_DESCRIPTION_MAX),
        description_head=description_head(event.dataset.name, event.dataset.version),
        refused_by=None, gate_reason="", gate_description="",
        score_thresholds=registry_value(report.challenger_score_thresholds))
    summary = summary.model_copy(update={"refused_by": first_refusal(summary)})
    decided = gate_reason(summary)
    return summary.model_copy(update={"gate_reason": decided, "gate_description": bounded(
        registry_text(decided), CLASS_GATE_DESCRIPTION_MAX)})
