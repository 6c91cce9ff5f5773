"""Per-class score thresholds: the operating point that ships with the model (``metadata.json``).

The rule, per class, on the val split the export evaluates on:

1. **Matching** is COCO's, done by faster-coco-eval's COCOeval at one IoU threshold, 0.5, area
   "all", at most 100 detections per image (``MAX_DETECTIONS``): a detection is a true positive when
   it takes a non-crowd ground-truth box of its class, *ignored* when it only takes a crowd region
   (COCO counts it neither way, and so does this rule), a false positive otherwise.
2. **Candidates**: keeping every detection scored at or above one of the class's detection scores
   (detections with equal scores are kept or dropped together, as a threshold must).
3. **Choice**: the candidate with the highest F1 = 2 TP / (TP + FP + GT), GT being the class's
   non-crowd instances; compared as exact fractions. **Ties** go to the candidate that keeps fewer
   detections (the higher threshold): on val they are equally good, and fewer boxes is the cheaper
   answer to act on.
4. **The threshold** is the midpoint between the lowest score kept and the highest score dropped
   (half the lowest score kept when nothing is dropped): every threshold in between keeps the same
   detections on val, and the midpoint is the farthest from both, so the rounding of scores
   (evaluation rounds them to 1e-5; the model's own are float32) never flips a detection at the edge.
5. **No evidence**: a class without ground truth on val, without detections, or whose detections
   never take a ground-truth box (the best F1 is 0), gets ``DEFAULT_SCORE_THRESHOLD``, the one the
   server applied to every class before thresholds shipped with the model.

Serving keeps a detection when ``score >= threshold`` (model_code/serving/service.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD

MATCH_IOU = 0.5
MAX_DETECTIONS = 100  # COCO's maxDets for AP, and what evaluation and serving return per image

Basis = Literal["max_f1", "no_ground_truth", "no_detections", "no_true_positive"]


@dataclass(frozen=True)
class ClassMatches:
    """One class's detections on val after COCO's matching at IoU 0.5 (crowd-matched ones left out)."""

    scores: np.ndarray  # (D,) float
    true_positive: np.ndarray  # (D,) bool
    ground_truth: int  # non-crowd instances of the class on val


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float
    basis: Basis
    f1: float  # on val at the threshold (0 when there is no evidence)
    precision: float
    recall: float
    kept: int  # detections of the class kept on val


def choose_threshold(matches: ClassMatches) -> ThresholdChoice:
    """The rule's steps 2-5 for one class (see the module's docstring). Pure."""
    scores = np.asarray(matches.scores, dtype=float)
    tp = np.asarray(matches.true_positive, dtype=bool)
    if scores.shape != tp.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and true_positive {tp.shape} must be the same 1-D shape")
    if matches.ground_truth < 0 or int(tp.sum()) > matches.ground_truth:
        raise ValueError(f"{int(tp.sum())} true positives for {matches.ground_truth} ground-truth instances")
    if matches.ground_truth == 0:
        return _fallback("no_ground_truth")
    if scores.size == 0:
        return _fallback("no_detections")
    if not tp.any():
        return _fallback("no_true_positive")
    order = np.argsort(-scores, kind="stable")
    scores, tp = scores[order], tp[order]
    cum_tp = np.cumsum(tp)
    # A cut keeps every detection down to the last one of a group of equal scores.
    ends = np.flatnonzero(np.append(scores[1:] != scores[:-1], True))
    best = -1
    best_num, best_den = 0, 1
    for end in ends:  # highest threshold first, so a strict '>' keeps the tie rule: fewer detections
        kept_tp = int(cum_tp[end])
        num, den = 2 * kept_tp, (end + 1) + matches.ground_truth  # TP + FP = kept
        if num * best_den > best_num * den:
            best, best_num, best_den = int(end), num, int(den)
    lowest_kept = float(scores[best])
    highest_dropped = float(scores[best + 1]) if best + 1 < scores.size else 0.0
    kept_tp = int(cum_tp[best])
    return ThresholdChoice(threshold=(lowest_kept + highest_dropped) / 2, basis="max_f1", f1=best_num / best_den,
                           precision=kept_tp / (best + 1), recall=kept_tp / matches.ground_truth, kept=best + 1)


def _fallback(basis: Basis) -> ThresholdChoice:
    return ThresholdChoice(threshold=DEFAULT_SCORE_THRESHOLD, basis=basis, f1=0.0, precision=0.0, recall=0.0, kept=0)


def _quiet(*_: Any, **__: Any) -> None:
    return None


def match_classes(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str = "bbox"
                  ) -> dict[str, ClassMatches]:
    """COCO's matching at IoU 0.5 (area all, maxDets 100) per class name of ``gt``'s categories.

    faster-coco-eval does the matching (``extra_calc`` exposes which detection took which ground
    truth); this function only reads it: taken a non-crowd box -> TP, a crowd region -> left out.
    """
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    crowd = {int(a["id"]): bool(a.get("iscrowd")) for a in gt["annotations"]}
    instances = dict.fromkeys(names, 0)
    for a in gt["annotations"]:
        if not a.get("iscrowd") and int(a["category_id"]) in instances:
            instances[int(a["category_id"])] += 1
    per_class: dict[int, tuple[list[float], list[bool]]] = {cid: ([], []) for cid in names}
    if results:
        wanted = list(results) if iou_type == "segm" else [
            {k: v for k, v in r.items() if k != "segmentation"} for r in results]  # boxes as given, not from masks
        coco_gt = COCO(gt, print_function=_quiet)
        coco_dt = coco_gt.loadRes(wanted)
        evaluator = COCOeval_faster(coco_gt, coco_dt, iouType=iou_type, extra_calc=True, print_function=_quiet)
        params = evaluator.params
        params.iouThrs = np.array([MATCH_IOU])
        params.areaRng, params.areaRngLbl = [params.areaRng[0]], ["all"]
        params.maxDets = [MAX_DETECTIONS]
        evaluator.evaluate()
        evaluator.accumulate()
        taken: dict[int, int] = {}
        for pair in evaluator.eval["matched"]:
            dt_id, gt_id = (int(x) for x in pair.split("_", 1))
            taken[dt_id] = gt_id
        for dt_id in _evaluated(coco_dt.anns.values()):
            ann = coco_dt.anns[dt_id]
            cid = int(ann["category_id"])
            if cid not in per_class:
                continue
            took = taken.get(dt_id)
            if took is not None and crowd.get(took, False):
                continue  # took a crowd region: COCO ignores it
            per_class[cid][0].append(float(ann["score"]))
            per_class[cid][1].append(took is not None)
    return {names[cid]: ClassMatches(scores=np.asarray(s, dtype=float), true_positive=np.asarray(t, dtype=bool),
                                     ground_truth=instances[cid])
            for cid, (s, t) in per_class.items()}


def _evaluated(anns: Iterable[dict[str, Any]]) -> list[int]:
    """The detection ids COCO evaluates: the MAX_DETECTIONS best of each (image, class), ties in input order."""
    groups: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for ann in anns:
        groups.setdefault((int(ann["image_id"]), int(ann["category_id"])), []).append(
            (float(ann["score"]), int(ann["id"])))
    kept: list[int] = []
    for group in groups.values():
        group.sort(key=lambda sd: -sd[0])  # stable: equal scores stay in the order they were given
        kept.extend(d for _, d in group[:MAX_DETECTIONS])
    return kept


def choose_thresholds(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str = "bbox"
                      ) -> dict[str, ThresholdChoice]:
    """Each class of ``gt`` (by name) and its threshold with the numbers behind it."""
    return {name: choose_threshold(m) for name, m in match_classes(gt, results, iou_type).items()}


def score_thresholds(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str = "bbox"
                     ) -> dict[str, float]:
    """class name -> score threshold: the artifact's ``metadata.json`` ``score_thresholds``."""
    return {name: choice.threshold for name, choice in choose_thresholds(gt, results, iou_type).items()}


def fit_for_artifact(gt: dict[str, Any], results: Sequence[dict[str, Any]], class_names: Sequence[str], *,
                     has_masks: bool) -> dict[str, float]:
    """What the trainers' export writes into ``metadata.json``: each of the model's classes (a class the val
    split does not list gets the default, as one without ground truth), matched on masks for a segmentation
    model (its primary metric is segm AP), on boxes otherwise. Prints one line per class for the job's log."""
    fitted = choose_thresholds(gt, results, "segm" if has_masks else "bbox")
    choices = {name: fitted.get(name) or _fallback("no_ground_truth") for name in class_names}
    for name, c in choices.items():
        how = (f"F1 {c.f1:.3f} (precision {c.precision:.3f}, recall {c.recall:.3f}, {c.kept} detections kept)"
               if c.basis == "max_f1" else f"the default: {c.basis.replace('_', ' ')} on val")
        print(f"score threshold {name!r}: {c.threshold:.4f}, {how}", flush=True)
    return {name: c.threshold for name, c in choices.items()}
