"""Inference shared by evaluation and serving: image in, filtered detections out.

Both paths call :func:`predict` on a :class:`~model_code.artifact.LoadedDetector`, so the
numbers in an evaluation report describe exactly what the endpoint will answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from model_code.artifact import LoadedDetector

MASK_THRESHOLD = 0.5


@dataclass
class Detections:
    """One image's detections, in its original pixel coordinates."""

    boxes: torch.Tensor  # float32 [N, 4] xyxy
    scores: torch.Tensor  # float32 [N], descending
    labels: torch.Tensor  # int64 [N], index into the artifact's class_names
    masks: torch.Tensor | None = None  # bool [N, H, W] when the model segments

    def __len__(self) -> int:
        return int(self.scores.shape[0])


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """A PIL image as the detector's input: uint8 [3, H, W], RGB."""
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def _check_image(index: int, image: torch.Tensor) -> None:
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(
            f"image {index}: expected a uint8 tensor of shape [3, H, W], got {image.dtype} {tuple(image.shape)}"
        )
    if image.shape[1] == 0 or image.shape[2] == 0:
        raise ValueError(f"image {index}: has zero size {tuple(image.shape)}")


def predict(
    detector: LoadedDetector,
    images: Sequence[torch.Tensor],
    *,
    score_threshold: float = 0.0,
    max_detections: int = 100,
) -> list[Detections]:
    """Run the exported detector on a batch of images of any sizes."""
    if not 0.0 <= score_threshold <= 1.0:
        raise ValueError(f"score_threshold must be within [0, 1], got {score_threshold}")
    if max_detections < 1:
        raise ValueError(f"max_detections must be at least 1, got {max_detections}")
    for i, image in enumerate(images):
        _check_image(i, image)
    if not images:
        return []
    with torch.inference_mode():
        raw = detector.module(list(images))
    results = []
    for out in raw:
        keep = out["scores"] >= score_threshold
        order = torch.argsort(out["scores"][keep], descending=True)[:max_detections]
        idx = torch.nonzero(keep).flatten()[order]
        masks = None
        if detector.metadata.has_masks and "masks" in out:
            masks = out["masks"][idx] >= MASK_THRESHOLD
        results.append(Detections(boxes=out["boxes"][idx].float(), scores=out["scores"][idx].float(),
                                  labels=out["labels"][idx].long(), masks=masks))
    return results
