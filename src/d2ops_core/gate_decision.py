"""The quality gate's decision: approve, refuse, or leave it to a person (review).

One function, :func:`judge`, turns the evaluation job's report and the run's thresholds into a
:class:`GateVerdict`. The summarize Lambda (the pipeline's "Quality gate") and ``d2ops gate`` both call
it, so the command line decides exactly as the pipeline does.

The rule (non-inferiority, with the burden of proof on the challenger):

- **refuse** when the challenger's primary AP is below MinMap (``below_min_map``); or, with a champion,
  when even the upper end of the interval of challenger - champion is below -MaxRegression
  (``regressed``: surely worse beyond the tolerance); or when a judged class's (Bonferroni) interval
  lies wholly below -MaxClassRegression (``class_regressed``). The first that holds is ``refused_by``.
- **approve** when not refused and, with a champion, every one of these holds: the interval's lower end
  is at or above -MaxRegression (the challenger is within the tolerance beyond reasonable doubt); no class
  with ground truth on the compared images, judged or not, drops by more than MaxClassRegression on its
  point estimate; at least MinComparedImages held-out val images were compared; and the champion's
  artifact says what it trained on, so the held-out images are known to be held out.
- **review** otherwise: the numbers cannot settle it, and ``review_because`` says which of those failed.

Without a champion the decision is MinMap's alone: approve or refuse, never review.
Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from d2ops_core import gate as rule
from d2ops_core.documents.evaluation import (
    Comparison,
    DifferenceInterval,
    EvaluationReport,
    ExcludedImages,
    GateThresholds,
    HeldOutImages,
    ModelScores,
)
from d2ops_core.gate import ap_text, limit_text

Decision = Literal["approve", "refuse", "review"]
# The refusals, in the order the reason names them: the verdict's booleans of the same names.
Refusal = Literal["below_min_map", "regressed", "class_regressed"]
REFUSALS: tuple[Refusal, ...] = ("below_min_map", "regressed", "class_regressed")
ReviewReason = Literal["uncertain", "class_dropped", "too_few_images", "champion_training_unknown"]
# The verdict travels in the state payload: the worst classes are listed, all are counted.
MAX_LISTED_CLASSES = 10
# A class that kept at most this share of the champion's AP collapsed: a drop no sampling noise explains away.
COLLAPSED = 0.5
# Point estimates of the comparison are the report's own APs, recomputed by the bootstrap's scorer.
POINT_TOLERANCE = 1e-6
_EXCLUSION_WORDS = {"challenger_trained_on": "the challenger trained on",
                    "champion_trained_on": "the champion trained on"}


class GateReportInvalid(ValueError):
    """The report cannot be judged: a metric is missing or out of range, or its parts disagree."""


class ClassRegression(BaseModel):
    """A judged class on which the challenger surely trails the champion by more than the per-class margin:
    the upper end of the (Bonferroni-adjusted) interval of its AP difference is below -max_class_regression."""

    class_name: str
    metric: str = Field(description="the per-class AP compared: the run's primary metric, e.g. bbox_AP")
    challenger_ap: float
    champion_ap: float
    drop: float = Field(description="champion_ap - challenger_ap")
    instances: int = Field(description="non-crowd instances of the class on the compared val images")
    interval: DifferenceInterval = Field(description="the paired-bootstrap interval of challenger - champion")


class ClassDrop(BaseModel):
    """A class whose point AP drops by more than max_class_regression, judged or not: a person should look."""

    class_name: str
    challenger_ap: float
    champion_ap: float
    drop: float = Field(description="champion_ap - challenger_ap")
    instances: int = Field(description="non-crowd instances of the class on the compared val images")
    images: int = Field(description="compared val images holding them")
    judged: bool = Field(description="whether the class has the instances to be judged on its own interval")


class GateVerdict(BaseModel):
    """The gate's decision and the named numbers behind it (never positions in a list)."""

    decision: Decision = Field(description="approve, refuse, or review (a person decides)")
    refused_by: Refusal | None = Field(
        description="the first of below_min_map, regressed, class_regressed that holds; None unless refused")
    review_because: list[ReviewReason] = Field(
        description="why the numbers cannot settle it (empty unless the decision is review): uncertain (the "
                    "interval reaches below -max_regression), class_dropped (a class's point AP drops by more "
                    "than max_class_regression), too_few_images (fewer than min_compared_images held-out val "
                    "images compared), champion_training_unknown (the champion does not list its training images)")
    primary_metric: str
    challenger_value: float = Field(description="the challenger's primary AP on every val image")
    has_champion: bool
    champion_value: float | None = Field(description="the champion's primary AP on every val image (None without "
                                                     "one); the comparison's own points are in `interval`")
    min_map: float
    max_regression: float
    max_class_regression: float | None
    min_class_instances: int | None
    min_compared_images: int
    below_min_map: bool = Field(description="challenger_value < min_map")
    regressed: bool = Field(description="a champion exists and the upper end of the interval of challenger - champion "
                                        "is below -max_regression: the drop beyond the tolerance is significant")
    interval: DifferenceInterval | None = Field(
        description="the paired-bootstrap interval of challenger - champion on the primary metric, on the "
                    "compared images (None without a champion, or when no held-out image was left)")
    val_images: int = Field(ge=1, description="val images the challenger was scored on")
    images_compared: int = Field(ge=0, description="held-out val images both models were compared on")
    images_excluded: int = Field(ge=0, description="val images left out because a model was trained on them")
    excluded: list[ExcludedImages] = Field(description="the left-out images by reason")
    unverified: list[str] = Field(description="models whose training images are unknown (none could be left out)")
    resamples: int | None = Field(description="bootstrap resamples behind the interval (None without one)")
    more_val_images: int | None = Field(
        ge=1, description="when the interval is wider than the tolerance and straddles -max_regression: about how "
                          "many more held-out val images would narrow it to the tolerance, ceil(n * (half_width / "
                          "max_regression)^2) - n; None otherwise")
    class_regressed: bool = Field(description="true when class_regressions is not empty")
    class_regression_count: int = Field(ge=0, description="how many judged classes surely regressed (all of them)")
    class_regressions: list[ClassRegression] = Field(
        max_length=MAX_LISTED_CLASSES, description="the worst of them, worst first (at most 10)")
    class_drop_count: int = Field(ge=0, description="how many classes' point AP dropped by more than "
                                                    "max_class_regression (all of them)")
    class_drops: list[ClassDrop] = Field(max_length=MAX_LISTED_CLASSES,
                                         description="the worst of them, worst first (at most 10)")
    class_gate_reason: str = Field(description="one line naming the surely regressed classes (empty when none)")
    gate_reason: str = Field(description="the decision's reason, whole, quoting the interval and the images "
                                         "compared: the notification's, the status API's and the run's cause")


