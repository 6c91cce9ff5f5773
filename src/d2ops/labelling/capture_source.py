"""What ``d2ops label select`` reads from the artifacts bucket: captured images, dataset hashes, weak classes.

- :func:`read_captured_images`: every distinct image captured for an endpoint in a window (the pipeline's smoke
  test's requests left out, as the monitor leaves them out), with the model's captured answer
  (d2ops_core.capture_files finds and parses the files; a record whose image does not decode or whose answer
  is not the endpoint's document is skipped and named as ``<file>:<line>: <reason>``).
- :func:`dataset_image_hashes`: the SHA-256 of every object any run's inventory lists (every dataset version
  that ever started a run), so an image already in a version is never selected again.
- :func:`weak_classes`: the classes the serving model is weak on, from its evaluation report.

The S3 client is passed in (boto3's), so tests run these against a real moto server.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from d2ops.labelling.documents import CaptureSource, SelectionError
from d2ops.labelling.selection import WEAK_CLASS_DROP, WEAK_CLASS_SHARE, thumbnail
from d2ops_core import s3_layout
from d2ops_core.capture_files import CAPTURE_FILE_SUFFIX, SkippedLine, capture_keys, parse_capture_lines
from d2ops_core.documents.capture import SMOKE_TEST_INFERENCE_ID, CaptureError, CaptureRecord
from d2ops_core.documents.detections import Detection, InvocationResponse
from d2ops_core.documents.evaluation import EvaluationReport
from d2ops_core.images import ImageRejected, load_rgb
from d2ops_core.validation.inventory import read_inventory

MAX_PROBLEMS = 20


@dataclass
class CapturedImage:
    """One distinct captured image: its bytes, where it was first captured, and the model's answer then."""

    sha256: str
    body: bytes
    content_type: str
    width: int
    height: int
    thumb: np.ndarray
    source: CaptureSource
    detections: list[Detection]
    thresholds: dict[str, float]


@dataclass
class CaptureRead:
    images: list[CapturedImage] = field(default_factory=list)
    records: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    unreadable: int = 0

    def skip(self, problem: str) -> None:
        self.unreadable += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _all_capture_keys(s3: Any, bucket: str, endpoint: str, variant: str | None) -> list[str]:
    keys: list[str] = []
    prefix = s3_layout.capture_prefix(endpoint, variant)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(str(o["Key"]) for o in page.get("Contents") or [] if str(o["Key"]).endswith(CAPTURE_FILE_SUFFIX))
    return sorted(keys)


def _records(s3: Any, bucket: str, key: str, read: CaptureRead) -> Iterator[tuple[int, CaptureRecord]]:
    """The file's records with their line numbers (capture_files parses; bad lines are named here)."""
    uri = s3_layout.s3_uri(bucket, key)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    for number, raw in enumerate(body.iter_lines(), start=1):
        skipped: list[SkippedLine] = []
        for record in parse_capture_lines([raw], uri, skipped):
            yield number, record
        for line in skipped:
            read.skip(f"{uri}:{number}: {line.reason}")


def _image(record: CaptureRecord, where: str, read: CaptureRead) -> tuple[bytes, str, Any] | None:
    data = record.captureData
    if data.endpointInput is None or data.endpointOutput is None:
        read.skip(f"{where}: no {'input' if data.endpointInput is None else 'output'} captured "
                  "(capture both: the selection needs the image and the model's answer)")
        return None
    try:
        body = data.endpointInput.raw()
        image = load_rgb(io.BytesIO(body), where)
    except (CaptureError, ImageRejected) as exc:
        read.skip(f"{where}: the image does not decode: {exc}")
        return None
    return body, data.endpointInput.observedContentType or "application/octet-stream", image


def _answer(record: CaptureRecord, where: str, read: CaptureRead) -> InvocationResponse | None:
    assert record.captureData.endpointOutput is not None
    try:
        return InvocationResponse.model_validate_json(record.captureData.endpointOutput.raw())
    except (CaptureError, ValidationError, ValueError) as exc:
        read.skip(f"{where}: the answer is not the endpoint's detections document: {str(exc).splitlines()[0]}")
        return None


