"""Read an endpoint's data capture for a time window: the monitor and ``d2ops label select`` both use it.

SageMaker (and the offline endpoint, the same layout) writes JSONL files under
``capture/<endpoint>/<variant>/yyyy/mm/dd/hh/`` (d2ops_core.s3_layout.capture_hour_prefix), one
:class:`~d2ops_core.documents.capture.CaptureRecord` a line. SageMaker documents the folder as "the hour
when the invocation occurred" but a file holds a buffer of invocations, so a record near an hour's edge
can sit in the folder before or after its own: the window's records are found by listing the hours it
covers plus one on each side and keeping the records whose ``inferenceTime`` falls in ``[start, end)``
(the offline endpoint never lets a file span two hours: sagemaker_capture).

A line that is not a record (a file cut short, not JSON, JSON of another shape) is skipped and
reported as ``<s3 uri>:<line>: <reason>`` through ``skipped``; it never stops the read. The pipeline's
smoke-test requests (InferenceId ``SMOKE_TEST_INFERENCE_ID``) are not traffic and are left out unless asked for.

The S3 client is passed in (boto3's, or one with the same methods), so the core imports no boto3.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from d2ops_core import s3_layout
from d2ops_core.documents.capture import SMOKE_TEST_INFERENCE_ID, CaptureRecord

CAPTURE_FILE_SUFFIX = ".jsonl"
# How far from its own hour a record's file may be filed (SageMaker buffers a few minutes; one hour is ample).
_FLUSH_LAG = timedelta(hours=1)


@dataclass(frozen=True)
class SkippedLine:
    """A capture line that is not a record: where it is and why it was skipped."""

    file: str  # s3://bucket/key
    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _hours(start: datetime, end: datetime) -> Iterator[datetime]:
    hour = start.replace(minute=0, second=0, microsecond=0)
    while hour < end:
        yield hour
        hour += timedelta(hours=1)


def _list_variants(s3: Any, bucket: str, endpoint: str) -> list[str]:
    prefix = s3_layout.capture_prefix(endpoint)
    variants: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes") or []:
            variants.append(str(common["Prefix"])[len(prefix):].rstrip("/"))
    return sorted(variants)


def capture_keys(s3: Any, bucket: str, endpoint: str, start: datetime, end: datetime, *,
                 variant: str | None = None) -> list[str]:
    """The keys of the capture files that may hold records of ``[start, end)`` (naive datetimes are UTC),
    every variant's unless ``variant`` is given, sorted (by variant, then time: the keys sort by hour)."""
    start, end = _utc(start), _utc(end)
    keys: list[str] = []
    for name in [variant] if variant else _list_variants(s3, bucket, endpoint):
        for hour in _hours(start - _FLUSH_LAG, end + _FLUSH_LAG):
            prefix = s3_layout.capture_hour_prefix(endpoint, name, hour.year, hour.month, hour.day, hour.hour)
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys.extend(str(item["Key"]) for item in page.get("Contents") or []
                            if str(item["Key"]).endswith(CAPTURE_FILE_SUFFIX))
    return sorted(keys)


def parse_capture_lines(lines: Iterable[bytes], source: str,
                        skipped: list[SkippedLine] | None = None) -> Iterator[CaptureRecord]:
    """The records of one capture file's lines; a blank line is ignored, any other non-record is appended
    to ``skipped`` (when given) as ``source:<line>: <reason>`` and skipped."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        # pydantic's own parser: a line nested 100k deep is a json_invalid error, not a RecursionError that would
        # end the monitor's every run over this window (json.loads recurses once per level).
        try:
            yield CaptureRecord.model_validate_json(raw)
            continue
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            if first["type"] == "json_invalid":
                reason = f"not JSON (truncated?): {first['msg']}"
            else:
                where = ".".join(str(part) for part in first["loc"]) or "record"
                reason = f"not a capture record: {where}: {first['msg']}"
        if skipped is not None:
            skipped.append(SkippedLine(source, number, reason))


def read_capture_window(s3: Any, bucket: str, endpoint: str, start: datetime, end: datetime, *,
                        variant: str | None = None, skipped: list[SkippedLine] | None = None,
                        include_smoke_test: bool = False) -> Iterator[CaptureRecord]:
    """Every captured record of ``endpoint`` whose ``inferenceTime`` is in ``[start, end)``, file by file
    (streamed: one file's lines at a time), bad lines reported through ``skipped``; the smoke test's
    requests only with ``include_smoke_test``."""
    start, end = _utc(start), _utc(end)
    for key in capture_keys(s3, bucket, endpoint, start, end, variant=variant):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for record in parse_capture_lines(body.iter_lines(), s3_layout.s3_uri(bucket, key), skipped):
            if not include_smoke_test and record.eventMetadata.inferenceId == SMOKE_TEST_INFERENCE_ID:
                continue
            if start <= _utc(record.eventMetadata.inferenceTime) < end:
                yield record
