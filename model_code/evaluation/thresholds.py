"""Per-class score thresholds: the operating point that ships with the model (``metadata.json``).

The rule, per class, on the val split the export evaluates on:

1. **Matching** is COCO's, done by faster-coco-eval's COCOeval at one IoU threshold, 0.5, area
   "all", at most 100 detections per image (``MAX_DETECTIONS``): a detection is a true positive when
   it takes a non-crowd ground-truth box of its class, *ignored* when it only takes a crowd region
   (COCO counts it neither way, and so does this rule), a false positive otherwise.
2. **Support**: a class with at least ``min_class_instances`` non-crowd objects on val (the stack's
   MinClassInstances, the count the gate judges a class from) is fitted on its own detections; one
   with fewer, or none, gets the **pooled** threshold: the same rule on every class's detections
   together (TP, FP and GT summed over classes). Fitted on 5 objects, a class's best-F1 cut is mostly
   noise (thresholds 0.23-0.75 across draws of the same detector); one operating point for the
   detector is the better guess.
3. **Candidates**: keeping every detection scored at or above one of the detection scores
   (detections with equal scores are kept or dropped together, as a threshold must).
4. **Choice**: the candidate with the highest F1 = 2 TP / (TP + FP + GT), GT being the non-crowd
   instances; compared exactly (see ``choose_threshold``). **Ties** go to the candidate that keeps
   fewer detections (the higher threshold): on val they are equally good, and fewer boxes is the
   cheaper answer to act on.
5. **The threshold** is the midpoint between the lowest score kept and the highest score dropped
   (half the lowest score kept when nothing is dropped): every threshold in between keeps the same
   detections on val, and the midpoint is the farthest from both, so the rounding of scores
   (evaluation rounds them to 1e-5; the model's own are float32) never flips a detection at the edge.
6. **No evidence**: when what a class is fitted on has no ground truth, no detections, or detections
   that never take a ground-truth box (the best F1 is 0), it gets ``DEFAULT_SCORE_THRESHOLD``, the one
   the server applied to every class before thresholds shipped with the model.

**What F1 is reported.** The F1 at the threshold on the val it was fitted on is optimistic: the cut
was chosen because it scored best on those very detections (a simulated detector with a true F1 of
0.67 at the threshold shipped reads 0.81 on 5 val objects, 0.75 against 0.70 on 40:
tests/unit/test_score_thresholds_support.py). So the figure reported is **out-of-fold**: val's images
are dealt into ``FOLDS`` folds by a hash of their file name (deterministic, independent of the order
val lists them); each fold is scored at the threshold the same rule fits on the other folds (the
class's own or the pooled one, as for the threshold shipped: support is decided once, on all of val),
and TP, FP and GT are summed over the folds (0.66 and 0.70 in those cases: a little pessimistic, as
each fold's threshold saw 4/5 of val, never flattering). The threshold that ships is still fitted on
all of val. With fewer than two folds of ``FOLD_MIN_IMAGES`` images (4 val images) there is nothing to
hold out, and the in-sample figure is reported, labelled optimistic.

Serving keeps a detection when ``score >= threshold`` (model_code/serving/service.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster
from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.gate import DEFAULT_MIN_CLASS_INSTANCES
from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD

MATCH_IOU = 0.5
MAX_DETECTIONS = 100  # COCO's maxDets for AP, and what evaluation and serving return per image
FOLDS = 5
# Each fold holds at least this many images; with fewer val images there are fewer folds, and below two
# folds the reported F1 is the in-sample one, labelled optimistic.
FOLD_MIN_IMAGES = 2
REPORT_FILE = "score_thresholds.json"  # in the training job's report directory (output.tar.gz)

Basis = Literal["max_f1", "no_ground_truth", "no_detections", "no_true_positive"]
FittedOn = Literal["class", "pooled"]
Estimate = Literal["out_of_fold", "in_sample"]


@dataclass(frozen=True)
class ClassMatches:
    """One class's detections on val after COCO's matching at IoU 0.5 (crowd-matched ones left out)."""

    scores: np.ndarray  # (D,) float
    true_positive: np.ndarray  # (D,) bool
    ground_truth: int  # non-crowd instances of the class on val
    # The COCO image id of each detection (D,) and of each non-crowd instance (ground_truth,): what the
    # out-of-fold estimate splits by. None where the caller has no images (choose_threshold needs none).
    detection_images: np.ndarray | None = None
    ground_truth_images: np.ndarray | None = None


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float
    basis: Basis
    f1: float  # on the detections it was fitted on, at the threshold (0 when there is no evidence): in-sample
    precision: float
    recall: float
    kept: int  # detections kept at the threshold


class ClassThreshold(BaseModel):
    """One class's threshold, how it was fitted, and its F1 at it: the honest estimate and the in-sample one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(ge=0, le=1)
    fitted_on: FittedOn = Field(description="class: its own detections (at least min_class_instances val objects); "
                                            "pooled: every class's together (fewer)")
    basis: Basis = Field(description="max_f1, or why what it was fitted on gave the default")
    instances: int = Field(ge=0, description="the class's non-crowd objects on val")
    estimate: Estimate = Field(description="what f1/precision/recall are: out_of_fold (each fold at the threshold "
                                           "fitted on the others) or in_sample (too few val images to hold any out: "
                                           "optimistic)")
    folds: int = Field(ge=0, description="folds of the out-of-fold estimate; 0 when in_sample")
    f1: float | None = Field(description="the class's F1 at IoU 0.5, per estimate; None: no val objects")
    precision: float | None = Field(description="None: nothing kept")
    recall: float | None = Field(description="None: no val objects")
    in_sample_f1: float | None = Field(description="on all of val at the threshold fitted on it: optimistic")
    kept: int = Field(ge=0, description="the class's detections kept on val at the threshold")