def primary_value(scores: ModelScores, metric: str, who: str) -> float:
    if metric not in scores.metrics:
        raise GateReportInvalid(f"{who} has no {metric!r} (metrics: {sorted(scores.metrics)})")
    return _fraction(scores.metrics[metric], f"{who} {metric}")


def _fraction(value: float, what: str) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise GateReportInvalid(f"{what} = {value} is not a fraction in [0, 1]")
    return value


def check_comparison(report: EvaluationReport, metric: str, challenger: float, champion: float) -> Comparison | None:
    """The report's comparison, refused when it is not of the metric the gate judges or not of these scores."""
    comparison = report.comparison
    if comparison is None:
        return None
    if comparison.metric != metric:
        raise GateReportInvalid(f"comparison is of {comparison.metric}, the gate judges {metric}")
    overall = comparison.overall
    for who in ("challenger", "champion"):
        _fraction(getattr(overall, who), f"comparison.overall.{who}")
    held_out = report.held_out
    if held_out is not None and held_out.compared == report.val_images:  # the same images: the same APs
        for who, point, value in (("challenger", overall.challenger, challenger),
                                  ("champion", overall.champion, champion)):
            if abs(point - value) > POINT_TOLERANCE:
                raise GateReportInvalid(f"comparison.overall.{who} {point} is not the {who}'s {metric} {value}")
    return comparison


def class_regressions(comparison: Comparison | None, metric: str, max_class_regression: float,
                      min_class_instances: int) -> list[ClassRegression]:
    """Judged classes whose interval lies wholly below -max_class_regression, worst first.

    Judged: at least ``min_class_instances`` instances on the compared images. A judged class missing from
    the comparison's intervals is an invalid report, never a class waved through.
    """
    if comparison is None:
        return []
    found = []
    for name, counted in comparison.classes.items():
        if counted.instances < min_class_instances:
            continue
        interval = comparison.per_class.get(name)
        if interval is None:
            raise GateReportInvalid(f"comparison.per_class lacks {name!r} ({counted.instances} compared instances; "
                                    f"classes with at least {min_class_instances} are judged)")
        challenger = _fraction(interval.challenger, f"comparison.per_class[{name!r}].challenger")
        champion = _fraction(interval.champion, f"comparison.per_class[{name!r}].champion")
        if rule.regression_beyond(interval.high, max_class_regression):
            found.append(ClassRegression(class_name=name, metric=metric, challenger_ap=challenger,
                                         champion_ap=champion, drop=round(champion - challenger, rule.DIGITS),
                                         instances=counted.instances, interval=interval))
    return sorted(found, key=lambda r: (-r.drop, r.class_name))


