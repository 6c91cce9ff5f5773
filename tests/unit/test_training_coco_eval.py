"""Our COCO numbers (faster-coco-eval through model_code.evaluation) against pycocotools' reference COCOeval."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from pycocotools import mask as pmask
from pycocotools.coco import COCO as RefCOCO
from pycocotools.cocoeval import COCOeval as RefCOCOeval

from d2ops import synth
from model_code.dataset_version import read_coco
from model_code.evaluation.coco import STAT_NAMES, detections_to_coco, score_iou_type
from model_code.inference import Detections


@pytest.fixture(scope="module")
def gt(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("ds")
    synth.generate(root, images=40, size=96, seed=3, val_fraction=0.5)
    doc = read_coco(root / "annotations" / "val.json")
    # non-contiguous category ids, as real datasets have
    remap = {1: 4, 2: 9, 3: 17}
    for c in doc["categories"]:
        c["id"] = remap[c["id"]]
    for a in doc["annotations"]:
        a["category_id"] = remap[a["category_id"]]
    return doc


def noisy_detections(gt: dict, seed: int) -> list[dict]:
    """Jittered true boxes, some with the wrong class, plus random false positives, with RLE masks."""
    rng = random.Random(seed)
    cats = [c["id"] for c in gt["categories"]]
    out = []
    sizes = {img["id"]: (img["height"], img["width"]) for img in gt["images"]}
    for ann in gt["annotations"]:
        if rng.random() < 0.15:
            continue  # missed
        x, y, w, h = ann["bbox"]
        j = [rng.uniform(-0.15, 0.15) * s for s in (w, h, w, h)]
        box = [max(0.0, x + j[0]), max(0.0, y + j[1]), w + j[2], h + j[3]]
        cat = ann["category_id"] if rng.random() < 0.85 else rng.choice(cats)
        out.append({"image_id": ann["image_id"], "category_id": cat, "bbox": box, "score": rng.uniform(0.3, 1.0)})
    for img in gt["images"]:
        for _ in range(rng.randint(0, 3)):
            x, y = rng.uniform(0, 60), rng.uniform(0, 60)
            out.append({"image_id": img["id"], "category_id": rng.choice(cats),
                        "bbox": [x, y, rng.uniform(5, 30), rng.uniform(5, 30)], "score": rng.uniform(0.0, 0.6)})
    for det in out:
        h, w = sizes[det["image_id"]]
        x, y, bw, bh = det["bbox"]
        m = np.zeros((h, w), dtype=np.uint8, order="F")
        m[int(y):int(y + bh), int(x):int(x + bw)] = 1
        rle = pmask.encode(m)
        det["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode()}
    return out


def reference(gt: dict, results: list[dict], iou_type: str) -> tuple[list[float], dict[int, float]]:
    coco_gt = RefCOCO()
    coco_gt.dataset = copy.deepcopy(gt)
    coco_gt.createIndex()
    dets = [{k: v for k, v in r.items() if not (iou_type == "bbox" and k == "segmentation")} for r in results]
    coco_dt = coco_gt.loadRes(copy.deepcopy(dets))
    ev = RefCOCOeval(coco_gt, coco_dt, iou_type)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    per_class = {}
    for k, cat in enumerate(ev.params.catIds):
        p = ev.eval["precision"][:, :, k, 0, -1]
        per_class[cat] = float(p[p > -1].mean())
    return [float(s) for s in ev.stats[:6]], per_class


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_pycocotools(gt: dict, iou_type: str, seed: int) -> None:
    results = noisy_detections(gt, seed)
    names = {c["id"]: c["name"] for c in gt["categories"]}
    ours = score_iou_type(gt, [{k: v for k, v in r.items() if not (iou_type == "bbox" and k == "segmentation")}
                               for r in results], iou_type, names)
    stats, per_class = reference(gt, results, iou_type)
    assert 0.05 < stats[0] < 0.95  # a non-trivial operating point, or the comparison proves little
    for name, value in zip(STAT_NAMES, stats, strict=True):
        key = f"{iou_type}_{name}"
        if value < 0:
            assert key not in ours.metrics  # undefined (no GT in that area range): left out, not -1
        else:
            assert ours.metrics[key] == pytest.approx(value, abs=1e-6), key
    for cat, value in per_class.items():
        assert ours.per_class[names[cat]] == pytest.approx(value, abs=1e-6)
    curve = ours.pr_curves[names[gt["categories"][0]["id"]]]["iou50"]
    assert len(curve) == 101


def test_no_detections_is_zero_ap(gt: dict) -> None:
    ours = score_iou_type(gt, [], "bbox", {c["id"]: c["name"] for c in gt["categories"]})
    assert ours.metrics["bbox_AP"] == 0.0 and set(ours.per_class.values()) == {0.0}


def test_detections_map_labels_to_dataset_ids_and_encode_masks() -> None:
    masks = torch.zeros(2, 10, 20, dtype=torch.bool)
    masks[0, 2:5, 3:9] = True
    det = Detections(boxes=torch.tensor([[3.0, 2.0, 9.0, 5.0], [0.0, 0.0, 20.0, 10.0]]),
                     scores=torch.tensor([0.9, 0.2]), labels=torch.tensor([1, 0]), masks=masks)
    out = detections_to_coco(det, image_id=7, category_ids=[4, 9])
    assert [o["category_id"] for o in out] == [9, 4]
    assert out[0]["bbox"] == [3.0, 2.0, 6.0, 3.0] and out[0]["image_id"] == 7
    decoded = pmask.decode({"size": out[0]["segmentation"]["size"], "counts": out[0]["segmentation"]["counts"]})
    assert decoded.sum() == 18 and decoded[2:5, 3:9].all()