class ThresholdFits(BaseModel):
    """What the export fitted (``report/score_thresholds.json``); ``metadata.json`` ships the thresholds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_class_instances: int = Field(ge=1, description="below it a class gets the pooled threshold")
    images: int = Field(ge=0, description="val images")
    folds: int = Field(ge=0, description="folds of the out-of-fold estimates; 0: none (the F1s are in-sample)")
    pooled_threshold: float = Field(ge=0, le=1)
    classes: dict[str, ClassThreshold]

    def score_thresholds(self) -> dict[str, float]:
        """class name -> threshold: the artifact's ``metadata.json`` ``score_thresholds``."""
        return {name: c.threshold for name, c in self.classes.items()}


def choose_threshold(matches: ClassMatches) -> ThresholdChoice:
    """The rule's steps 3-6 for one set of detections (see the module's docstring). Pure."""
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
    # F1 = 2 TP / (kept + GT) as float64 orders the candidates exactly: equal fractions divide to the same
    # float (division is correctly rounded), and two different ones with denominators below 1e7 differ by at
    # least 1e-14, far above the rounding (1e-16). argmax takes the first of equal ones: the highest
    # threshold, the tie rule.
    f1 = 2.0 * cum_tp[ends] / (ends + 1 + matches.ground_truth)
    best = int(ends[int(np.argmax(f1))])
    lowest_kept = float(scores[best])
    highest_dropped = float(scores[best + 1]) if best + 1 < scores.size else 0.0
    kept_tp = int(cum_tp[best])
    return ThresholdChoice(threshold=(lowest_kept + highest_dropped) / 2, basis="max_f1",
                           f1=2 * kept_tp / (best + 1 + matches.ground_truth),
                           precision=kept_tp / (best + 1), recall=kept_tp / matches.ground_truth, kept=best + 1)


def _fallback(basis: Basis) -> ThresholdChoice:
    return ThresholdChoice(threshold=DEFAULT_SCORE_THRESHOLD, basis=basis, f1=0.0, precision=0.0, recall=0.0, kept=0)


def pooled(matches: Iterable[ClassMatches]) -> ClassMatches:
    """Every class's detections and objects as one set: what a class below the support is fitted on."""
    parts = list(matches)

    def images(arrays: list[np.ndarray | None]) -> np.ndarray | None:
        present = [a for a in arrays if a is not None]
        if len(present) < len(arrays):
            return None  # a class without images: the pool has none either
        return np.concatenate([np.zeros(0, np.int64), *(np.asarray(a, dtype=np.int64) for a in present)])

    return ClassMatches(
        scores=np.concatenate([np.zeros(0), *(np.asarray(m.scores, dtype=float) for m in parts)]),
        true_positive=np.concatenate([np.zeros(0, bool), *(np.asarray(m.true_positive, dtype=bool) for m in parts)]),
        ground_truth=sum(m.ground_truth for m in parts),
        detection_images=images([m.detection_images for m in parts]),
        ground_truth_images=images([m.ground_truth_images for m in parts]))