def class_drops(comparison: Comparison | None, max_class_regression: float,
                min_class_instances: int | None) -> list[ClassDrop]:
    """Every class (judged or not) whose point AP drops by more than ``max_class_regression`` and that either
    collapsed (kept at most ``COLLAPSED`` of the champion's AP) or is surely worse by some amount (its ``high``,
    at the Bonferroni level over every class, below 0), worst first.

    A rare class is too noisy to refuse on, but its collapse is exactly what a person should see: it turns an
    approval into a review. The second condition keeps noise out: with 20 classes of 25 val instances each,
    an equal challenger has some class more than 0.10 below the champion most of the time (make bench-gate:
    65-95 % of equal challengers at 200 images went to review on the point drop alone), but rarely one that
    lost half its AP or is surely worse; a class a model wiped out is both.
    """
    if comparison is None:
        return []
    found = [ClassDrop(class_name=name, challenger_ap=c.challenger, champion_ap=c.champion,
                       drop=round(c.champion - c.challenger, rule.DIGITS), instances=c.instances, images=c.images,
                       judged=min_class_instances is not None and c.instances >= min_class_instances)
             for name, c in comparison.classes.items()
             if round(c.champion - c.challenger, rule.DIGITS) > max_class_regression
             and (c.challenger <= COLLAPSED * c.champion or c.high is None or rule.regression_beyond(c.high, 0.0))]
    return sorted(found, key=lambda d: (-d.drop, d.class_name))


def _held_out_text(val_images: int, held_out: HeldOutImages) -> str:
    text = f"on {held_out.compared} held-out val images"
    if held_out.excluded:
        parts = ", ".join(f"{e.images} {_EXCLUSION_WORDS[e.reason]}" for e in held_out.excluded)
        text += f" ({held_out.excluded_images} of {val_images} left out: {parts})"
    return text


def class_gate_reason(regressions: list[ClassRegression], max_class_regression: float) -> str:
    """One line naming the surely regressed classes with both APs, the interval and the instance counts."""
    if not regressions:
        return ""
    listed = regressions[:MAX_LISTED_CLASSES]
    parts = [f"{r.class_name} {ap_text(r.challenger_ap)} vs {ap_text(r.champion_ap)}, "
             f"{rule.interval_text(r.interval.difference, r.interval.low, r.interval.high, r.interval.confidence)} "
             f"({r.instances} instances)" for r in listed]
    more = f" and {len(regressions) - len(listed)} more" if len(regressions) > len(listed) else ""
    return (f"challenger {listed[0].metric} trails the champion by more than {limit_text(max_class_regression)} "
            f"on {len(regressions)} class{'es' if len(regressions) > 1 else ''} (challenger vs champion): "
            f"{'; '.join(parts)}{more}")


def _review_text(verdict: GateVerdict, held_out: HeldOutImages) -> str:
    parts = []
    for reason in verdict.review_because:
        if reason == "uncertain" and verdict.interval is not None:
            part = (f"the interval's lower end {ap_text(verdict.interval.low)} is below "
                    f"-{limit_text(verdict.max_regression)}: the val images cannot show the challenger is within "
                    "the tolerance")
            if verdict.more_val_images is not None:
                part += f" (about {verdict.more_val_images} more held-out val images would narrow it)"
            parts.append(part)
        elif reason == "class_dropped":
            listed = "; ".join(f"{d.class_name} {ap_text(d.challenger_ap)} vs {ap_text(d.champion_ap)} ({d.instances} "
                               f"instances on {d.images} images{'' if d.judged else ', too few to judge'})"
                               for d in verdict.class_drops)
            more = verdict.class_drop_count - len(verdict.class_drops)
            parts.append(f"{verdict.class_drop_count} class{'es' if verdict.class_drop_count > 1 else ''} "
                         f"drop{'' if verdict.class_drop_count > 1 else 's'} by more than "
                         f"{limit_text(verdict.max_class_regression or 0)} (challenger vs champion): {listed}"
                         + (f" and {more} more" if more > 0 else ""))
        elif reason == "too_few_images" and held_out.compared < verdict.min_compared_images:
            parts.append(f"only {held_out.compared} held-out val images could be compared, fewer than the "
                         f"{verdict.min_compared_images} the gate needs to approve")
        elif reason == "too_few_images":
            parts.append(f"none of the {held_out.compared} held-out val images holds ground truth to compare on")
        elif reason == "champion_training_unknown":
            parts.append("the champion's artifact does not list its training images, so the val images it trained "
                         "on could not be left out")
    return "needs a person's review: " + "; ".join(parts)


