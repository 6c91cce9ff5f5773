"""The endpoint's answer: detections as ``POST /invocations`` returns them (docs/serving.md).

Written by the serving code (``model_code.serving.response``); read by the smoke test
(``smoke_test_endpoint``), ``d2ops predict`` and API clients, all through this one model.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Detection(BaseModel):
    """One detection as the endpoint returns it (xyxy box in original pixels)."""

    model_config = ConfigDict(extra="allow")  # optional fields such as an RLE mask

    box: list[float] = Field(min_length=4, max_length=4)
    score: float = Field(ge=0, le=1)
    class_id: int = Field(ge=0)
    class_name: str = Field(min_length=1)

    @field_validator("box")
    @classmethod
    def _xyxy(cls, box: list[float]) -> list[float]:
        if not all(math.isfinite(v) for v in box):
            raise ValueError(f"box {box} has a non-finite coordinate")
        if box[0] > box[2] or box[1] > box[3]:
            raise ValueError(f"box {box} is not x1 <= x2, y1 <= y2")
        return box


class InvocationResponse(BaseModel):
    detections: list[Detection]
