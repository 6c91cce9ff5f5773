"""pycocotools' own per-image matching read into the gate's ``ClassMatches``: the reference for
:mod:`model_code.evaluation.matching`.

``make bench-eval`` times it as the matching step's baseline (it is what the gate ran before), and
tests/unit/test_gate_matching.py checks the fast matching against it. It is pycocotools' pure-Python
``COCOeval.evaluate()`` (``evaluateImg`` per image and class: area "all", maxDets 100, IoU .50:.05:.95),
its ``evalImgs`` read the way ``COCOeval.accumulate`` reads them: per class, images in sorted id
order, each image's detections (already in score order, cut at maxDets) concatenated, then a stable
sort on -score. Slow on purpose: nothing here is the product's code path.
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

import numpy as np

from model_code.evaluation.bootstrap import IOU_THRESHOLDS, MAX_DETECTIONS, ClassMatches


def pycocotools_matches(gt: dict[str, Any], results: list[dict[str, Any]], iou_type: str
                        ) -> dict[str, ClassMatches]:
    """Class name -> pycocotools' matches of ``results`` on ``gt`` (images indexed in ``gt["images"]`` order;
    every category of ``gt``; bbox matching without the results' masks)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    index = {int(img["id"]): i for i, img in enumerate(gt["images"])}
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    wanted = [copy.deepcopy(r) if iou_type == "segm" else {k: v for k, v in r.items() if k != "segmentation"}
              for r in results]
    if not wanted and gt["images"]:
        # loadRes needs a result: one of a category outside gt's, which the evaluation never looks at,
        # so that evalImgs still say which ground truth COCO ignores.
        wanted = [{"image_id": gt["images"][0]["id"], "category_id": max(names, default=0) + 1,
                   "bbox": [0.0, 0.0, 1.0, 1.0], "segmentation": [[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]],
                   "score": 0.0}]
    per_class: dict[int, list[dict[str, Any]]] = {}
    if wanted:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco_gt = COCO()
            coco_gt.dataset = copy.deepcopy(gt)
            coco_gt.createIndex()
            evaluator = COCOeval(coco_gt, coco_gt.loadRes(wanted), iouType=iou_type)
            evaluator.params.imgIds = sorted(index)
            evaluator.params.catIds = sorted(names)
            evaluator.params.areaRng, evaluator.params.areaRngLbl = [evaluator.params.areaRng[0]], ["all"]
            evaluator.params.maxDets = [MAX_DETECTIONS]
            evaluator.evaluate()
        if not np.array_equal(evaluator.params.iouThrs, IOU_THRESHOLDS):
            raise RuntimeError("pycocotools' IoU thresholds are not .50:.05:.95")
        for entry in evaluator.evalImgs:
            if entry is not None:
                per_class.setdefault(int(entry["category_id"]), []).append(entry)
    t = len(IOU_THRESHOLDS)
    matches: dict[str, ClassMatches] = {}
    for cat_id, name in names.items():
        entries = sorted(per_class.get(cat_id, []), key=lambda e: int(e["image_id"]))  # evalImgs' order
        gt_count = np.zeros(len(index), dtype=np.int64)
        for e in entries:
            gt_count[index[int(e["image_id"])]] = int(np.count_nonzero(~np.asarray(e["gtIgnore"], dtype=bool)))
        scores = [np.asarray(e["dtScores"], dtype=float)[:MAX_DETECTIONS] for e in entries]
        if any(s.size for s in scores):
            order = np.argsort(-np.concatenate(scores), kind="mergesort")
            dt_matches = np.concatenate([np.asarray(e["dtMatches"]).reshape(t, -1) for e in entries], axis=1)
            ignored = np.concatenate([np.asarray(e["dtIgnore"]).reshape(t, -1) for e in entries], axis=1)
            m, ig = dt_matches[:, order], ignored[:, order].astype(bool)
            det_image = np.concatenate([np.full(s.size, index[int(e["image_id"])], dtype=np.int64)
                                        for e, s in zip(entries, scores, strict=True)])[order]
        else:
            m, ig, det_image = np.zeros((t, 0)), np.zeros((t, 0), dtype=bool), np.zeros(0, dtype=np.int64)
        # accumulate: tps = dtm & ~dtIg, with dtm the matched ground truth's id (the gate's rule: id > 0).
        matches[name] = ClassMatches(gt_per_image=gt_count, det_image=det_image, det_tp=(m > 0) & ~ig,
                                     det_ignore=ig)
    return matches
