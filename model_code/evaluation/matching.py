"""COCO's per-image matching for the gate, vectorised: which detection is a true positive at which IoU threshold.

The gate's paired bootstrap (:mod:`model_code.evaluation.bootstrap`) needs, per class, COCO's matching
at every IoU threshold .50:.05:.95 for every detection. pycocotools' ``COCOeval.evaluate()`` computes
it in Python, one image and class at a time (7.5 s a model at 1,000 images / 100k detections, more
than the whole faster-coco-eval evaluation). faster-coco-eval (1.8) does the same in C++ but does not
hand it back: ``COCOevalEvaluateImages`` returns opaque ``ImageEvaluation`` objects and
``extra_calc``'s ``eval["matched"]`` holds one (detection, ground truth) pair per detection at the
lowest threshold only. Hence this module: IoU for every (detection, ground truth) pair of an (image,
class) at once (numpy, the same floating-point operations as pycocotools' C ``bbIou``; masks through
``pycocotools.mask.iou``), then the greedy matching run for all (image, class) groups and all ten
thresholds together, one detection rank at a time (at most ``MAX_DETECTIONS`` steps).

The matching is pycocotools' ``evaluateImg`` with area "all" and maxDets 100, exactly (the tests
compare it with ``COCOeval`` on random data):

- per (image, class) the detections are sorted by score (stable: equal scores keep their input
  order) and only the first ``MAX_DETECTIONS`` are kept; the ground truth is sorted ignored-last
  (stable), a ground truth being ignored when it is a crowd region or its ``area`` lies outside
  [0, 1e10] (``gt_per_image`` counts the others; an annotation without ``area``, which pycocotools
  refuses, counts as in range);
- a detection takes, among the ground truth it may still take (not yet taken at this threshold, or a
  crowd region, which may be taken again and again) with IoU >= the threshold, a non-ignored one if it
  can, the one with the highest IoU, of equal ones the last in that order;
- a detection that took an ignored ground truth is ignored (neither TP nor FP); so is one that took
  none and whose area (as ``loadRes`` computes it) lies outside [0, 1e10];
- pycocotools records a match as the ground truth's id, so a ground truth with id 0 (or below) counts
  as no match (a false positive), though it is taken; faster-coco-eval shares that quirk (and warns),
  and so does this module, so that AP here is COCO's AP.

Across images a class's detections come in ``COCOeval.accumulate``'s order: images in sorted id
order, each in its score order, then a stable sort on the score.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from model_code.evaluation.bootstrap import IOU_THRESHOLDS, MAX_DETECTIONS, ClassMatches

# pycocotools compares an IoU with min(threshold, 1 - 1e-10), so that IoU 1 matches at threshold 1.
_THRESHOLDS = np.minimum(IOU_THRESHOLDS, 1 - 1e-10)
# Area "all" is [0, 1e5 ** 2]: a ground truth or a detection outside it is ignored.
_AREA_ALL = (0.0, 1e5**2)
# (detection, ground truth) pairs whose IoU is computed at once: bounds the memory of a block (~40 bytes each).
_PAIR_BLOCK = 2_000_000


def matches_from_coco(gt: dict[str, Any], results: Sequence[dict[str, Any]], iou_type: str) -> dict[str, ClassMatches]:
    """Class name -> COCO's matches of ``results`` on ``gt``; images indexed in ``gt["images"]`` order.

    Every category of ``gt`` is present (no detections: an empty match list), so both models of a
    comparison name the same classes. bbox matching ignores a result's ``segmentation`` (boxes as the
    model gave them, as :mod:`model_code.evaluation.coco` scores them). Neither argument is changed.
    """
    if iou_type not in {"bbox", "segm"}:
        raise ValueError(f"iou_type must be 'bbox' or 'segm', not {iou_type!r}")
    images = _Images(gt["images"])
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    cat_ids = sorted(names)
    truth = _GroundTruth(gt["annotations"], images, cat_ids)
    dets = _Detections(results, images, cat_ids, iou_type)

    det_match = _match(truth, dets, iou_type, images)  # (kept detections, T) sorted gt index, -1 none
    # pycocotools' dtMatches is the ground truth's id, 0 for none: so a match with id 0 reads as none (and
    # one with a negative id is no TP). det_match -1 (none) picks the appended id 0, not ignored.
    took_id = np.r_[truth.ann_id, 0][det_match]
    recorded = took_id != 0
    ignore = np.r_[truth.ignored, False][det_match] | (~recorded & dets.area_out[:, None])
    tp = (took_id > 0) & ~ignore

    # accumulate's order: per class, images in sorted id order and each image's score order, then a
    # stable sort on -score.
    order = np.lexsort((dets.rank, dets.image_rank, -dets.score, dets.cat))
    bounds = np.searchsorted(dets.cat[order], np.arange(len(cat_ids) + 1))
    gt_counts = np.zeros((len(cat_ids), images.count), dtype=np.int64)
    counted = ~truth.ignored
    np.add.at(gt_counts, (truth.cat[counted], images.position[truth.image_rank[counted]]), 1)

    out: dict[str, ClassMatches] = {}
    for cat_id, name in names.items():  # in gt["categories"] order
        code = cat_ids.index(cat_id)
        rows = order[bounds[code]:bounds[code + 1]]
        out[name] = ClassMatches(
            gt_per_image=gt_counts[code], det_image=images.position[dets.image_rank[rows]].astype(np.int64),
            det_tp=np.ascontiguousarray(tp[rows].T), det_ignore=np.ascontiguousarray(ignore[rows].T))
    return out


class _Images:
    """The val images: sorted-id rank (COCO's image order) and position in ``gt["images"]`` (the matches')."""

    def __init__(self, entries: Sequence[dict[str, Any]]) -> None:
        ids = [int(img["id"]) for img in entries]
        if len(set(ids)) != len(ids):
            raise ValueError("gt['images'] lists an image id more than once")
        order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
        self.count = len(ids)
        self.rank = {ids[i]: r for r, i in enumerate(order)}
        self.position = order.astype(np.int64)  # sorted-id rank -> position in gt["images"]
        self.sorted_entries = [entries[i] for i in order]

    def ranks(self, image_ids: Iterable[Any], what: str) -> np.ndarray:
        try:
            return np.fromiter((self.rank[int(i)] for i in image_ids), dtype=np.int64)
        except KeyError as missing:
            raise ValueError(f"{what} name image id {missing.args[0]}, which gt['images'] does not list") from None


class _GroundTruth:
    """The annotations of ``gt``'s categories, sorted by (class, image, ignored, input order)."""

    def __init__(self, annotations: Sequence[dict[str, Any]], images: _Images, cat_ids: list[int]) -> None:
        code = {c: k for k, c in enumerate(cat_ids)}
        anns = [a for a in annotations if int(a["category_id"]) in code]
        try:
            ann_id = np.fromiter((int(a["id"]) for a in anns), dtype=np.int64, count=len(anns))
        except KeyError:
            raise ValueError("a ground-truth annotation has no 'id'") from None
        image_rank = images.ranks((a["image_id"] for a in anns), "ground-truth annotations")
        cat = np.fromiter((code[int(a["category_id"])] for a in anns), dtype=np.int64, count=len(anns))
        crowd = np.fromiter((bool(a.get("iscrowd", 0)) for a in anns), dtype=bool, count=len(anns))
        area = np.fromiter((float(a.get("area", 0.0)) for a in anns), dtype=np.float64, count=len(anns))
        ignored = crowd | (area < _AREA_ALL[0]) | (area > _AREA_ALL[1])
        order = np.lexsort((np.arange(len(anns)), ignored, image_rank, cat))
        self.anns = [anns[i] for i in order]
        self.ann_id, self.image_rank, self.cat = ann_id[order], image_rank[order], cat[order]
        self.crowd, self.ignored = crowd[order], ignored[order]
        self.group = self.cat * max(images.count, 1) + self.image_rank  # sorted, as the rows are


