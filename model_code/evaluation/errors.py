"""Error analysis of one model's detections on the val split: the numbers behind ``report/errors.json``.

The rules (matching, the background row and column, the error score, the bounds) are written once,
in :mod:`d2ops_core.documents.error_analysis`; this module applies them. IoU is COCO's own
(``faster_coco_eval``'s ``iou``, crowd regions measured as COCOeval measures them); only the
assignment across classes, which COCO never does, is ours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from faster_coco_eval.core import mask as mask_utils

from d2ops_core.documents.error_analysis import (
    BACKGROUND,
    DEFAULT_SCORE_THRESHOLD,
    IOU_THRESHOLD,
    MAX_MATRIX_CLASSES,
    MAX_WORST_IMAGES,
    OTHER_CLASSES,
    ConfusionMatrix,
    ErrorTotals,
    ImageErrors,
    ModelErrors,
    SizeAP,
)
from model_code.evaluation.coco import Evaluation

CORRECT, CONFUSED, FALSE_POSITIVE, IGNORED = "correct", "confused", "false_positive", "ignored"


@dataclass
class DetectionOutcome:
    bbox: list[float]  # COCO xywh
    category_id: int
    score: float
    kind: str  # CORRECT, CONFUSED, FALSE_POSITIVE or IGNORED (on a crowd region of its class)
    true_category_id: int | None = None  # the object it took (CORRECT, CONFUSED)


@dataclass
class ImageOutcome:
    objects: list[tuple[dict[str, Any], bool]]  # each non-crowd GT annotation and whether a detection took it
    detections: list[DetectionOutcome]


@dataclass
class ModelAnalysis:
    class_ids: list[int]  # the GT's category ids, in its order: the matrix's first rows and columns
    counts: np.ndarray  # (K+1, K+1): true (rows) x predicted (columns); index K is background
    images: list[ImageErrors]  # every val image, in val order
    outcomes: dict[int, ImageOutcome] = field(default_factory=dict)  # image id -> what each box did


def score_thresholds(class_names: Sequence[str], from_artifact: Mapping[str, float] | None
                     ) -> tuple[dict[str, float], str]:
    """Each class's threshold: the artifact's own where it has one (helper T's ``score_thresholds``
    metadata field; artifacts exported before it have none), else the default for every class."""
    if not from_artifact:
        return dict.fromkeys(class_names, DEFAULT_SCORE_THRESHOLD), "default"
    return {name: float(from_artifact.get(name, DEFAULT_SCORE_THRESHOLD)) for name in class_names}, "artifact"


def _ious(dets: list[dict[str, Any]], gts: list[dict[str, Any]]) -> np.ndarray:
    if not dets or not gts:
        return np.zeros((len(dets), len(gts)))
    d = np.asarray([r["bbox"] for r in dets], dtype=np.float64)
    g = np.asarray([a["bbox"] for a in gts], dtype=np.float64)
    return np.asarray(mask_utils.iou(d, g, [int(bool(a.get("iscrowd"))) for a in gts]), dtype=np.float64)


def match_image(gts: list[dict[str, Any]], dets: list[dict[str, Any]],
                iou_threshold: float = IOU_THRESHOLD) -> ImageOutcome:
    """What each box on one image did; ``dets`` are the detections that passed their threshold.

    Pass 1 is COCO's greedy per-class matching (by descending score, the unmatched object of the
    detection's class with the highest IoU >= the threshold; a detection on a crowd region of its
    class is ignored). Pass 2 gives each detection still unmatched the unmatched object of another
    class with the highest IoU: a confusion. Whatever is left is background (false positive, missed).
    """
    dets = sorted(dets, key=lambda r: -float(r["score"]))  # stable: equal scores keep their order
    ious = _ious(dets, gts)
    det_cls = np.asarray([int(r["category_id"]) for r in dets], dtype=np.int64)
    gt_cls = np.asarray([int(a["category_id"]) for a in gts], dtype=np.int64)
    crowd = np.asarray([bool(a.get("iscrowd")) for a in gts], dtype=bool)
    taken = np.zeros(len(gts), dtype=bool)
    kinds: list[str | None] = [None] * len(dets)
    truth: list[int | None] = [None] * len(dets)
    for d in range(len(dets)):
        same = gt_cls == det_cls[d]
        near = ious[d] >= iou_threshold
        candidates = np.flatnonzero(same & near & ~crowd & ~taken)
        if candidates.size:
            g = int(candidates[np.argmax(ious[d, candidates])])
            taken[g], kinds[d], truth[d] = True, CORRECT, int(gt_cls[g])
        elif (same & near & crowd).any():
            kinds[d] = IGNORED
    for d in range(len(dets)):
        if kinds[d] is not None:
            continue
        candidates = np.flatnonzero((gt_cls != det_cls[d]) & (ious[d] >= iou_threshold) & ~crowd & ~taken)
        if candidates.size:
            g = int(candidates[np.argmax(ious[d, candidates])])
            taken[g], kinds[d], truth[d] = True, CONFUSED, int(gt_cls[g])
        else:
            kinds[d] = FALSE_POSITIVE
    return ImageOutcome(
        objects=[(a, bool(taken[i])) for i, a in enumerate(gts) if not crowd[i]],
        detections=[DetectionOutcome(bbox=[float(v) for v in r["bbox"]], category_id=int(r["category_id"]),
                                     score=float(r["score"]), kind=str(kinds[i]), true_category_id=truth[i])
                    for i, r in enumerate(dets)])


def analyse(gt: dict[str, Any], results: list[dict[str, Any]], thresholds: Mapping[str, float],
            iou_threshold: float = IOU_THRESHOLD) -> ModelAnalysis:
    """The confusion matrix and every image's errors of one model's COCO results on ``gt``."""
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    class_ids = list(names)
    index = {cid: i for i, cid in enumerate(class_ids)}
    background = len(class_ids)
    counts = np.zeros((background + 1, background + 1), dtype=np.int64)
    gts: dict[int, list[dict[str, Any]]] = {}
    for ann in gt["annotations"]:
        gts.setdefault(int(ann["image_id"]), []).append(ann)
    dets: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        cid = int(r["category_id"])
        if cid in names and float(r["score"]) >= thresholds.get(names[cid], DEFAULT_SCORE_THRESHOLD):
            dets.setdefault(int(r["image_id"]), []).append(r)
    analysis = ModelAnalysis(class_ids=class_ids, counts=counts, images=[])
    for info in gt["images"]:
        image_id = int(info["id"])
        outcome = match_image(gts.get(image_id, []), dets.get(image_id, []), iou_threshold)
        missed = 0
        for ann, found in outcome.objects:
            if not found:
                counts[index[int(ann["category_id"])], background] += 1
                missed += 1
        tally = {CORRECT: 0, CONFUSED: 0, FALSE_POSITIVE: 0}
        wrong = 0.0
        for det in outcome.detections:
            if det.kind == IGNORED:
                continue
            tally[det.kind] += 1
            column = index[det.category_id]
            row = background if det.true_category_id is None else index[det.true_category_id]
            counts[row, column] += 1
            if det.kind != CORRECT:
                wrong += det.score
        analysis.images.append(ImageErrors(
            image_id=image_id, file_name=str(info["file_name"]), objects=len(outcome.objects),
            correct=tally[CORRECT], confused=tally[CONFUSED], missed=missed, false_positives=tally[FALSE_POSITIVE],
            error_score=missed + tally[FALSE_POSITIVE] + tally[CONFUSED], wrong_score_sum=round(wrong, 5)))
        analysis.outcomes[image_id] = outcome
    return analysis


def worst_images(images: list[ImageErrors], limit: int = MAX_WORST_IMAGES) -> list[ImageErrors]:
    """The images with errors, worst first (the rule is ERROR_SCORE_RULE); at most ``limit``."""
    order = sorted(range(len(images)), key=lambda i: (-images[i].error_score, -images[i].wrong_score_sum, i))
    return [images[i] for i in order if images[i].error_score > 0][:limit]


def confusion_matrix(labels: list[str], counts: np.ndarray, max_classes: int = MAX_MATRIX_CLASSES
                     ) -> ConfusionMatrix:
    """The document's matrix; over ``max_classes`` classes, those with the most errors are kept (in
    their order) and the others summed into one OTHER_CLASSES row and column, so totals stay exact."""
    k = len(labels)
    if k <= max_classes:
        return ConfusionMatrix(labels=[*labels, BACKGROUND], counts=counts.tolist())
    off = counts - np.diag(np.diag(counts))
    errors = off[:k, :].sum(axis=1) + off[:, :k].sum(axis=0)
    keep = sorted(sorted(range(k), key=lambda i: (-int(errors[i]), i))[: max_classes - 1])
    kept = set(keep)
    folded = [i for i in range(k) if i not in kept]
    # new index of each old one: kept classes, then OTHER, then background
    target = np.empty(k + 1, dtype=np.int64)
    for new, old in enumerate(keep):
        target[old] = new
    target[folded] = len(keep)
    target[k] = len(keep) + 1
    out = np.zeros((len(keep) + 2, len(keep) + 2), dtype=np.int64)
    np.add.at(out, (target[:, None], target[None, :]), counts)
    return ConfusionMatrix(labels=[*(labels[i] for i in keep), OTHER_CLASSES, BACKGROUND], counts=out.tolist(),
                           folded=[labels[i] for i in folded])


def _size_ap(values: Mapping[str, float]) -> SizeAP:
    return SizeAP(small=values.get("small"), medium=values.get("medium"), large=values.get("large"))


def model_errors(gt: dict[str, Any], evaluation: Evaluation, thresholds: dict[str, float], source: str,
                 analysis: ModelAnalysis | None = None) -> tuple[ModelErrors, ModelAnalysis]:
    """One model's part of errors.json (AP by size from its COCOeval run, matrix and worst images)."""
    analysis = analysis or analyse(gt, evaluation.results, thresholds)
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    iou_types = sorted({m.split("_", 1)[0] for m in evaluation.metrics} | set(evaluation.per_class_by_area))
    ap_by_size = {t: SizeAP(small=evaluation.metrics.get(f"{t}_APs"), medium=evaluation.metrics.get(f"{t}_APm"),
                            large=evaluation.metrics.get(f"{t}_APl")) for t in iou_types}
    per_class = {t: {name: _size_ap(v) for name, v in classes.items()}
                 for t, classes in evaluation.per_class_by_area.items()}
    c = analysis.counts
    totals = ErrorTotals(objects=int(c[:-1, :].sum()), detections=int(c[:, :-1].sum()), correct=int(np.trace(c)),
                         confused=int(c[:-1, :-1].sum() - np.trace(c)), missed=int(c[:-1, -1].sum()),
                         false_positives=int(c[-1, :-1].sum()))
    doc = ModelErrors(score_thresholds=thresholds, thresholds_from=source,
                      ap_by_size=ap_by_size, per_class_ap_by_size=per_class,
                      confusion=confusion_matrix([names[i] for i in analysis.class_ids], analysis.counts),
                      totals=totals, worst_images=worst_images(analysis.images))
    return doc, analysis
