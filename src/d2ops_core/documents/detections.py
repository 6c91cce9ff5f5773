"""The endpoint's answer: detections as ``POST /invocations`` returns them (docs/serving.md).

Written by the serving code (``model_code.serving.response`` builds it and dumps it); read by
the smoke test (``smoke_test_endpoint``), ``d2ops predict`` and API clients, all through this
one model.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RleMask(BaseModel):
    """A COCO RLE (pycocotools.mask.encode) with ``counts`` as an ASCII string."""

    size: list[int] = Field(min_length=2, max_length=2)  # [height, width]
    counts: str


class Detection(BaseModel):
    """One detection as the endpoint returns it (xyxy box in original pixels)."""

    # Readers accept fields a newer endpoint may add; the writer only sets the declared ones.
    model_config = ConfigDict(extra="allow")

    box: list[float] = Field(min_length=4, max_length=4)
    score: float = Field(ge=0, le=1)
    class_id: int = Field(ge=0)
    class_name: str = Field(min_length=1)
    # The writer leaves the key out (exclude_none) unless the request asked for masks.
    mask: RleMask | None = Field(default=None, description="only with masks=true: COCO RLE, counts as ASCII")

    @field_validator("box")
    @classmethod
    def _xyxy(cls, box: list[float]) -> list[float]:
        if not all(math.isfinite(v) for v in box):
            raise ValueError(f"box {box} has a non-finite coordinate")
        if box[0] > box[2] or box[1] > box[3]:
            raise ValueError(f"box {box} is not x1 <= x2, y1 <= y2")
        return box


class ImageSize(BaseModel):
    """The upright image the boxes refer to (EXIF orientation applied), in pixels."""

    width: int = Field(gt=0)
    height: int = Field(gt=0)


class AppliedThresholds(BaseModel):
    """Which score thresholds decided this answer."""

    model_config = ConfigDict(extra="allow")

    source: Literal["model", "request"] = Field(
        description="model: each class's own (the artifact's score_thresholds, chosen on val; 0.5 where it has "
                    "none); request: the request's score_threshold, for every class")
    by_class: dict[str, float] = Field(description="the threshold of each class present in detections")


class InvocationResponse(BaseModel):
    # Field order is the JSON's key order (the writer dumps the model): detections, image, score_thresholds.
    detections: list[Detection]
    image: ImageSize = Field(description="the upright image the boxes are in")
    # Optional for readers: endpoints before issue 22 did not send it.
    score_thresholds: AppliedThresholds | None = Field(default=None, description="the thresholds applied")
