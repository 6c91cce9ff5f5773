"""Detections -> the endpoint's JSON answer (documented with examples in docs/serving.md).

Built through the response document (d2ops_core.documents.detections) that the smoke test,
``d2ops predict`` and clients read, so the writer cannot send what its readers refuse.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from d2ops_core.documents.detections import AppliedThresholds, Detection, ImageSize, InvocationResponse, RleMask
from model_code.artifact import ArtifactMetadata
from model_code.inference import Detections
from model_code.serving.options import PredictOptions


def encode_masks(masks: np.ndarray) -> list[dict[str, Any]]:
    """bool [N, H, W] -> COCO RLE dicts ``{"size": [H, W], "counts": str}`` (JSON-safe counts)."""
    if masks.shape[0] == 0:
        return []
    rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8)))
    return [{"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")} for rle in rles]


def build_response(detections: Detections, metadata: ArtifactMetadata, options: PredictOptions,
                   width: int, height: int) -> InvocationResponse:
    """The endpoint's answer as the response document; a value its readers would refuse raises here."""
    boxes = detections.boxes.detach().cpu().tolist()
    scores = detections.scores.detach().cpu().tolist()
    labels = detections.labels.detach().cpu().tolist()
    rles: list[dict[str, Any]] | None = None
    if options.masks and detections.masks is not None:
        rles = encode_masks(detections.masks.detach().cpu().numpy())
    kept: list[tuple[int, Detection]] = []
    for i, (box, score, label) in enumerate(zip(boxes, scores, labels, strict=True)):
        if not (math.isfinite(score) and all(math.isfinite(v) for v in box)):
            continue  # NaN/inf (a model diverging on an odd image) is no detection, and no JSON has a NaN
        kept.append((label, Detection(
            box=[round(float(v), 2) for v in box], score=round(float(score), 4), class_id=metadata.category_ids[label],
            class_name=metadata.class_names[label], mask=None if rles is None else RleMask.model_validate(rles[i]))))
    return InvocationResponse(detections=[d for _, d in kept], image=ImageSize(width=width, height=height),
                              score_thresholds=applied_thresholds(metadata, options, [label for label, _ in kept]))


def applied_thresholds(metadata: ArtifactMetadata, options: PredictOptions, labels: list[int]) -> AppliedThresholds:
    """The threshold that decided each class in the answer: the request's, else the model's own."""
    request = options.score_threshold
    by_class: dict[str, float] = {}
    for label in labels:
        by_class.setdefault(metadata.class_names[label], request if request is not None
                            else metadata.score_threshold(label))
    return AppliedThresholds(source="model" if request is None else "request", by_class=by_class)

def detections_to_json(detections: Detections, metadata: ArtifactMetadata, options: PredictOptions,
                       width: int, height: int) -> dict[str, Any]:
    """The answer as a JSON-ready dict. exclude_none: a detection without a mask has no "mask" key
    (clients test ``"mask" in d``), exactly as before the document was built through the model."""
    response = build_response(detections, metadata, options, width, height)
    document: dict[str, Any] = response.model_dump(mode="json", exclude_none=True)
    return document
