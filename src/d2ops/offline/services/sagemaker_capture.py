"""Data capture offline: what SageMaker writes for an endpoint whose config has a ``DataCaptureConfig``.

Layout and records are SageMaker's documented ones ("Capture data", SageMaker developer guide):
``<DestinationS3Uri>/<endpoint>/<variant>/yyyy/mm/dd/hh/<file>.jsonl``, one
:class:`~d2ops_core.documents.capture.CaptureRecord` a line, the hour folder being the hour of the
file's first record (UTC). File names are SageMaker's: ``MM-SS-mmm-<uuid4>.jsonl`` (minute, second and
millisecond of that first record, then a random UUID, as AWS's own samples show), so files sort by time
within their hour. d2ops_core.capture_files reads both SageMaker's and these.

How the offline endpoint decides, buffers and writes (SageMaker documents none of it beyond "a couple of
minutes" of delay; this is the simple, predictable version):

- Sampling: a request is captured when the first 8 bytes of sha256(eventId), mod 100, are below
  ``InitialSamplingPercentage`` (:func:`sampled`): 0 never, 100 always, and a test that picks the
  eventIds (``new_event_id``) knows which.
- Only answered requests (a 2xx from the model) are captured; ``CaptureOptions`` picks the input, the
  output or both, ``CaptureContentTypeHeader`` which content types are stored as text.
- Buffering: one buffer per endpoint, variant and destination. It is written as one file when it holds
  ``max_records`` records, when its first record is ``flush_seconds`` old (a timer thread checks every
  ``flush_seconds / 4``), before a record of another hour joins it (so a file never spans two hour
  folders), and when the endpoint is deleted or the runtime stops (:meth:`CaptureWriter.close`). A
  failed write keeps the records for the next attempt and is logged; nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from d2ops.offline.services.sagemaker_account import utc_now
from d2ops_core.documents.capture import (
    JSON_CONTENT_TYPES,
    CaptureData,
    CaptureRecord,
    EventMetadata,
    encode_payload,
)
from d2ops_core.s3_layout import parse_s3_uri

log = logging.getLogger(__name__)

MAX_RECORDS_PER_FILE = 20
FLUSH_SECONDS = 5.0
_MODES = {"Input": {"INPUT"}, "Output": {"OUTPUT"}, "InputAndOutput": {"INPUT", "OUTPUT"}}


def sampled(event_id: str, percentage: int) -> bool:
    """Whether the request with this eventId is captured at ``percentage`` (deterministic)."""
    if percentage <= 0:
        return False
    if percentage >= 100:
        return True
    return int.from_bytes(hashlib.sha256(event_id.encode("utf-8")).digest()[:8], "big") % 100 < percentage


@dataclass(frozen=True)
class CaptureSettings:
    """An endpoint config's DataCaptureConfig, as the offline endpoint applies it."""

    bucket: str
    prefix: str  # the destination's key prefix, no trailing slash ("capture")
    percentage: int
    modes: frozenset[str]  # "INPUT", "OUTPUT"
    json_content_types: tuple[str, ...] = JSON_CONTENT_TYPES
    csv_content_types: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> CaptureSettings | None:
        """None when the config captures nothing (no DataCaptureConfig, EnableCapture false, 0 %)."""
        if not config or config.get("EnableCapture") is False:
            return None
        percentage = int(config.get("InitialSamplingPercentage") or 0)
        if percentage <= 0:
            return None
        bucket, key = parse_s3_uri(str(config["DestinationS3Uri"]))
        modes = frozenset(m for option in config.get("CaptureOptions") or []
                          for m in _MODES.get(str(option.get("CaptureMode")), set()))
        header = config.get("CaptureContentTypeHeader")
        # Without CaptureContentTypeHeader SageMaker base64-encodes everything (DataCaptureConfig's reference).
        return cls(bucket, key.strip("/"), percentage, modes or frozenset({"INPUT", "OUTPUT"}),
                   tuple((header or {}).get("JsonContentTypes") or ()),
                   tuple((header or {}).get("CsvContentTypes") or ()))


def capture_file_key(prefix: str, endpoint: str, variant: str, first: datetime, file_id: str) -> str:
    """``<prefix>/<endpoint>/<variant>/yyyy/mm/dd/hh/MM-SS-mmm-<id>.jsonl`` for a file whose first record is
    ``first`` (UTC)."""
    return (f"{prefix}/{endpoint}/{variant}/{first:%Y/%m/%d/%H}/"
            f"{first:%M-%S}-{first.microsecond // 1000:03d}-{file_id}.jsonl")


@dataclass
class _Buffer:
    settings: CaptureSettings
    endpoint: str
    variant: str
    first: datetime
    lines: list[str] = field(default_factory=list)