def gate_reason(verdict: GateVerdict, held_out: HeldOutImages | None) -> str:
    """The reason of ``verdict``'s decision, quoting the interval and how many images it rests on."""
    metric, challenger = verdict.primary_metric, verdict.challenger_value
    versus = ""
    if verdict.interval is not None and held_out is not None:
        i = verdict.interval
        versus = (f"vs champion {ap_text(i.champion)}: {rule.interval_text(i.difference, i.low, i.high, i.confidence)} "
                  f"{_held_out_text(verdict.val_images, held_out)}")
    refusal = verdict.refused_by
    if refusal == "below_min_map":
        return f"challenger {metric} {ap_text(challenger)} is below the threshold {limit_text(verdict.min_map)}" + (
            f"; {versus}" if versus else "")
    if refusal == "regressed":
        return (f"challenger {metric} {ap_text(challenger)} {versus}: surely worse than the champion by more than "
                f"the tolerance {limit_text(verdict.max_regression)}")
    if refusal == "class_regressed":
        return verdict.class_gate_reason + (f"; overall {versus}" if versus else "")
    reason = f"challenger {metric} {ap_text(challenger)} reaches the threshold {limit_text(verdict.min_map)}"
    if versus:
        reason += f"; {versus}"
    if verdict.decision == "review":
        return f"{_review_text(verdict, held_out or HeldOutImages(compared=0))}; {reason}"
    if verdict.has_champion:
        reason += f", within the tolerance {limit_text(verdict.max_regression)}"
    return reason


def judge(report: EvaluationReport, gate: GateThresholds) -> GateVerdict:
    """The gate's decision on ``report`` (the evaluation job's) under ``gate`` (the run's thresholds). Pure."""
    # The plan names the metric from the manifest's task, so a report that calls bbox_AP primary cannot
    # let a segmentation model through on its box AP.
    metric = gate.primary_metric or report.primary_metric
    challenger = primary_value(report.challenger, metric, "challenger")
    champion = primary_value(report.champion, metric, "champion") if report.champion is not None else None
    has_champion = champion is not None
    held_out = report.held_out if has_champion else None
    comparison = check_comparison(report, metric, challenger, champion) if champion is not None else None
    interval = comparison.overall if comparison is not None else None
    regressions: list[ClassRegression] = []
    drops: list[ClassDrop] = []
    if gate.max_class_regression is not None:
        if gate.min_class_instances is not None:
            regressions = class_regressions(comparison, metric, gate.max_class_regression, gate.min_class_instances)
        drops = class_drops(comparison, gate.max_class_regression, gate.min_class_instances)
    below_min_map = challenger < gate.min_map
    regressed = interval is not None and rule.regression_beyond(interval.high, gate.max_regression)
    refused_by = next((name for name, holds in zip(REFUSALS, (below_min_map, regressed, bool(regressions)),
                                                   strict=True) if holds), None)
    review: list[ReviewReason] = []
    if refused_by is None and held_out is not None:
        if interval is not None and not rule.within_tolerance(interval.low, gate.max_regression):
            review.append("uncertain")
        if drops:
            review.append("class_dropped")
        if interval is None or held_out.compared < gate.min_compared_images:
            review.append("too_few_images")
        if "champion" in held_out.unverified:
            review.append("champion_training_unknown")
    decision: Decision = "refuse" if refused_by else "review" if review else "approve"
    verdict = GateVerdict(
        decision=decision, refused_by=refused_by, review_because=review, primary_metric=metric,
        challenger_value=challenger, has_champion=has_champion, champion_value=champion, min_map=gate.min_map,
        max_regression=gate.max_regression, max_class_regression=gate.max_class_regression,
        min_class_instances=gate.min_class_instances, min_compared_images=gate.min_compared_images,
        below_min_map=below_min_map, regressed=regressed, interval=interval, val_images=report.val_images,
        images_compared=held_out.compared if held_out else report.val_images,
        images_excluded=held_out.excluded_images if held_out else 0,
        excluded=held_out.excluded if held_out else [], unverified=list(held_out.unverified) if held_out else [],
        resamples=comparison.resamples if comparison is not None else None,
        more_val_images=(rule.more_val_images(interval.low, interval.high, comparison.val_images, gate.max_regression)
                         if interval is not None and comparison is not None else None),
        class_regressed=bool(regressions), class_regression_count=len(regressions),
        class_regressions=regressions[:MAX_LISTED_CLASSES], class_drop_count=len(drops),
        class_drops=drops[:MAX_LISTED_CLASSES],
        class_gate_reason=class_gate_reason(regressions, gate.max_class_regression or 0.0), gate_reason="")
    return verdict.model_copy(update={"gate_reason": gate_reason(verdict, held_out)})
