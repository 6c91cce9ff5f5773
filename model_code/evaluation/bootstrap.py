"""The paired bootstrap behind the quality gate: how sure is "the challenger is worse than the champion"?

The gate used to compare two AP point estimates on the val split. On a few hundred images two
samples of the same images, or two trainings of the same data, differ by more than the gate's
tolerance, so near the champion that decision was a coin toss. Here both models are scored per
image and the val images are resampled with replacement: each resample is scored for *both*
models (paired, so the difference keeps only the sampling noise that is not shared), and the
interval of challenger minus champion says how far below (or above) the champion the challenger
may really be.

Three pieces:

- :class:`ClassMatches`: COCO's own per-image matching (``COCOeval.evaluateImg``: area "all", maxDets
  100, IoU .50:.05:.95) of one class, as which detection is a true positive, which is ignored (it
  matched a crowd region), and how many GT instances each image holds
  (``model_code.evaluation.matching.matches_from_coco`` computes it, vectorised).
- :func:`weighted_ap`: COCO's AP (101-point interpolated precision, averaged over the IoU
  thresholds) of the val split in which image *i* appears ``weights[r, i]`` times, for many
  resamples *r* at once. A resample is image multiplicities, so its AP is a weighted cumulative
  sum over the detections in COCO's score order; no detection is re-matched.
- :func:`compare`: the seeded paired bootstrap and its intervals: overall a percentile interval of
  the mean class difference over a fixed class set (every class with GT on the compared images, in
  every resample), per judged class a normal interval at a Bonferroni-adjusted level (so that with
  many classes one unlucky class does not block a good model), each end with its Monte-Carlo error.
  ``d2ops_core.gate_decision`` turns them into approve, refuse or review.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from d2ops_core.documents.evaluation import ClassDifference, Comparison, DifferenceInterval

# COCO's recall thresholds (0:.01:1), built the way COCOeval's Params builds them so that a recall
# compares against exactly the same floats.
RECALL_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
MAX_DETECTIONS = 100
# Elements of one (resamples x detections) block: bounds the memory of weighted_ap (~8 bytes each).
_BLOCK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class ClassMatches:
    """One class on the val images, COCO's matching done (area 'all', maxDets 100, IoU .50:.05:.95)."""

    gt_per_image: np.ndarray  # (n_images,) int: non-ignored GT instances on each image
    det_image: np.ndarray  # (D,) int: image index of each detection, in COCO's accumulate order (score desc.)
    det_tp: np.ndarray  # (T, D) bool: matched a non-ignored GT at IoU threshold t
    det_ignore: np.ndarray  # (T, D) bool: matched an ignored GT (crowd) -> neither TP nor FP

    def __post_init__(self) -> None:
        d = self.det_image.shape[0]
        if self.det_tp.shape != self.det_ignore.shape or self.det_tp.shape[1:] != (d,):
            raise ValueError(f"det_tp {self.det_tp.shape} and det_ignore {self.det_ignore.shape} must be (T, {d})")
        if (self.det_tp & self.det_ignore).any():
            raise ValueError("a detection cannot be both a true positive and ignored at the same IoU threshold")
        if d and (self.det_image.min() < 0 or self.det_image.max() >= self.gt_per_image.shape[0]):
            raise ValueError(f"det_image indexes images outside 0..{self.gt_per_image.shape[0] - 1}")


def weighted_ap(matches: ClassMatches, weights: np.ndarray) -> np.ndarray:
    """COCO AP of the class on each resample: ``weights`` (R, n_images) image multiplicities -> (R,).

    With all weights 1 this is COCO's per-class AP. NaN where the resample holds no GT of the class
    (COCO leaves such a class out of the mean).
    """
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    if weights.shape[1] != matches.gt_per_image.shape[0]:
        raise ValueError(f"weights cover {weights.shape[1]} images, the matches {matches.gt_per_image.shape[0]}")
    return _weighted_ap(matches, np.ascontiguousarray(weights.T))