def read_captured_images(s3: Any, bucket: str, endpoint: str, *, since: datetime | None = None,
                         until: datetime | None = None, variant: str | None = None) -> CaptureRead:
    """The distinct images captured for ``endpoint`` in ``[since, until)`` (both optional), first capture kept."""
    read = CaptureRead()
    if since is not None and until is not None:
        keys = capture_keys(s3, bucket, endpoint, since, until, variant=variant)
    else:  # an open window: the whole capture prefix (the bucket's lifecycle bounds it)
        keys = _all_capture_keys(s3, bucket, endpoint, variant)
    seen: set[str] = set()
    for key in keys:
        for line, record in _records(s3, bucket, key, read):
            if record.eventMetadata.inferenceId == SMOKE_TEST_INFERENCE_ID:
                continue  # the pipeline's smoke test, not traffic (as the monitor reads capture)
            moment = _utc(record.eventMetadata.inferenceTime)
            if (since is not None and moment < _utc(since)) or (until is not None and moment >= _utc(until)):
                continue
            read.records += 1
            where = f"{s3_layout.s3_uri(bucket, key)}:{line}"
            decoded = _image(record, where, read)
            if decoded is None:
                continue
            body, content_type, image = decoded
            digest = hashlib.sha256(body).hexdigest()
            if digest in seen:
                read.duplicates += 1
                continue
            answer = _answer(record, where, read)
            if answer is None:
                continue
            seen.add(digest)
            meta = record.eventMetadata
            read.images.append(CapturedImage(
                sha256=digest, body=body, content_type=content_type, width=image.width, height=image.height,
                thumb=thumbnail(image),
                source=CaptureSource(bucket=bucket, key=key, line=line, event_id=meta.eventId,
                                     inference_id=meta.inferenceId, inference_time=meta.inferenceTime),
                detections=list(answer.detections),
                thresholds=dict(answer.score_thresholds.by_class) if answer.score_thresholds else {}))
    return read


def dataset_image_hashes(s3: Any, bucket: str) -> set[str]:
    """The SHA-256 of every object listed in any run's inventory (``runs/<run id>/inventory.jsonl``)."""
    hashes: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{s3_layout.RUNS_ROOT}/",
                                                             Delimiter="/"):
        for common in page.get("CommonPrefixes") or []:
            run_id = str(common["Prefix"])[len(s3_layout.RUNS_ROOT) + 1:].rstrip("/")
            key = s3_layout.inventory_key(run_id)
            try:
                body = s3.get_object(Bucket=bucket, Key=key)["Body"]
            except s3.exceptions.NoSuchKey:
                continue  # a run that failed before validation, or one from before inventories
            for entry in read_inventory(body.iter_lines()):
                if entry.sha256:
                    hashes.add(entry.sha256)
    return hashes


def local_image_hashes(directory: Path) -> set[str]:
    """The SHA-256 of every file under ``directory`` (a dataset version, a selection, a folder of labelled
    images): excluded like the dataset versions' images."""
    from d2ops_core.file_hash import file_sha256

    if not directory.is_dir():
        raise FileNotFoundError(2, "not a directory", str(directory))
    return {file_sha256(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def weak_classes(report: EvaluationReport) -> list[str]:
    """The classes the model is weak on (docs/labelling.md): its own AP on the val split below WEAK_CLASS_SHARE
    of its overall AP, or, against the champion it was compared with, a point AP drop beyond WEAK_CLASS_DROP."""
    metric = report.primary_metric
    overall = report.challenger.metrics.get(metric)
    weak: set[str] = set()
    if overall is not None:
        for name, scores in report.challenger.per_class.items():
            if metric in scores and scores[metric] < WEAK_CLASS_SHARE * overall:
                weak.add(name)
    if report.comparison is not None:
        weak.update(name for name, c in report.comparison.classes.items() if c.difference < -WEAK_CLASS_DROP)
    return sorted(weak)


def read_evaluation_report(s3: Any, uri: str) -> EvaluationReport:
    bucket, key = s3_layout.parse_s3_uri(uri)
    try:
        return EvaluationReport.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ValidationError as exc:  # a JSON syntax error is one too: a corrupt report is one line, not a traceback
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        raise SelectionError(f"{uri}: not an evaluation report ({where}: {first['msg']})") from None