class _Detections:
    """The results of ``gt``'s categories COCO evaluates (the ``MAX_DETECTIONS`` best of each image and
    class), sorted by (class, image, score descending, input order); ``rank`` is the place in its group."""

    def __init__(self, results: Sequence[dict[str, Any]], images: _Images, cat_ids: list[int], iou_type: str
                 ) -> None:
        # loadRes refuses results on images the ground truth does not list, whatever their class.
        all_ranks = images.ranks((r["image_id"] for r in results), "results")
        code = {c: k for k, c in enumerate(cat_ids)}
        # loadRes reads the first result to choose how all are read: with a box (after bbox scoring has
        # dropped the masks), a detection's area is its box's and a missing mask is the box's polygon.
        first_box = results[0].get("bbox") if results else None
        self.from_boxes = first_box is not None and len(first_box) > 0
        if iou_type == "bbox" and results and not self.from_boxes:
            raise ValueError("bbox matching needs a 'bbox' in every result; the first has none")
        all_cats = np.fromiter((code.get(int(r["category_id"]), -1) for r in results), dtype=np.int64,
                               count=len(results))
        ours = np.flatnonzero(all_cats >= 0)  # results of other categories are not evaluated
        dets = [results[i] for i in ours.tolist()]
        n = len(dets)
        image_rank, cat = all_ranks[ours], all_cats[ours]
        try:
            score = np.fromiter((float(r["score"]) for r in dets), dtype=np.float64, count=n)
        except KeyError:
            raise ValueError("a result has no 'score'") from None
        boxes = _boxes(dets, "results") if self.from_boxes else np.zeros((n, 4))
        order = np.lexsort((np.arange(n), -score, image_rank, cat))
        group = (cat * max(images.count, 1) + image_rank)[order]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if n else np.zeros(0, dtype=np.int64)
        rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        kept = order[rank < MAX_DETECTIONS]
        self.results, self.kept = dets, kept  # the kept detections' dicts, for their masks
        self.group, self.rank = group[rank < MAX_DETECTIONS], rank[rank < MAX_DETECTIONS]
        self.image_rank, self.cat, self.score, self.boxes = image_rank[kept], cat[kept], score[kept], boxes[kept]
        area = self.boxes[:, 2] * self.boxes[:, 3]  # loadRes' area for boxes; a mask's area is always in range
        self.area_out = (area < _AREA_ALL[0]) | (area > _AREA_ALL[1])


