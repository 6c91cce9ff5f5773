"""The evaluation job's part of the gate: challenger vs champion by a paired bootstrap over the val images.

The statistics are :mod:`model_code.evaluation.bootstrap`'s; this module picks what they run on:
the primary metric's IoU type, the judged classes (enough val instances to be judged per class)
and the settings from the job's Environment (:mod:`d2ops_core.gate`, set from the plan's gate).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from d2ops_core.documents.evaluation import Comparison
from d2ops_core.gate import GateSettings
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
