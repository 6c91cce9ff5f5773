"""COCO metrics of a model artifact on a dataset split, computed through the shared inference code.

Detections come from :func:`model_code.inference.predict` on the loaded artifact, exactly
what serving answers; metrics come from faster-coco-eval's COCOeval (a pycocotools-
compatible reimplementation; tests cross-check it against pycocotools itself).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from faster_coco_eval.core import mask as mask_utils
from PIL import Image

from d2ops_core import images as rule
from model_code.artifact import LoadedDetector
from model_code.dataset_version import DatasetError
from model_code.evaluation.scoring import (  # noqa: F401  re-exported: the evaluation's names in one place
    AREA_NAMES,
    MAX_DETECTIONS,
    STAT_NAMES,
    Evaluation,
    IouTypeScores,
    score_iou_type,
    score_results,
)
from model_code.inference import Detections, image_to_tensor, predict


def detections_to_coco(det: Detections, image_id: int, category_ids: list[int]) -> list[dict[str, Any]]:
    boxes = det.boxes.numpy().astype(float)
    scores = det.scores.numpy().astype(float)
    labels = det.labels.numpy()
    rles = None
    if det.masks is not None:
        binary = np.asfortranarray(det.masks.numpy().astype(np.uint8).transpose(1, 2, 0))
        rles = mask_utils.encode(binary)
    out = []
    for i in range(len(det)):
        x0, y0, x1, y1 = boxes[i]
        entry: dict[str, Any] = {"image_id": image_id, "category_id": category_ids[int(labels[i])],
                                 "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                                 "score": round(float(scores[i]), 5)}
        if rles is not None:
            rle = rles[i]
            entry["segmentation"] = {"size": list(rle["size"]),
                                     "counts": rle["counts"].decode() if isinstance(rle["counts"], bytes)
                                     else rle["counts"]}
        out.append(entry)
    return out


def iterate_images(coco: dict[str, Any], images_dir: Path) -> Iterator[tuple[dict[str, Any], Image.Image]]:
    for info in coco["images"]:
        path = images_dir / info["file_name"]
        try:
            # The one image rule: same formats, limits and EXIF orientation as training and serving.
            image = rule.load_rgb(path, str(path))
        except (rule.ImageRejected, OSError) as exc:
            raise DatasetError(f"{path}: unreadable image (image id {info['id']}): {exc}") from exc
        yield info, image


def predict_split(detector: LoadedDetector, coco: dict[str, Any], images_dir: Path, *, batch_size: int = 4,
                  progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """COCO result dicts for every image of ``coco`` (a COCO instances document)."""
    results: list[dict[str, Any]] = []
    batch: list[tuple[int, Any]] = []
    total, done = len(coco["images"]), 0

    def flush() -> None:
        nonlocal done
        dets = predict(detector, [t for _, t in batch], score_threshold=0.0, max_detections=MAX_DETECTIONS)
        for (image_id, _), det in zip(batch, dets, strict=True):
            results.extend(detections_to_coco(det, image_id, detector.metadata.category_ids))
        done += len(batch)
        batch.clear()
        if progress:
            progress(done, total)

    for info, image in iterate_images(coco, images_dir):
        batch.append((int(info["id"]), image_to_tensor(image)))
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return results


def evaluate_detector(detector: LoadedDetector, gt: dict[str, Any], images_dir: Path, *, batch_size: int = 4,
                      progress: Callable[[int, int], None] | None = None) -> Evaluation:
    """bbox (and segm when the artifact segments) metrics of ``detector`` on the split ``gt``."""
    if not gt["images"]:
        raise DatasetError("the val split has no images to evaluate on")
    results = predict_split(detector, gt, images_dir, batch_size=batch_size, progress=progress)
    return score_results(gt, results, ["bbox"] + (["segm"] if detector.metadata.has_masks else []))


def print_progress(prefix: str) -> Callable[[int, int], None]:
    last = [0]

    def report(done: int, total: int) -> None:
        if done == total or done - last[0] >= 50:
            last[0] = done
            print(f"{prefix}: {done}/{total} images", file=sys.stderr, flush=True)
    return report