def _boxes(items: Sequence[dict[str, Any]], what: str) -> np.ndarray:
    if not items:
        return np.zeros((0, 4))
    try:
        boxes = np.array([item["bbox"] for item in items], dtype=np.float64).reshape(len(items), -1)
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"{what}: every 'bbox' must be [x, y, width, height]") from None
    if boxes.shape[1] != 4:
        raise ValueError(f"{what}: every 'bbox' must be [x, y, width, height]")
    return boxes


def _match(truth: _GroundTruth, dets: _Detections, iou_type: str, images: _Images) -> np.ndarray:
    """(detections, T): the sorted ground-truth index each detection takes at each threshold, -1 none."""
    det_match = np.full((dets.rank.size, len(_THRESHOLDS)), -1, dtype=np.int64)
    pair_det, pair_gt, pair_iou = _pairs(truth, dets, iou_type, images)
    if pair_det.size == 0:
        return det_match
    # A detection's preference among its pairs does not depend on the threshold: a non-ignored ground
    # truth first, then the higher IoU, then the later one (pycocotools' scan keeps the last of equal
    # IoUs). At each threshold it takes the first pair it still may. Pairs of the same rank come from
    # different (image, class) groups, so one rank is matched at once for every group.
    order = np.lexsort((-pair_gt, -pair_iou, truth.ignored[pair_gt], pair_det, dets.rank[pair_det]))
    pair_det, pair_gt, pair_iou = pair_det[order], pair_gt[order], pair_iou[order]
    rank_bounds = np.searchsorted(dets.rank[pair_det], np.arange(MAX_DETECTIONS + 1))
    taken = np.zeros((truth.crowd.size, len(_THRESHOLDS)), dtype=bool)
    for k in range(MAX_DETECTIONS):
        lo, hi = rank_bounds[k], rank_bounds[k + 1]
        if lo == hi:
            continue
        gt_k, det_k = pair_gt[lo:hi], pair_det[lo:hi]
        may = (pair_iou[lo:hi, None] >= _THRESHOLDS[None, :]) & (~taken[gt_k] | truth.crowd[gt_k, None])
        size = hi - lo
        first_of = np.flatnonzero(np.r_[True, det_k[1:] != det_k[:-1]])  # each detection's pairs
        first = np.minimum.reduceat(np.where(may, np.arange(size)[:, None], size), first_of, axis=0)
        seg, t = np.nonzero(first < size)
        took = gt_k[first[seg, t]]
        det_match[det_k[first_of[seg]], t] = took
        taken[took, t] = True
    return det_match