def _weighted_ap(matches: ClassMatches, by_image: np.ndarray) -> np.ndarray:
    """:func:`weighted_ap` with the weights as (n_images, R), resamples along the fast axis."""
    n_gt = matches.gt_per_image.astype(np.float64) @ by_image  # (R,)
    out = np.zeros(by_image.shape[1])
    tp_any = matches.det_tp.any(axis=0)
    if tp_any.any():
        # Detections after the last true positive at every threshold change no precision that COCO
        # interpolates (they only add false positives past the highest recall): leave them out.
        last = int(np.flatnonzero(tp_any)[-1]) + 1
        det_image, det_tp, det_ignore = matches.det_image[:last], matches.det_tp[:, :last], matches.det_ignore[:, :last]
        block = max(1, _BLOCK_ELEMENTS // last)
        for start in range(0, by_image.shape[1], block):
            rows = slice(start, start + block)
            part = by_image if block >= by_image.shape[1] else np.ascontiguousarray(by_image[:, rows])
            out[rows] = _ap_block(np.take(part, det_image, axis=0), det_tp, det_ignore, n_gt[rows])
    with np.errstate(invalid="ignore"):
        return np.where(n_gt > 0, out, np.nan)


def _ap_block(det_weight: np.ndarray, det_tp: np.ndarray, det_ignore: np.ndarray, n_gt: np.ndarray) -> np.ndarray:
    """AP over the IoU thresholds for a block of resamples; ``det_weight`` (D, r) each detection's multiplicity.

    COCO's interpolated precision at recall threshold k is the highest precision at or after the first
    detection whose recall reaches k. Recall only moves at true positives and precision only falls
    between them, so it suffices to know precision and recall at the true positives: AP is the sum
    over them of (running maximum of precision from the right) x (how many recall thresholds that
    true positive is the first to reach), over 101. The weight of the detections between true
    positives is summed in one pass over their rows (``np.add.reduceat``); only the true positives'
    rows are then accumulated one by one.
    """
    r = det_weight.shape[1]
    total = np.zeros(r)
    n_gt_row = np.maximum(n_gt, 1.0)[None, :]  # resamples without GT come out NaN in weighted_ap
    # Every position that is a true positive at some threshold: the running weight is needed there only.
    anywhere = np.flatnonzero(det_tp.any(axis=0))
    counted_cache: dict[bytes, np.ndarray] = {}
    for t in range(det_tp.shape[0]):
        tp_idx = np.flatnonzero(det_tp[t])
        if tp_idx.size == 0:
            continue
        key = np.packbits(det_ignore[t]).tobytes()
        if key not in counted_cache:  # the ignore mask is the same at most thresholds: one pass each
            kept = det_weight if not det_ignore[t].any() else det_weight * ~det_ignore[t][:, None]
            counted_cache[key] = _sums_up_to(kept, anywhere)
        counted = counted_cache[key][np.searchsorted(anywhere, tp_idx)]  # TP + FP weight up to each TP
        tp_cum = _running_sum(det_weight[tp_idx])
        precision = tp_cum / (counted + np.spacing(1))  # COCO's tp / (tp + fp + eps)
        recall = tp_cum / n_gt_row
        newly = np.diff(_thresholds_reached(recall), axis=0, prepend=0)
        _running_max_from_end(precision)
        total += np.einsum("ij,ij->j", precision, newly)
    return total / (det_tp.shape[0] * len(RECALL_THRESHOLDS))


def _sums_up_to(weights: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """(len(positions), r): the sum of ``weights`` rows 0..p for each of the increasing ``positions`` p."""
    starts = np.concatenate([[0], positions[:-1] + 1])
    return _running_sum(np.add.reduceat(weights[: positions[-1] + 1], starts, axis=0))


# Running sums and maxima down axis 0, a row at a time: numpy's accumulate along axis 0 walks each column
# with a stride, several times slower on these (true positives x resamples) arrays.
def _running_sum(values: np.ndarray) -> np.ndarray:
    out = np.array(values, dtype=np.float64)
    for i in range(1, out.shape[0]):
        np.add(out[i], out[i - 1], out=out[i])
    return out


def _running_max_from_end(values: np.ndarray) -> None:
    for i in range(values.shape[0] - 2, -1, -1):
        np.maximum(values[i], values[i + 1], out=values[i])


def _thresholds_reached(recall: np.ndarray) -> np.ndarray:
    """How many of COCO's recall thresholds are <= each recall (searchsorted(..., 'right'), exactly).

    The thresholds are k/100 as floats: floor(100 * recall) + 1 is the count except where 100 * recall
    lies within rounding of an integer; those few values are settled against the very floats COCO uses.
    """
    last = len(RECALL_THRESHOLDS) - 1
    scaled = recall * last
    reached = scaled.astype(np.int64) + 1
    near = np.flatnonzero(np.abs(scaled - np.rint(scaled)) < 1e-6)  # recall is at most 1: no more than 101
    if near.size:  # .flat: C-order positions whatever the arrays' memory layout (flatnonzero's order)
        reached.flat[near] = np.searchsorted(RECALL_THRESHOLDS, recall.flat[near], side="right")
    return reached


def resample_weights(n_images: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n_images) multiplicities of a bootstrap: n_images draws with replacement, seeded."""
    draws = np.random.default_rng(seed).integers(0, n_images, size=(resamples, n_images))
    draws += np.arange(resamples)[:, None] * n_images  # count each resample's draws in its own row
    return np.bincount(draws.ravel(), minlength=resamples * n_images).reshape(resamples, n_images).astype(np.float64)


def class_differences(differences: np.ndarray, point: float) -> np.ndarray:
    """One class's challenger - champion AP in each resample (NaN: the resample holds none of its GT), with
    ``point``, its point difference, in place of the NaNs.

    A resample that misses a rare class's few images would otherwise drop the class from that resample's
    mean: a class on k images is missing from about e^-k of them, so a class a model wiped out could leave
    the interval whole. Held at its point difference, the class weighs in every resample.
    """
    return np.where(np.isnan(differences), point, differences)


def _percentile_mc_error(values: np.ndarray, q: float) -> float:
    """Monte-Carlo standard error of the ``q`` quantile of ``values`` (the resamples): half the spread of the
    order statistics one binomial standard deviation either side of it (Maritz-Jarrett's idea, simplified)."""
    ordered = np.sort(values)
    n = ordered.size
    spread = math.sqrt(n * q * (1 - q))
    low = min(n - 1, max(0, math.floor(n * q - spread)))
    high = min(n - 1, max(0, math.ceil(n * q + spread)))
    return float(ordered[high] - ordered[low]) / 2


def percentile_interval(challenger: float, champion: float, differences: np.ndarray,
                        confidence: float) -> DifferenceInterval:
    """The resampled differences' (1 - confidence) / 2 and (1 + confidence) / 2 quantiles, with their
    Monte-Carlo errors."""
    finite = differences[~np.isnan(differences)]
    alpha = 1.0 - confidence
    low, high = (float(v) for v in np.quantile(finite, [alpha / 2, 1 - alpha / 2]))
    return DifferenceInterval(challenger=challenger, champion=champion, difference=challenger - champion,
                              low=low, high=high, confidence=confidence, half_width=(high - low) / 2,
                              method="percentile", low_mc_error=_percentile_mc_error(finite, alpha / 2),
                              high_mc_error=_percentile_mc_error(finite, 1 - alpha / 2))


def normal_interval(challenger: float, champion: float, differences: np.ndarray,
                    confidence: float) -> DifferenceInterval:
    """The point difference +- z x the standard deviation of the resampled differences.

    For the per-class intervals: at a Bonferroni level such as 1 - 0.05 / 80, a percentile end would be the
    one or two most extreme of 1,000 resamples (Monte-Carlo error about 0.013 AP, and biased inwards); the
    standard deviation of 1,000 resamples is known to about 2 %, and so are these ends.
    """
    finite = differences[~np.isnan(differences)]
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    sd = float(np.std(finite, ddof=1)) if finite.size > 1 else 0.0
    difference = challenger - champion
    # sd's own standard error is about sd / sqrt(2 (n - 1)) for a near-normal sample; each end moves by z times it.
    mc_error = z * sd / math.sqrt(2 * max(finite.size - 1, 1))
    return DifferenceInterval(challenger=challenger, champion=champion, difference=difference,
                              low=difference - z * sd, high=difference + z * sd, confidence=confidence,
                              half_width=z * sd, method="normal", low_mc_error=mc_error, high_mc_error=mc_error)


def compare(challenger: dict[str, ClassMatches], champion: dict[str, ClassMatches], *, metric: str,
            n_images: int, resamples: int, confidence: float, seed: int,
            judged_classes: Collection[str]) -> Comparison:
    """Challenger minus champion by a paired bootstrap over the ``n_images`` compared val images.

    Both models are scored on the same resampled multiset of images (their errors on an image are
    correlated; resampling them apart would inflate the interval). The overall difference of a resample
    is the mean of the class differences over every class with GT on the compared images (COCO's mean
    over classes, with the class set held fixed: :func:`class_differences`); its interval is percentile
    at ``confidence``. Each judged class gets a normal interval at ``1 - (1 - confidence) / len(judged)``
    (Bonferroni) from the resamples that hold its GT. Every class with GT is listed with its point APs
    (``classes``), judged or not, so a rare class's collapse is visible to the gate.
    """
    if set(challenger) != set(champion):
        raise ValueError(f"the models' classes differ: {sorted(set(challenger) ^ set(champion))}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    if resamples < 2 or n_images < 1:
        raise ValueError("resamples must be at least 2 and n_images at least 1")
    unknown = sorted(set(judged_classes) - set(challenger))
    if unknown:
        raise ValueError(f"judged classes with no matches: {unknown}")
    for name in challenger:
        if not np.array_equal(challenger[name].gt_per_image, champion[name].gt_per_image):
            raise ValueError(f"class {name!r}: the two models were matched against different ground truth")
        if challenger[name].gt_per_image.shape[0] != n_images:
            raise ValueError(f"class {name!r} covers {challenger[name].gt_per_image.shape[0]} images, not {n_images}")
    without_gt = sorted(c for c in judged_classes if challenger[c].gt_per_image.sum() == 0)
    if without_gt:
        raise ValueError(f"judged classes without GT on the val images: {without_gt}")
    with_gt = [c for c in sorted(challenger) if challenger[c].gt_per_image.sum() > 0]
    if not with_gt:
        raise ValueError("no class has GT on the val images")

    ones = np.ones((n_images, 1))
    by_image = np.ascontiguousarray(resample_weights(n_images, resamples, seed).T)
    classes: dict[str, ClassDifference] = {}
    differences: dict[str, np.ndarray] = {}

    def score(name: str) -> tuple[ClassDifference, np.ndarray]:
        ours, theirs = challenger[name], champion[name]
        point_ours, point_theirs = float(_weighted_ap(ours, ones)[0]), float(_weighted_ap(theirs, ones)[0])
        gt = ours.gt_per_image
        return (ClassDifference(challenger=point_ours, champion=point_theirs, difference=point_ours - point_theirs,
                                instances=int(gt.sum()), images=int(np.count_nonzero(gt))),
                _weighted_ap(ours, by_image) - _weighted_ap(theirs, by_image))  # NaN: no GT drawn

    # Classes are independent and numpy's loops release the GIL: one thread per CPU (an evaluation host has
    # several) shortens the comparison without copying the matches into other processes.
    with ThreadPoolExecutor(max_workers=max(1, min(len(with_gt), os.cpu_count() or 1))) as pool:
        for name, (counted, resampled) in zip(with_gt, pool.map(score, with_gt), strict=True):
            classes[name], differences[name] = counted, resampled
    overall_point = {who: float(np.mean([getattr(classes[c], who) for c in with_gt]))
                     for who in ("challenger", "champion")}
    overall_differences = np.mean(
        [class_differences(differences[c], classes[c].difference) for c in with_gt],
        axis=0)
    overall = percentile_interval(overall_point["challenger"], overall_point["champion"], overall_differences,
                                  confidence)
    # Every class's own upper end, at the Bonferroni level over all of them: whether its point drop is noise.
    listed_confidence = 1.0 - (1.0 - confidence) / len(with_gt)
    for c in with_gt:
        classes[c] = classes[c].model_copy(update={"high": normal_interval(
            classes[c].challenger, classes[c].champion, differences[c], listed_confidence).high})
    judged = sorted(judged_classes)
    class_confidence = 1.0 - (1.0 - confidence) / len(judged) if judged else confidence
    per_class = {c: normal_interval(classes[c].challenger, classes[c].champion, differences[c], class_confidence)
                 for c in judged}
    return Comparison(metric=metric, val_images=n_images, resamples=resamples, seed=seed, confidence=confidence,
                      overall=overall, per_class=per_class, classes=classes)
