"""The gate's fast COCO matching (model_code.evaluation.matching) against pycocotools' own.

The reference is pycocotools' ``COCOeval.evaluate()`` read into ClassMatches
(d2ops.bench.reference_matching, also bench-eval's baseline), so these tests do not depend on the
old matching in model_code.evaluation.bootstrap. Random splits on a coarse integer grid make equal
IoUs, IoUs exactly at a threshold, equal scores and repeated boxes common.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from d2ops.bench.reference_matching import pycocotools_matches
from model_code.evaluation.bootstrap import IOU_THRESHOLDS, ClassMatches, weighted_ap
from model_code.evaluation.matching import matches_from_coco

HEIGHT, WIDTH = 24, 32
CATEGORIES = [{"id": 3, "name": "c"}, {"id": 1, "name": "a"}, {"id": 7, "name": "never detected"}]
UNKNOWN_CATEGORY = 5  # results may name a class gt does not have: COCO does not evaluate them
SCORES = st.sampled_from([0.25, 0.5, 0.75]) | st.floats(0.0, 1.0)  # equal scores often
BOX = st.tuples(st.integers(0, 24), st.integers(0, 16), st.integers(1, 12), st.integers(1, 12))


def assert_same(ours: dict[str, ClassMatches], reference: dict[str, ClassMatches]) -> None:
    assert list(ours) == list(reference)
    for name in reference:
        for field in ("gt_per_image", "det_image", "det_tp", "det_ignore"):
            a, b = getattr(ours[name], field), getattr(reference[name], field)
            assert a.dtype == b.dtype and a.shape == b.shape, (name, field, a.shape, b.shape)
            assert np.array_equal(a, b), (name, field, a, b)


def mask(box: tuple[int, int, int, int], kind: str, rng: random.Random) -> Any:
    """The box as a mask: a polygon (a triangle, so not the box), or an RLE compressed or not (notched)."""
    x, y, w, h = box
    if kind == "polygon":
        return [[x, y, x + w, y, x + rng.uniform(0, w), y + h]]
    m = np.zeros((HEIGHT, WIDTH), dtype=np.uint8, order="F")
    m[y:y + h, x:x + w] = 1
    m[y:y + h // 2, x:x + w // 2] = 0
    rle = mask_utils.encode(m)
    if kind == "rle":
        return {"size": [HEIGHT, WIDTH], "counts": rle["counts"].decode()}
    flat = m.flatten(order="F")  # uncompressed RLE: run lengths starting with zeros
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.r_[0, changes, flat.size])
    return {"size": [HEIGHT, WIDTH], "counts": ([0] if flat[0] else []) + runs.tolist()}


@st.composite
def splits(draw: st.DrawFn, *, masks: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Ground truth (crowd regions, images without GT, ids in any order, maybe an annotation id 0, maybe an
    area COCO's area "all" leaves out) and detections (jittered copies and random boxes, equal scores, a
    class never detected, one of another class, maybe more than 100 of one class on one image)."""
    image_ids = draw(st.lists(st.integers(1, 10_000), min_size=1, max_size=5, unique=True))
    images = [{"id": i, "width": WIDTH, "height": HEIGHT, "file_name": f"{i}.png"} for i in image_ids]
    first_id = draw(st.sampled_from([0, 1, 100]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    with_boxes = not masks or draw(st.booleans())  # segm results with boxes or masks only (two loadRes paths)
    anns: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    for img in images:
        for box, cat, crowd, odd_area in draw(st.lists(st.tuples(BOX, st.sampled_from([1, 3]), st.booleans(),
                                                                  st.integers(0, 19)), max_size=6)):
            crowd = crowd and draw(st.integers(0, 3)) == 0
            area = {0: -1.0, 1: 1e11}.get(odd_area, float(box[2] * box[3]))  # outside area "all": ignored
            ann = {"id": first_id + len(anns), "image_id": img["id"], "category_id": cat, "bbox": list(box),
                   "area": area, "iscrowd": int(crowd)}
            if masks:
                ann["segmentation"] = mask(box, "uncompressed" if crowd else rng.choice(["polygon", "rle"]), rng)
            anns.append(ann)
        own = [a for a in anns if a["image_id"] == img["id"]]
        for copy_of, jitter, cat, score in draw(st.lists(st.tuples(st.integers(0, 9), BOX,
                                                                    st.sampled_from([1, 3, UNKNOWN_CATEGORY]),
                                                                    SCORES), max_size=8)):
            if own and copy_of < len(own) * 2:  # a copy of a GT box, moved a little (often an equal IoU)
                x, y, w, h = own[copy_of % len(own)]["bbox"]
                box = (x + jitter[0] % 3 - 1, y + jitter[1] % 3 - 1, max(1, w + jitter[2] % 3 - 1), h)
                cat = own[copy_of % len(own)]["category_id"] if cat != UNKNOWN_CATEGORY else cat
            else:
                box = jitter
            dets.append({"image_id": img["id"], "category_id": cat, "bbox": list(box), "score": score})
    if draw(st.integers(0, 3)) == 0:  # past maxDets: COCO keeps the 100 best of the image and class
        image, cat = rng.choice(images), rng.choice([1, 3])
        for _ in range(rng.randint(101, 130)):
            box = (rng.randint(0, 24), rng.randint(0, 16), rng.randint(1, 12), rng.randint(1, 12))
            dets.append({"image_id": image["id"], "category_id": cat, "bbox": list(box),
                         "score": rng.choice([0.1, 0.2, rng.random()])})
    if draw(st.integers(0, 9)) == 0 and dets:  # a box of negative width: its area is outside area "all"
        dets[0]["bbox"][2] = -dets[0]["bbox"][2]
    rng.shuffle(dets)
    for det in dets:
        if masks:
            det["segmentation"] = mask(tuple(det["bbox"]), rng.choice(["polygon", "rle"]) if with_boxes else "rle",
                                       rng)
            if not with_boxes:
                del det["bbox"]
        elif rng.random() < 0.3:  # bbox matching must not look at masks
            det["segmentation"] = [[0, 0, 1, 0, 1, 1]]
    return {"images": images, "annotations": anns, "categories": copy.deepcopy(CATEGORIES)}, dets


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(split=splits())
def test_bbox_matches_are_pycocotools_matches(split: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    # Catches: the first of equal IoUs taken (pycocotools keeps the last), a crowd region taken only once,
    # a crowd preferred to a worse non-crowd match, no maxDets cut or an unstable score sort, an id-0 GT
    # read as a match, the area "all" check left out, images in id order instead of gt["images"] order.
    gt, dets = split
    before = copy.deepcopy(split)
    assert_same(matches_from_coco(gt, dets, "bbox"), pycocotools_matches(gt, dets, "bbox"))
    assert (gt, dets) == before  # neither argument changed


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(split=splits(masks=True))
def test_segm_matches_are_pycocotools_matches(split: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    # Catches: masks matched as boxes, polygons or uncompressed RLE not converted as COCO does, the crowd
    # IoU (over the detection's area) not used for masks.
    gt, dets = split
    before = copy.deepcopy(split)
    assert_same(matches_from_coco(gt, dets, "segm"), pycocotools_matches(gt, dets, "segm"))
    assert (gt, dets) == before


def cocoeval_per_class_ap(gt: dict[str, Any], dets: list[dict[str, Any]], iou_type: str) -> dict[str, float]:
    """pycocotools' COCOeval (evaluate, accumulate) per-class AP at area "all", maxDets 100; NaN: no GT."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        wanted = [{k: v for k, v in d.items() if k != "segmentation" or iou_type == "segm"} for d in dets]
        evaluator = COCOeval(coco_gt, coco_gt.loadRes(copy.deepcopy(wanted)), iouType=iou_type)
        evaluator.params.imgIds = sorted(img["id"] for img in gt["images"])
        evaluator.evaluate()
        evaluator.accumulate()
    precision = evaluator.eval["precision"][:, :, :, 0, -1]  # (T, R, K) at area "all", maxDets 100
    out = {}
    for k, cat_id in enumerate(evaluator.params.catIds):
        values = precision[:, :, k]
        name = next(c["name"] for c in gt["categories"] if c["id"] == cat_id)
        out[name] = float(np.mean(values[values > -1])) if (values > -1).any() else float("nan")
    return out


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(split=splits(), segm=st.booleans())
def test_unit_weights_give_cocoevals_per_class_ap(split: tuple[dict[str, Any], list[dict[str, Any]]],
                                                  segm: bool) -> None:
    # The matches are what the gate's AP is computed from: with every image once it is COCO's AP.
    # Catches: gt_per_image counting ignored GT, ignored detections counted as false positives, the
    # detections in another order than accumulate's.
    gt, dets = split
    if not dets:
        return  # loadRes needs a result
    if segm:  # the same boxes as masks
        gt = copy.deepcopy(gt)
        for a in gt["annotations"]:
            x, y, w, h = a["bbox"]
            a["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
        dets = [{**d, "segmentation": [[d["bbox"][0], d["bbox"][1], d["bbox"][0] + d["bbox"][2], d["bbox"][1],
                                        d["bbox"][0] + d["bbox"][2], d["bbox"][1] + d["bbox"][3]]]}
                for d in dets]
    iou_type = "segm" if segm else "bbox"
    ours = matches_from_coco(gt, dets, iou_type)
    ones = np.ones((1, len(gt["images"])))
    for name, ap in cocoeval_per_class_ap(gt, dets, iou_type).items():
        got = float(weighted_ap(ours[name], ones)[0])
        assert (np.isnan(got) and np.isnan(ap)) or got == pytest.approx(ap, abs=1e-12), name


def one_image(anns: list[dict[str, Any]], dets: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    gt = {"images": [{"id": 1, "width": 100, "height": 100}], "categories": [{"id": 1, "name": "a"}],
          "annotations": [{"id": k + 1, "image_id": 1, "category_id": 1, "area": b[2] * b[3], "iscrowd": crowd,
                           "bbox": b} for k, (b, crowd) in enumerate(anns)]}
    return gt, [{"image_id": 1, "category_id": 1, "bbox": b, "score": s} for b, s in dets]


def test_of_equal_ious_the_last_ground_truth_is_taken() -> None:
    # The first detection overlaps both GTs at IoU 0.6 exactly; pycocotools' scan keeps the last, B, which
    # leaves A to the second detection (IoU 1 with A, 1/3 with B). Taking the first would leave it none.
    gt, dets = one_image([([0, 0, 10, 10], 0), ([5, 0, 10, 10], 0)], [([2.5, 0, 10, 10], 0.9), ([0, 0, 10, 10], 0.8)])
    tp = matches_from_coco(gt, dets, "bbox")["a"].det_tp
    at_06 = IOU_THRESHOLDS <= 0.6 + 1e-9
    assert tp[at_06].all() and not tp[~at_06, 0].any() and tp[~at_06, 1].all()


def test_a_crowd_region_is_taken_again_and_a_real_object_preferred() -> None:
    # Two detections on a crowd region are both ignored (neither TP nor FP); a third, on a real object at
    # IoU 0.6 and inside the crowd region, takes the object up to 0.6 and is ignored above it.
    gt, dets = one_image([([0, 0, 50, 50], 1), ([60, 60, 10, 10], 0)],
                         [([0, 0, 20, 20], 0.9), ([5, 5, 20, 20], 0.8), ([62.5, 60, 10, 10], 0.7)])
    m = matches_from_coco(gt, dets, "bbox")["a"]
    assert m.det_ignore[:, :2].all() and not m.det_tp[:, :2].any()
    at_06 = IOU_THRESHOLDS <= 0.6 + 1e-9
    assert m.det_tp[at_06, 2].all() and not m.det_tp[~at_06, 2].any() and not m.det_ignore[:, 2].any()
    assert m.gt_per_image.tolist() == [1]


def test_every_class_is_present_and_images_keep_gt_order() -> None:
    gt = {"images": [{"id": 9, "width": 50, "height": 50}, {"id": 2, "width": 50, "height": 50}],
          "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
          "annotations": [{"id": 1, "image_id": 9, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100,
                           "iscrowd": 0}]}
    dets = [{"image_id": 2, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.5},
            {"image_id": 9, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.5}]
    matches = matches_from_coco(gt, dets, "bbox")
    assert set(matches) == {"a", "b"} and matches["b"].det_image.size == 0
    # equal scores: image 2 first (sorted ids), indexed by its place in gt["images"] (1)
    assert matches["a"].det_image.tolist() == [1, 0] and matches["a"].gt_per_image.tolist() == [1, 0]
    assert matches["a"].det_tp[:, 1].all() and not matches["a"].det_tp[:, 0].any()


@pytest.mark.parametrize(("change", "message"), [
    (lambda gt, dets: dets.append({"image_id": 404, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1.0}),
     "image id 404"),
    (lambda gt, dets: gt["annotations"][0].update(image_id=404), "image id 404"),
    (lambda gt, dets: gt["images"].append({"id": 1, "width": 5, "height": 5}), "more than once"),
    (lambda gt, dets: dets[0].pop("bbox"), "'bbox'"),
])
def test_bad_input_is_a_one_line_value_error(change: Any, message: str) -> None:
    gt, dets = one_image([([0, 0, 10, 10], 0)], [([0, 0, 10, 10], 0.5)])
    change(gt, dets)
    with pytest.raises(ValueError, match=message):
        matches_from_coco(gt, dets, "bbox")


def test_only_bbox_and_segm_are_matched() -> None:
    with pytest.raises(ValueError, match="iou_type"):
        matches_from_coco(*one_image([], []), "keypoints")
