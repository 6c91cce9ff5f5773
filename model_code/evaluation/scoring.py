"""COCO metrics of detection results on a split (faster-coco-eval), without torch.

The evaluation job scores a model's results with these (``model_code.evaluation.coco`` runs the model);
``d2ops gate`` scores results files with the same code, so it starts without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

# The names of COCOeval's first six stats, in order (AP values are fractions in [0, 1]).
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl")
AREA_NAMES = ("small", "medium", "large")  # COCOeval's area ranges after "all", in its order
MAX_DETECTIONS = 100


@dataclass
class IouTypeScores:
    metrics: dict[str, float]  # e.g. {"bbox_AP": 0.71, ...}; undefined values (no GT in a range) left out
    per_class: dict[str, float]  # class name -> AP
    # precision at IoU 0.5 and averaged over IoU 0.5:0.95, per class, over recall 0:0.01:1 (-1: undefined)
    pr_curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # class name -> {"small"|"medium"|"large": AP}; a size with no GT of the class left out
    per_class_by_area: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class Evaluation:
    val_images: int
    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]]
    pr_curves: dict[str, dict[str, dict[str, list[float]]]]  # iou type -> class -> {"iou50", "iou50_95"}
    results: list[dict[str, Any]]  # COCO result dicts the metrics were computed from
    # iou type -> class -> {"small"|"medium"|"large": AP} (COCO's APs/APm/APl per class)
    per_class_by_area: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The ``metrics``/``per_class`` shape of evaluation.json (docs/interfaces.md, Model evaluation)."""
        return {"metrics": self.metrics, "per_class": self.per_class}


def _quiet(*_: Any, **__: Any) -> None:
    return None


def score_iou_type(gt: dict[str, Any], results: list[dict[str, Any]], iou_type: str,
                   class_names: dict[int, str]) -> IouTypeScores:
    """COCOeval on one IoU type; ``class_names`` maps the GT's category ids to names."""
    coco_gt = COCO(gt, print_function=_quiet)
    if not results:  # loadRes refuses an empty list; no detections means zero AP everywhere there is GT
        zero = dict.fromkeys(class_names.values(), 0.0)
        return IouTypeScores(metrics={f"{iou_type}_{n}": 0.0 for n in STAT_NAMES[:3]}, per_class=zero)
    coco_dt = coco_gt.loadRes(results)
    evaluator = COCOeval_faster(coco_gt, coco_dt, iouType=iou_type, print_function=_quiet)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    stats = [float(s) for s in evaluator.stats[: len(STAT_NAMES)]]
    metrics = {f"{iou_type}_{name}": v for name, v in zip(STAT_NAMES, stats, strict=True) if v >= 0}
    precision = np.asarray(evaluator.eval["precision"])  # [T iou, R recall, K class, A area, M maxdets]
    cat_ids = list(evaluator.params.catIds)
    per_class: dict[str, float] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    by_area: dict[str, dict[str, float]] = {}
    for k, cat_id in enumerate(cat_ids):
        p = precision[:, :, k, 0, -1]  # area "all", maxDets 100
        valid = p[p > -1]
        name = class_names.get(int(cat_id), str(cat_id))
        if valid.size:
            per_class[name] = float(valid.mean())
        for a, area in enumerate(AREA_NAMES, start=1):
            in_area = precision[:, :, k, a, -1]
            if (in_area > -1).any():
                by_area.setdefault(name, {})[area] = float(in_area[in_area > -1].mean())
        with np.errstate(invalid="ignore"):
            mean_over_iou = np.where((p > -1).all(axis=0), p.mean(axis=0), -1.0)
        curves[name] = {"iou50": [round(float(v), 4) for v in p[0]],
                        "iou50_95": [round(float(v), 4) for v in mean_over_iou]}
    return IouTypeScores(metrics=metrics, per_class=per_class, pr_curves=curves, per_class_by_area=by_area)


def score_results(gt: dict[str, Any], results: list[dict[str, Any]], iou_types: list[str]) -> Evaluation:
    """The :class:`Evaluation` of COCO result dicts on the split ``gt``, for each IoU type."""
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    metrics: dict[str, float] = {}
    per_class: dict[str, dict[str, float]] = {}
    curves: dict[str, dict[str, dict[str, list[float]]]] = {}
    by_area: dict[str, dict[str, dict[str, float]]] = {}
    for iou_type in iou_types:
        # bbox scoring must not see the masks (loadRes would derive boxes from them)
        wanted = results if iou_type == "segm" else [{k: v for k, v in r.items() if k != "segmentation"}
                                                      for r in results]
        scores = score_iou_type(gt, wanted, iou_type, names)
        metrics.update(scores.metrics)
        for name, ap in scores.per_class.items():
            per_class.setdefault(name, {})[f"{iou_type}_AP"] = ap
        curves[iou_type] = scores.pr_curves
        by_area[iou_type] = scores.per_class_by_area
    return Evaluation(val_images=len(gt["images"]), metrics=metrics, per_class=per_class, pr_curves=curves,
                      results=results, per_class_by_area=by_area)