class CaptureWriter:
    """Buffers captured records per endpoint, variant and destination and writes them as SageMaker does."""

    def __init__(self, s3: Any, *, max_records: int = MAX_RECORDS_PER_FILE, flush_seconds: float = FLUSH_SECONDS,
                 clock: Callable[[], datetime] = utc_now,
                 new_event_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.s3 = s3
        self.max_records = max_records
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.new_event_id = new_event_id
        self._lock = threading.Lock()
        self._buffers: dict[tuple[str, str, str, str], _Buffer] = {}
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def capture(self, settings: CaptureSettings, endpoint: str, variant: str, *, request: bytes,
                request_type: str | None, answer: bytes, answer_type: str | None, when: datetime,
                inference_id: str | None = None) -> str | None:
        """Buffer one answered invocation if it is sampled; its eventId when it is, else None."""
        event_id = self.new_event_id()
        if not sampled(event_id, settings.percentage):
            return None
        types = {"json_content_types": settings.json_content_types, "csv_content_types": settings.csv_content_types}
        record = CaptureRecord(
            captureData=CaptureData(
                endpointInput=encode_payload(request, request_type, "INPUT", **types)
                if "INPUT" in settings.modes else None,
                endpointOutput=encode_payload(answer, answer_type, "OUTPUT", **types)
                if "OUTPUT" in settings.modes else None),
            eventMetadata=EventMetadata(eventId=event_id, inferenceId=inference_id,
                                        inferenceTime=when.replace(microsecond=0)))
        line = record.model_dump_json(exclude_none=True)
        key = (endpoint, variant, settings.bucket, settings.prefix)
        full: list[_Buffer] = []
        with self._lock:
            buffer = self._buffers.get(key)
            if buffer is not None and buffer.first.replace(minute=0, second=0, microsecond=0) != \
                    when.replace(minute=0, second=0, microsecond=0):
                full.append(self._buffers.pop(key))  # another hour: its own file, in its own folder
                buffer = None
            if buffer is None:
                buffer = self._buffers[key] = _Buffer(settings, endpoint, variant, when)
            buffer.lines.append(line)
            if len(buffer.lines) >= self.max_records:
                full.append(self._buffers.pop(key))
            self._start_timer()
        for done in full:
            self._write(done)
        return event_id

    def flush(self, endpoint: str | None = None) -> int:
        """Write every buffer (of ``endpoint`` only, when given) now; the number of files written."""
        with self._lock:
            keys = [k for k in self._buffers if endpoint is None or k[0] == endpoint]
            buffers = [self._buffers.pop(k) for k in keys]
        return sum(self._write(b) for b in buffers)

    def flush_due(self) -> int:
        """Write the buffers whose first record is ``flush_seconds`` old."""
        now = self.clock()
        with self._lock:
            keys = [k for k, b in self._buffers.items() if (now - b.first).total_seconds() >= self.flush_seconds]
            buffers = [self._buffers.pop(k) for k in keys]
        return sum(self._write(b) for b in buffers)

    def pending(self) -> int:
        """Records buffered and not yet written."""
        with self._lock:
            return sum(len(b.lines) for b in self._buffers.values())

    def close(self) -> None:
        """Stop the timer and write everything buffered (the endpoint stops: no record is left behind)."""
        self._stop.set()
        timer = self._timer
        if timer is not None:
            timer.join(timeout=10)
        self.flush()

    def _start_timer(self) -> None:
        if self._timer is None and not self._stop.is_set():
            self._timer = threading.Thread(target=self._tick, name="sagemaker-data-capture", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.flush_seconds / 4):
            try:
                self.flush_due()
            except Exception:  # a timer that dies would leave records to the final flush only
                log.exception("data capture: the timed flush failed")

    def _write(self, buffer: _Buffer) -> int:
        key = capture_file_key(buffer.settings.prefix, buffer.endpoint, buffer.variant, buffer.first,
                               str(uuid.uuid4()))
        try:
            self.s3.put_object(Bucket=buffer.settings.bucket, Key=key,
                               Body=("\n".join(buffer.lines) + "\n").encode("utf-8"))
        except Exception as exc:
            log.warning("data capture: %d record(s) of %s not written to s3://%s/%s yet: %s", len(buffer.lines),
                        buffer.endpoint, buffer.settings.bucket, key, exc)
            with self._lock:  # back in front of whatever came since, for the next flush
                key_of = (buffer.endpoint, buffer.variant, buffer.settings.bucket, buffer.settings.prefix)
                newer = self._buffers.get(key_of)
                if newer is not None:
                    buffer.lines += newer.lines
                self._buffers[key_of] = buffer
            return 0
        return 1
