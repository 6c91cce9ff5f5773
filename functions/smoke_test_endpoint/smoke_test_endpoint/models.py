"""Smoke test input/output; the serving response contract it checks is d2ops_core.documents.detections."""

from __future__ import annotations

from pydantic import BaseModel, Field

from d2ops_core.documents.detections import Detection, InvocationResponse

__all__ = ["Detection", "InvocationResponse", "SmokeTestEvent", "SmokeTestResult"]


class SmokeTestEvent(BaseModel):
    endpoint_name: str = Field(min_length=1, max_length=63)
    bucket: str
    prefix: str = Field(pattern=r"^datasets/[^/]+/[^/]+/$", description="the dataset version to take an image from")
    # During a canary's bake SageMaker splits requests between the fleets by the canary share,
    # so several requests are what reaches the canary: with share p, (1-p)^requests miss it.
    requests: int = Field(default=1, ge=1, le=50, description="InvokeEndpoint calls; every answer must be good")


class SmokeTestResult(BaseModel):
    endpoint_name: str
    image_key: str
    detections: int  # in the first answer
    latency_ms: int  # the slowest answer
    requests: int
