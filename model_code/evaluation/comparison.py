"""The evaluation job's part of the gate: challenger vs champion by a paired bootstrap over the held-out
val images.

The statistics are :mod:`model_code.evaluation.bootstrap`'s; this module picks what they run on:
the primary metric's IoU type, the judged classes (enough compared instances to be judged per class)
and the settings from the job's Environment (:mod:`d2ops_core.gate`, set from the plan's gate). Which
images are held out is :mod:`model_code.evaluation.held_out`'s; what the gate decides is
:mod:`d2ops_core.gate_decision`'s.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any

from d2ops_core.documents.evaluation import (
    ClassDifference,
    Comparison,
    DifferenceInterval,
    EvaluationReport,
    HeldOutImages,
)
from d2ops_core.gate import GateSettings, more_val_images, regression_beyond, within_tolerance
from d2ops_core.metrics import PrimaryMetric
from model_code.evaluation.bootstrap import compare
from model_code.evaluation.documents import class_instances, job_report
from model_code.evaluation.matching import matches_from_coco
from model_code.evaluation.scoring import Evaluation


def iou_type(metric: str) -> str:
    """``bbox_AP`` -> ``bbox``, ``segm_AP`` -> ``segm`` (the primary metrics, d2ops_core.metrics)."""
    kind = metric.removesuffix("_AP")
    if kind not in {"bbox", "segm"} or kind == metric:
        raise ValueError(f"no IoU type for the metric {metric!r}")
    return kind


def judged_classes(instances: dict[str, int], min_class_instances: int) -> list[str]:
    """Classes with at least ``min_class_instances`` non-crowd instances on the compared images: the ones the
    gate judges per class, and so the ones the per-class Bonferroni adjustment counts."""
    return sorted(name for name, count in instances.items() if count >= min_class_instances)


def compare_models(gt: dict[str, Any], challenger: list[dict[str, Any]], champion: list[dict[str, Any]],
                   metric: str, settings: GateSettings) -> Comparison | None:
    """The report's ``comparison`` on ``gt`` (the held-out val images: d2ops_core... held_out), from both
    models' COCO results on the whole val split (those on other images are left out), printing its progress.
    None when no compared image holds ground truth (nothing to compare on: the gate asks a person)."""
    kind = iou_type(metric)
    images = {int(img["id"]) for img in gt["images"]}
    judged = judged_classes(class_instances(gt), settings.min_class_instances)
    if not gt["images"] or not any(not a.get("iscrowd") for a in gt["annotations"]):
        print("gate: no held-out val image holds ground truth; nothing to compare on", file=sys.stderr, flush=True)
        return None
    started = time.monotonic()
    print(f"gate: matching both models' {kind} detections on {len(gt['images'])} held-out val images",
          file=sys.stderr, flush=True)
    ours, theirs = (matches_from_coco(gt, [r for r in results if int(r["image_id"]) in images], kind)
                    for results in (challenger, champion))
    print(f"gate: paired bootstrap of {metric}, {settings.resamples} resamples at {settings.confidence:g} "
          f"confidence (seed {settings.seed}), {len(judged)} classes judged per class (at least "
          f"{settings.min_class_instances} instances)", file=sys.stderr, flush=True)
    comparison = compare(ours, theirs, metric=metric, n_images=len(gt["images"]), resamples=settings.resamples,
                         confidence=settings.confidence, seed=settings.seed, judged_classes=judged)
    overall = comparison.overall
    print(f"gate: {metric} challenger - champion = {overall.difference:.4f}, {overall.confidence:.0%} interval "
          f"[{overall.low:.4f}, {overall.high:.4f}] ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
    return comparison


def evaluation_report(gt: dict[str, Any], challenger: Evaluation, champion: Evaluation | None,
                      primary: PrimaryMetric, settings: GateSettings, *, compared: dict[str, Any] | None = None,
                      held: HeldOutImages | None = None,
                      score_thresholds: dict[str, float] | None = None) -> EvaluationReport:
    """The evaluation job's report (what the gate judges) from both models' evaluations on the val split ``gt``.

    ``compared`` is the val split less the images a model was trained on and ``held`` says which those were
    (model_code.evaluation.held_out); without them every val image is compared (``d2ops gate``: the caller
    vouches that the val file is held out). The evaluation job and ``d2ops gate`` both build it here.
    """
    comparison = None
    if champion is not None:
        compared = gt if compared is None else compared
        held = HeldOutImages(compared=len(compared["images"])) if held is None else held
        comparison = compare_models(compared, challenger.results, champion.results, primary, settings)
    document = job_report(primary, challenger, champion, class_instances(gt), comparison, score_thresholds,
                          held if champion is not None else None)
    return EvaluationReport.model_validate(document)


def _verdict(interval: DifferenceInterval, tolerance: float, per_class: bool) -> str:
    """What the gate makes of one interval (d2ops_core.gate's rules), in words."""
    if regression_beyond(interval.high, tolerance):
        return f"surely worse by more than {tolerance:g}: refused"
    if per_class:
        return f"not surely worse by more than {tolerance:g}"
    if within_tolerance(interval.low, tolerance):
        return f"within {tolerance:g}: approvable"
    return f"may be worse by more than {tolerance:g}: review"


def comparison_html(comparison: Comparison | None, held_out: HeldOutImages | None, settings: GateSettings) -> str:
    """The report's section on the comparison: which val images it could use, each interval with its
    Monte-Carlo errors, what the gate makes of it (when the job knows the tolerances), how many more val
    images would narrow it to the tolerance, and every class's point APs (judged or not)."""
    if held_out is None:
        return ""
    left_out = "".join(f"<li>{e.images} {html.escape(e.reason.replace('_', ' '))} (e.g. "
                       f"{html.escape(', '.join(e.examples))})</li>" for e in held_out.excluded)
    unverified = "".join(f"<li>the {who}'s artifact does not list its training images: none of them could be left "
                         "out</li>" for who in held_out.unverified)
    images = (f"<p>{held_out.compared} held-out val images compared (neither model was trained on them)"
              + (f"; left out:</p><ul>{left_out}{unverified}</ul>" if left_out or unverified else ".</p>"))
    if comparison is None:
        return (f"<h2>Challenger vs champion</h2>{images}<p>No held-out image holds ground truth: nothing to "
                "compare.</p>")

    def row(name: str, interval: DifferenceInterval, tolerance: float | None, per_class: bool) -> str:
        verdict = more = ""
        if tolerance is not None:
            verdict = _verdict(interval, tolerance, per_class)
            needed = None if per_class else more_val_images(interval.low, interval.high, comparison.val_images,
                                                            tolerance)
            more = f"about {needed} more" if needed is not None else ""
        errors = (f" &plusmn;{interval.low_mc_error:.4f} / &plusmn;{interval.high_mc_error:.4f}"
                  if interval.low_mc_error is not None and interval.high_mc_error is not None else "")
        return (f"<tr><th>{html.escape(name)}</th><td>{interval.challenger:.4f}</td><td>{interval.champion:.4f}</td>"
                f"<td>{interval.difference:+.4f}</td><td>[{interval.low:+.4f}, {interval.high:+.4f}]</td>"
                f"<td>{interval.method}{errors}</td><td>{interval.confidence:.4g}</td><td>{verdict}</td>"
                f"<td>{more}</td></tr>")

    rows = [row(f"overall {comparison.metric}", comparison.overall, settings.max_regression, False)]
    judged = (f"per-class levels are Bonferroni-adjusted over the {len(comparison.per_class)} judged classes"
              if comparison.per_class else
              f"no class has the {settings.min_class_instances} instances to be judged on its own")
    rows += [row(name, interval, settings.max_class_regression, True)
             for name, interval in comparison.per_class.items()]
    tolerance = settings.max_class_regression

    def class_row(name: str, c: ClassDifference) -> str:
        dropped = tolerance is not None and round(c.champion - c.challenger, 9) > tolerance
        flag = f"drops by more than {tolerance:g}: review" if dropped else ""
        return (f"<tr><th>{html.escape(name)}</th><td>{c.challenger:.4f}</td><td>{c.champion:.4f}</td>"
                f"<td>{c.difference:+.4f}</td><td>{c.instances}</td><td>{c.images}</td>"
                f"<td>{'yes' if name in comparison.per_class else 'no'}</td><td>{flag}</td></tr>")

    classes = "".join(class_row(name, c) for name, c in comparison.classes.items())
    return (f"<h2>Challenger vs champion: paired bootstrap over {comparison.val_images} held-out val images</h2>"
            f"{images}<p>{comparison.resamples} resamples (seed {comparison.seed}); {judged}. The gate approves when "
            "the overall interval's lower end is at or above minus the tolerance, refuses when its upper end (or a "
            "judged class's) is below it, and leaves the rest to a person. The &plusmn; after the method is the "
            "Monte-Carlo standard error of each end (another seed could move it that much).</p>"
            "<table border=1 class='gate-comparison'><tr><th></th><th>challenger</th><th>champion</th>"
            "<th>difference</th><th>interval</th><th>method</th><th>level</th><th>gate</th>"
            f"<th>val images to narrow it to the tolerance</th></tr>{''.join(rows)}</table>"
            "<h3>Every class with ground truth on the compared images</h3><table border=1 class='gate-classes'>"
            "<tr><th></th><th>challenger</th><th>champion</th><th>difference</th><th>instances</th><th>images</th>"
            f"<th>judged</th><th></th></tr>{classes}</table>")
