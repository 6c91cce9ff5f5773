"""SageMaker's data-capture records: one JSON object a line, in ``<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/``.

SageMaker writes them when the endpoint config has a ``DataCaptureConfig`` (docs: "Capture data from
a real-time endpoint"); the offline endpoint writes the same layout and the same records, so the
monitor (functions/monitor_endpoint) and ``d2ops label select`` have one reader for both.

- :class:`CapturedPayload`: one side of an invocation (``endpointInput`` or ``endpointOutput``).
- :class:`CaptureRecord`: one invocation. Field names are SageMaker's (camelCase), not ours.

Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CaptureMode = Literal["INPUT", "OUTPUT"]
CAPTURE_MODES: tuple[CaptureMode, ...] = ("INPUT", "OUTPUT")
# SageMaker stores a payload as text when its content type is one CaptureContentTypeHeader lists, else
# base64. d2ops's requests are images (base64) and its answers JSON (text).
Encoding = Literal["BASE64", "CSV", "JSON"]
JSON_CONTENT_TYPES: tuple[str, ...] = ("application/json",)
# The InferenceId the pipeline's smoke test sends (functions/smoke_test_endpoint): capture keeps it, so the
# monitor and label selection leave the smoke test's requests (one val image, many times) out of the traffic.
SMOKE_TEST_INFERENCE_ID = "d2ops-smoke-test"


class CaptureError(ValueError):
    """A capture line that is not a record, or a payload that cannot be decoded."""


class CapturedPayload(BaseModel):
    model_config = ConfigDict(extra="ignore")

    observedContentType: str | None = Field(None, description="the Content-Type (Accept for the output) as sent")
    mode: CaptureMode
    data: str = Field(description="the payload: base64 (encoding BASE64) or the text itself")
    encoding: Encoding

    def raw(self) -> bytes:
        """The payload's bytes as the caller sent (or the endpoint answered) them."""
        if self.encoding == "BASE64":
            try:
                return base64.b64decode(self.data, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise CaptureError(f"{self.mode.lower()} payload is not valid base64: {exc}") from exc
        return self.data.encode("utf-8")


class CaptureData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    endpointInput: CapturedPayload | None = None
    endpointOutput: CapturedPayload | None = None


class EventMetadata(BaseModel):
    model_config = ConfigDict(extra="ignore")

    eventId: str = Field(min_length=1)
    inferenceId: str | None = Field(None, description="InvokeEndpoint's InferenceId, when the caller set one")
    inferenceTime: datetime


class CaptureRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    captureData: CaptureData
    eventMetadata: EventMetadata
    eventVersion: str = "0"


def encode_payload(body: bytes, content_type: str | None, mode: CaptureMode, *,
                   json_content_types: Sequence[str] = JSON_CONTENT_TYPES,
                   csv_content_types: Sequence[str] = ()) -> CapturedPayload:
    """One side of an invocation as SageMaker stores it: the content types CaptureContentTypeHeader lists as
    JSON (or CSV) as text, anything else base64."""
    media = (content_type or "").split(";")[0].strip().lower()
    text_types: list[tuple[Sequence[str], Encoding]] = [(json_content_types, "JSON"), (csv_content_types, "CSV")]
    for types, encoding in text_types:
        if media in {t.lower() for t in types}:
            try:
                return CapturedPayload(observedContentType=content_type, mode=mode, data=body.decode("utf-8"),
                                       encoding=encoding)
            except UnicodeDecodeError:
                break
    return CapturedPayload(observedContentType=content_type, mode=mode,
                           data=base64.b64encode(body).decode("ascii"), encoding="BASE64")