def image_folds(images: Sequence[Mapping[str, Any]], folds: int = FOLDS) -> dict[int, int]:
    """COCO image id -> fold, for the out-of-fold estimate; {} when val has too few images for two folds.

    The images are ordered by the SHA-256 of their file name (the id where there is none) and dealt
    round-robin: folds as even as they can be, the same whatever order val lists the images in, and
    neighbours by name (frames of one clip) scattered rather than held out together by accident.
    """
    count = min(folds, len(images) // FOLD_MIN_IMAGES)
    if count < 2:
        return {}

    def key(image: Mapping[str, Any]) -> tuple[str, int]:
        name = str(image.get("file_name") or image["id"])
        return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest(), int(image["id"])

    return {int(image["id"]): rank % count for rank, image in enumerate(sorted(images, key=key))}


@dataclass(frozen=True)
class _Counts:
    true_positives: int
    kept: int
    ground_truth: int

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(self.true_positives + other.true_positives, self.kept + other.kept,
                       self.ground_truth + other.ground_truth)

    @property
    def f1(self) -> float | None:
        return 2 * self.true_positives / (self.kept + self.ground_truth) if self.ground_truth else None

    @property
    def precision(self) -> float | None:
        return self.true_positives / self.kept if self.kept else None

    @property
    def recall(self) -> float | None:
        return self.true_positives / self.ground_truth if self.ground_truth else None


def _counts(m: ClassMatches, threshold: float, det_mask: np.ndarray | None = None,
            gt_mask: np.ndarray | None = None) -> _Counts:
    kept = np.asarray(m.scores, dtype=float) >= threshold
    if det_mask is not None:
        kept &= det_mask
    tp = int((kept & np.asarray(m.true_positive, dtype=bool)).sum())
    gt = m.ground_truth if gt_mask is None else int(gt_mask.sum())
    return _Counts(tp, int(kept.sum()), gt)


def _subset(m: ClassMatches, det_mask: np.ndarray, gt_mask: np.ndarray) -> ClassMatches:
    return ClassMatches(scores=np.asarray(m.scores)[det_mask], true_positive=np.asarray(m.true_positive)[det_mask],
                        ground_truth=int(gt_mask.sum()))


def _fold_of(images: np.ndarray | None, folds: Mapping[int, int], what: str) -> np.ndarray:
    if images is None:
        raise ValueError(f"an out-of-fold estimate needs the image of each {what}; these matches have none")
    try:
        return np.fromiter((folds[int(i)] for i in images), dtype=np.int64, count=len(images))
    except KeyError as exc:
        raise ValueError(f"a {what} on image {exc.args[0]}, which val does not list") from None


def fold_thresholds(fit_on: ClassMatches, folds: Mapping[int, int]) -> dict[int, float]:
    """fold -> the threshold ``choose_threshold`` fits on ``fit_on`` without that fold's images."""
    det, gt = _fold_of(fit_on.detection_images, folds, "detection"), _fold_of(fit_on.ground_truth_images, folds,
                                                                              "object")
    return {fold: choose_threshold(_subset(fit_on, det != fold, gt != fold)).threshold
            for fold in sorted(set(folds.values()))}


def _held_out(score: ClassMatches, thresholds: Mapping[int, float], folds: Mapping[int, int]) -> _Counts:
    """``score``'s counts summed over the folds, each fold at the threshold fitted without it."""
    det, gt = _fold_of(score.detection_images, folds, "detection"), _fold_of(score.ground_truth_images, folds, "object")
    total = _Counts(0, 0, 0)
    for fold, threshold in thresholds.items():
        total = total + _counts(score, threshold, det == fold, gt == fold)
    return total


def fit_thresholds(matches: Mapping[str, ClassMatches], images: Sequence[Mapping[str, Any]],
                   class_names: Sequence[str] | None = None, *, min_class_instances: int) -> ThresholdFits:
    """Each of ``class_names`` (default: the classes of ``matches``; one ``matches`` lacks has no val objects)
    with its threshold per the rule, and its F1 out-of-fold over val's ``images`` (COCO ``images`` entries;
    in-sample, labelled so, when they are too few for two folds)."""
    if min_class_instances < 1:
        raise ValueError(f"min_class_instances must be at least 1, got {min_class_instances}")
    names = list(matches) if class_names is None else list(class_names)
    folds = image_folds(images)
    n_folds = len(set(folds.values()))  # 0 or at least 2
    pool = pooled(matches.values())
    pool_choice = choose_threshold(pool)
    pool_folds: dict[int, float] | None = None  # fitted once, for the first class below support
    empty = ClassMatches(scores=np.zeros(0), true_positive=np.zeros(0, bool), ground_truth=0,
                         detection_images=np.zeros(0, np.int64), ground_truth_images=np.zeros(0, np.int64))
    classes: dict[str, ClassThreshold] = {}
    for name in names:
        own = matches.get(name, empty)
        on_own = own.ground_truth >= min_class_instances
        choice = choose_threshold(own) if on_own else pool_choice
        in_sample = _counts(own, choice.threshold)
        honest = in_sample
        if n_folds:
            if on_own:
                per_fold = fold_thresholds(own, folds)
            else:
                pool_folds = pool_folds if pool_folds is not None else fold_thresholds(pool, folds)
                per_fold = pool_folds
            honest = _held_out(own, per_fold, folds)
        classes[name] = ClassThreshold(
            threshold=choice.threshold, fitted_on="class" if on_own else "pooled", basis=choice.basis,
            instances=own.ground_truth, estimate="out_of_fold" if n_folds else "in_sample", folds=n_folds,
            f1=honest.f1, precision=honest.precision, recall=honest.recall, in_sample_f1=in_sample.f1,
            kept=in_sample.kept)
    return ThresholdFits(min_class_instances=min_class_instances, images=len(images), folds=n_folds,
                         pooled_threshold=pool_choice.threshold, classes=classes)


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
    objects: dict[int, list[int]] = {cid: [] for cid in names}  # the image of each non-crowd instance
    for a in gt["annotations"]:
        if not a.get("iscrowd") and int(a["category_id"]) in objects:
            objects[int(a["category_id"])].append(int(a["image_id"]))
    per_class: dict[int, tuple[list[float], list[bool], list[int]]] = {cid: ([], [], []) for cid in names}
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
            per_class[cid][2].append(int(ann["image_id"]))
    return {names[cid]: ClassMatches(scores=np.asarray(s, dtype=float), true_positive=np.asarray(t, dtype=bool),
                                     ground_truth=len(objects[cid]),
                                     detection_images=np.asarray(i, dtype=np.int64),
                                     ground_truth_images=np.asarray(objects[cid], dtype=np.int64))
            for cid, (s, t, i) in per_class.items()}


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


def choose_thresholds(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str = "bbox",
                      class_names: Sequence[str] | None = None, *,
                      min_class_instances: int = DEFAULT_MIN_CLASS_INSTANCES) -> ThresholdFits:
    """Each class of ``class_names`` (default: ``gt``'s categories) and its threshold with the numbers behind it."""
    return fit_thresholds(match_classes(gt, results, iou_type), gt["images"], class_names,
                          min_class_instances=min_class_instances)


def score_thresholds(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str = "bbox", *,
                     min_class_instances: int = DEFAULT_MIN_CLASS_INSTANCES) -> dict[str, float]:
    """class name -> score threshold of ``gt``'s categories: the artifact's ``metadata.json`` ``score_thresholds``."""
    return choose_thresholds(gt, results, iou_type, min_class_instances=min_class_instances).score_thresholds()


def describe(name: str, c: ClassThreshold, min_class_instances: int) -> str:
    """The job log's line for one class: the threshold, which F1 it is, and what it was fitted on."""
    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    pooled = (f"pooled over all classes ({c.instances} val objects, fewer than MinClassInstances "
              f"{min_class_instances})")
    if c.basis != "max_f1":
        why = c.basis.replace("_", " ")
        return (f"score threshold {name!r}: {c.threshold:.4f}, the default: " +
                (f"{why} on its {c.instances} val objects" if c.fitted_on == "class" else f"{why} on val, {pooled}"))
    fitted = f"its own best F1 on {c.instances} val objects" if c.fitted_on == "class" else pooled
    which = (f"out-of-fold over {c.folds} folds by image" if c.estimate == "out_of_fold"
             else "in-sample, optimistic: too few val images to hold any out")
    on_fit = (f"; {number(c.in_sample_f1)} on the val it was fitted on (optimistic)" if c.estimate == "out_of_fold"
              else "")
    return (f"score threshold {name!r}: {c.threshold:.4f}, F1 {number(c.f1)} {which} (precision "
            f"{number(c.precision)}, recall {number(c.recall)}{on_fit}; {c.kept} detections kept on val), {fitted}")


def fit_for_artifact(gt: dict[str, Any], results: Sequence[dict[str, Any]], class_names: Sequence[str], *,
                     has_masks: bool, min_class_instances: int = DEFAULT_MIN_CLASS_INSTANCES) -> ThresholdFits:
    """What the trainers' export writes: each of the model's classes' threshold (``.score_thresholds()`` into
    ``metadata.json``, the whole into the report's ``REPORT_FILE``), matched on masks for a segmentation model
    (its primary metric is segm AP), on boxes otherwise. Prints one line per class for the job's log."""
    fits = choose_thresholds(gt, results, "segm" if has_masks else "bbox", class_names,
                             min_class_instances=min_class_instances)
    for name, c in fits.classes.items():
        print(describe(name, c, min_class_instances), flush=True)
    return fits
