"""Smoke test input/output and the serving response contract it checks."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SmokeTestEvent(BaseModel):
    endpoint_name: str = Field(min_length=1, max_length=63)
    bucket: str
    prefix: str = Field(pattern=r"^datasets/[^/]+/[^/]+/$", description="the dataset version to take an image from")
    # During a canary's bake SageMaker splits requests between the fleets by the canary share,
    # so several requests are what reaches the canary: with share p, (1-p)^requests miss it.
    requests: int = Field(default=1, ge=1, le=50, description="InvokeEndpoint calls; every answer must be good")


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


class SmokeTestResult(BaseModel):
    endpoint_name: str
    image_key: str
    detections: int  # in the first answer
    latency_ms: int  # the slowest answer
    requests: int