def _pairs(truth: _GroundTruth, dets: _Detections, iou_type: str, images: _Images
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (detection, ground truth) pair of one (image, class) whose IoU reaches the lowest threshold."""
    gt_start = np.searchsorted(truth.group, dets.group, side="left")
    gt_count = np.searchsorted(truth.group, dets.group, side="right") - gt_start
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if iou_type == "bbox":
        gt_boxes = _boxes(truth.anns, "ground truth")
        ends = np.cumsum(gt_count)
        lo = 0
        while lo < gt_count.size:  # blocks of detections with at most _PAIR_BLOCK pairs (one detection's at least)
            hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + _PAIR_BLOCK, side="right")))
            counts = gt_count[lo:hi]
            det = np.repeat(np.arange(lo, hi), counts)
            offsets = np.arange(det.size) - np.repeat(np.cumsum(counts) - counts, counts)
            gt = np.repeat(gt_start[lo:hi], counts) + offsets
            iou = _box_iou(dets.boxes[det], gt_boxes[gt], truth.crowd[gt])
            keep = iou >= _THRESHOLDS[0]
            found.append((det[keep], gt[keep], iou[keep]))
            lo = hi
    else:
        found = list(_mask_pairs(truth, dets, images, gt_start, gt_count))
    if not found:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    det, gt, iou = (np.concatenate(parts) for parts in zip(*found, strict=True))
    return det, gt, iou


def _box_iou(d: np.ndarray, g: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """pycocotools' ``bbIou`` for aligned rows of boxes, operation for operation (so equal to the last bit):
    intersection over union, over the detection's own area for a crowd region."""
    w = np.minimum(d[:, 2] + d[:, 0], g[:, 2] + g[:, 0]) - np.maximum(d[:, 0], g[:, 0])
    h = np.minimum(d[:, 3] + d[:, 1], g[:, 3] + g[:, 1]) - np.maximum(d[:, 1], g[:, 1])
    inter = w * h
    det_area = d[:, 2] * d[:, 3]
    union = np.where(crowd, det_area, det_area + g[:, 2] * g[:, 3] - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(~(w <= 0) & ~(h <= 0), inter / union, 0.0)


def _mask_pairs(truth: _GroundTruth, dets: _Detections, images: _Images, gt_start: np.ndarray,
                gt_count: np.ndarray) -> Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`_pairs` for masks: ``pycocotools.mask.iou`` on each (image, class) that has both."""
    from pycocotools import mask as mask_utils

    with_gt = np.flatnonzero(gt_count > 0)
    if with_gt.size == 0:
        return
    # Detections of a group are consecutive: split the ones with ground truth where the group changes.
    splits = np.flatnonzero(np.diff(dets.group[with_gt]) != 0) + 1
    for block in np.split(with_gt, splits):
        start, count = int(gt_start[block[0]]), int(gt_count[block[0]])
        gts = range(start, start + count)
        image = images.sorted_entries[int(truth.image_rank[start])]
        size = (int(image["height"]), int(image["width"]))
        det_masks = [_rle(_det_segmentation(dets.results[dets.kept[i]], dets.from_boxes), size, mask_utils)
                     for i in block]
        gt_masks = [_rle(_gt_segmentation(truth.anns[g]), size, mask_utils) for g in gts]
        iou = np.asarray(mask_utils.iou(det_masks, gt_masks, [int(c) for c in truth.crowd[start:start + count]]),
                         dtype=np.float64).reshape(block.size, count)
        d, g = np.nonzero(iou >= _THRESHOLDS[0])
        yield block[d], start + g, iou[d, g]


def _det_segmentation(det: dict[str, Any], from_boxes: bool) -> Any:
    if "segmentation" in det:
        return det["segmentation"]
    if from_boxes:  # loadRes gives a boxed result without a mask its box as a polygon
        x, y, w, h = det["bbox"]
        return [[x, y, x, y + h, x + w, y + h, x + w, y]]
    raise ValueError("segm matching needs a 'segmentation' (or a 'bbox') in every result")


def _gt_segmentation(ann: dict[str, Any]) -> Any:
    if "segmentation" not in ann:
        raise ValueError(f"segm matching needs a 'segmentation' in every annotation; annotation {ann.get('id')} "
                         "has none")
    return ann["segmentation"]


def _rle(segmentation: Any, size: tuple[int, int], mask_utils: Any) -> Any:
    """pycocotools' ``COCO.annToRLE``: polygons merged into one RLE, an uncompressed RLE compressed."""
    height, width = size
    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation["counts"], list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation
