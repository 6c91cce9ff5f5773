"""The evaluation job's part of the gate: challenger vs champion by a paired bootstrap over the val images.

The statistics are :mod:`model_code.evaluation.bootstrap`'s; this module picks what they run on:
the primary metric's IoU type, the judged classes (enough val instances to be judged per class)
and the settings from the job's Environment (:mod:`d2ops_core.gate`, set from the plan's gate).
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any

from d2ops_core.documents.evaluation import Comparison, DifferenceInterval
from d2ops_core.gate import GateSettings, more_val_images, regression_beyond
from model_code.evaluation.bootstrap import compare, matches_from_coco
from model_code.evaluation.coco import Evaluation


def iou_type(metric: str) -> str:
    """``bbox_AP`` -> ``bbox``, ``segm_AP`` -> ``segm`` (the primary metrics, d2ops_core.metrics)."""
    kind = metric.removesuffix("_AP")
    if kind not in {"bbox", "segm"} or kind == metric:
        raise ValueError(f"no IoU type for the metric {metric!r}")
    return kind


def judged_classes(instances: dict[str, int], min_class_instances: int) -> list[str]:
    """Classes with at least ``min_class_instances`` non-crowd val instances: the ones the gate judges
    per class, and so the ones the per-class Bonferroni adjustment counts."""
    return sorted(name for name, count in instances.items() if count >= min_class_instances)


def compare_models(gt: dict[str, Any], challenger: Evaluation, champion: Evaluation, metric: str,
                   instances: dict[str, int], settings: GateSettings) -> Comparison:
    """The report's ``comparison``, printing its progress (the bootstrap can take a while on many classes)."""
    kind = iou_type(metric)
    judged = judged_classes(instances, settings.min_class_instances)
    started = time.monotonic()
    print(f"gate: matching both models' {kind} detections on {len(gt['images'])} val images", file=sys.stderr,
          flush=True)
    ours, theirs = matches_from_coco(gt, challenger.results, kind), matches_from_coco(gt, champion.results, kind)
    print(f"gate: paired bootstrap of {metric}, {settings.resamples} resamples at {settings.confidence:g} "
          f"confidence (seed {settings.seed}), {len(judged)} classes judged per class (at least "
          f"{settings.min_class_instances} val instances)", file=sys.stderr, flush=True)
    comparison = compare(ours, theirs, metric=metric, n_images=len(gt["images"]), resamples=settings.resamples,
                         confidence=settings.confidence, seed=settings.seed, judged_classes=judged)
    overall = comparison.overall
    print(f"gate: {metric} challenger - champion = {overall.difference:.4f}, {overall.confidence:.0%} interval "
          f"[{overall.low:.4f}, {overall.high:.4f}] ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
    return comparison


def comparison_html(comparison: Comparison | None, settings: GateSettings) -> str:
    """The report's section on the comparison: each interval, what the gate makes of it (when the job
    knows the tolerances) and how many more val images would narrow an interval to its tolerance."""
    if comparison is None:
        return ""

    def row(name: str, interval: DifferenceInterval, tolerance: float | None) -> str:
        verdict = more = ""
        if tolerance is not None:
            verdict = ("significant regression beyond " if regression_beyond(interval.high, tolerance)
                       else "within ") + f"&plusmn;{tolerance:g}"
            needed = more_val_images(interval.low, interval.high, comparison.val_images, tolerance)
            more = f"about {needed} more" if needed is not None else "enough"
        return (f"<tr><th>{html.escape(name)}</th><td>{interval.challenger:.4f}</td><td>{interval.champion:.4f}</td>"
                f"<td>{interval.difference:+.4f}</td><td>[{interval.low:+.4f}, {interval.high:+.4f}]</td>"
                f"<td>{interval.confidence:.4g}</td><td>{verdict}</td><td>{more}</td></tr>")

    rows = [row(f"overall {comparison.metric}", comparison.overall, settings.max_regression)]
    judged = (f"per-class levels are Bonferroni-adjusted over the {len(comparison.per_class)} judged classes"
              if comparison.per_class else
              f"no class has the {settings.min_class_instances} val instances to be judged on its own")
    rows += [row(name, interval, settings.max_class_regression) for name, interval in comparison.per_class.items()]
    return (f"<h2>Challenger vs champion: paired bootstrap over {comparison.val_images} val images</h2>"
            f"<p>{comparison.resamples} resamples (seed {comparison.seed}); {judged}. The gate refuses only when a "
            "whole interval lies below minus the tolerance.</p><table border=1 class='gate-comparison'><tr><th></th>"
            "<th>challenger</th><th>champion</th><th>difference</th><th>interval</th><th>level</th><th>gate</th>"
            f"<th>val images to narrow it to the tolerance</th></tr>{''.join(rows)}</table>")
