"""The summarize step: the Distributed Map's batch results merged into the stored validation report.

The Map's ResultWriter (Step Functions' own format, "ResultWriter (Map)" in its docs) writes
``<Prefix>/<MapRunId>/manifest.json``: ``ResultFiles: {FAILED, PENDING, SUCCEEDED: [{Key, Size}]}``,
each result file a JSON array of child-execution records whose ``Output`` is a JSON *string*
(here an :class:`ImageBatchResult`). The result files are read one at a time and their images
one at a time: the merge holds the issues it keeps (at most the report's cap per code), one
inventory line per image and the train/val overlap index, never the batches themselves.

The S3 client is passed in (d2ops_core imports no boto3).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.validation.coco import Thresholds
from d2ops_core.validation.dataset import derive_val_split
from d2ops_core.validation.images import OverlapIndex, merge_image_issues
from d2ops_core.validation.inventory import ImageBatchResult, InventoryEntry
from d2ops_core.validation.report import ImageCheck, Issue, IssueLog, ValidationReport


class ImageChecksIncomplete(Exception):
    """The Map's results do not cover every image item (failed or pending children, a missing image):
    the dataset cannot be called valid. Step Functions routes on this name."""


class ImageChecksFailed(Exception):
    """Batches of the image checks failed, so the Map stopped (States.ExceedToleratedFailureThreshold says
    no more): the message names the first failed batch's own error. Step Functions routes on this name."""


class ResultFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Key: str
    Size: int = 0


class ResultFiles(BaseModel):
    model_config = ConfigDict(extra="ignore")

    FAILED: list[ResultFile] = Field(default_factory=list)
    PENDING: list[ResultFile] = Field(default_factory=list)
    SUCCEEDED: list[ResultFile] = Field(default_factory=list)


class ResultWriterManifest(BaseModel):
    """``manifest.json`` as Step Functions' ResultWriter writes it (the fields the merge needs)."""

    model_config = ConfigDict(extra="ignore")

    DestinationBucket: str | None = None
    MapRunArn: str | None = None
    ResultFiles: ResultFiles


def _get(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def read_result_manifest(s3: Any, bucket: str, key: str) -> ResultWriterManifest:
    return ResultWriterManifest.model_validate_json(_get(s3, bucket, key))


_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


def iter_json_array(chunks: Iterable[bytes], what: str) -> Iterator[Any]:
    """The elements of a JSON array read from byte chunks, one at a time (a result file may be gigabytes).

    Holds the unparsed tail and one element; raises ValueError naming ``what`` when it is not an array.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    buffer, pos, started, ended = "", 0, False, False
    source = iter(chunks)
    exhausted = False

    def more() -> bool:
        nonlocal buffer, pos, exhausted
        if exhausted:
            return False
        chunk = next(source, None)
        if chunk is None:
            exhausted = True
            buffer = buffer[pos:] + decoder.decode(b"", final=True)
        else:
            buffer = buffer[pos:] + decoder.decode(chunk)
        pos = 0
        return True

    while True:
        while pos < len(buffer) and buffer[pos] in _SPACE:
            pos += 1
        if pos >= len(buffer):
            if more():
                continue
            if ended:
                return
            raise ValueError(f"{what} ends before its JSON array does")
        char = buffer[pos]
        if ended:
            raise ValueError(f"{what} has data after its JSON array")
        if not started:
            if char != "[":
                raise ValueError(f"{what} is not a JSON array")
            started, pos = True, pos + 1
            continue
        if char == "]":
            ended, pos = True, pos + 1
            continue
        if char == ",":
            pos += 1
            continue
        try:
            value, end = _DECODER.raw_decode(buffer, pos)
        except json.JSONDecodeError:
            if more():
                continue  # the element goes on in the next chunk
            raise ValueError(f"{what} has a malformed element at character {pos}") from None
        if end == len(buffer) and not exhausted and more():  # a number may continue in the next chunk
            continue
        pos = end
        yield value


def batch_results(s3: Any, bucket: str, manifest: ResultWriterManifest) -> Iterator[ImageBatchResult]:
    """Every child's ImageBatchResult, streamed one result file and one record at a time; failed or
    pending children raise."""
    files = manifest.ResultFiles
    if files.FAILED or files.PENDING:
        raise ImageChecksIncomplete(f"the image checks have {len(files.FAILED)} failed and {len(files.PENDING)} "
                                    f"pending result files ({(files.FAILED or files.PENDING)[0].Key})")
    for result_file in files.SUCCEEDED:
        body = s3.get_object(Bucket=manifest.DestinationBucket or bucket, Key=result_file.Key)["Body"]
        try:
            for n, record in enumerate(iter_json_array(body.iter_chunks(1024 * 1024), result_file.Key)):
                output = record.get("Output") if isinstance(record, dict) else None
                if not isinstance(output, str):
                    status = record.get("Status") if isinstance(record, dict) else "?"
                    raise ImageChecksIncomplete(f"{result_file.Key}[{n}] has no Output (status {status})")
                yield _batch_result(output)
        except ValueError as exc:  # not an array, or an Output that is not an ImageBatchResult
            raise ImageChecksIncomplete(f"{result_file.Key}: {str(exc).splitlines()[0]}") from exc


def newest_manifest_key(s3: Any, bucket: str, results_prefix: str) -> str | None:
    """The manifest.json of the newest Map Run written under ``results_prefix`` (None when none was)."""
    newest: tuple[Any, str] | None = None
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=results_prefix.rstrip("/") + "/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/manifest.json") and (newest is None or obj["LastModified"] > newest[0]):
                newest = (obj["LastModified"], obj["Key"])
    return newest[1] if newest else None


def first_failure(s3: Any, bucket: str, manifest: ResultWriterManifest) -> tuple[int, str | None, Any]:
    """(failed result files, the first failed child's Error, its Cause): what stopped the Map Run."""
    files = manifest.ResultFiles.FAILED
    if not files:
        return 0, None, None
    body = s3.get_object(Bucket=manifest.DestinationBucket or bucket, Key=files[0].Key)["Body"]
    try:
        for record in iter_json_array(body.iter_chunks(1024 * 1024), files[0].Key):
            if isinstance(record, dict):
                error = record.get("Error")
                return len(files), error if isinstance(error, str) else None, record.get("Cause")
    except ValueError:
        pass  # an unreadable result file: the count alone is still worth saying
    return len(files), None, None


def _batch_result(output: str) -> ImageBatchResult:
    """A child's Output: the Lambda's return, or the ``lambda:invoke`` integration's envelope around it
    (``{"Payload": ..., "StatusCode": 200, ...}`` when the child state has no ``OutputPath: $.Payload``)."""
    document = json.loads(output)
    if isinstance(document, dict) and "Payload" in document and "images" not in document:
        document = document["Payload"]
    return ImageBatchResult.model_validate(document)


class Merged(BaseModel):
    report: ValidationReport
    inventory: bytes = Field(description="the inventory file's bytes: sorted by key, one InventoryEntry a line")
    images: int


def merge_results(report: ValidationReport, files_inventory: Iterable[InventoryEntry],
                  results: Iterable[ImageBatchResult], *, items: Mapping[str, tuple[str | None, str | None]],
                  read_file: Callable[[str], bytes] | None = None, limits: Thresholds | None = None) -> Merged:
    """The stored (pending) report with every batch's issues, the content overlap and the image counts.

    ``items``: the Map's items, key -> (version_id, etag) as validation listed them. Raises
    ImageChecksIncomplete unless the results answer for exactly those images at exactly those versions
    and, when the version passes, every image is in the snapshot: results are only counted on, never
    trusted to say which bytes were checked.

    A report whose val is still to be derived (``derived_split_pending``) gets its split here, keyed
    on the SHA-256s the batches computed (d2ops_core.validation.split): ``read_file`` reads the train
    annotations (the run's snapshot of them) by their path relative to the dataset root.
    """
    started = time.perf_counter()
    log = IssueLog.from_report(report)
    manifest = report.manifest
    derive = report.derived_split_pending and manifest is not None
    if derive and read_file is None:
        raise ValueError("the report's val split is to be derived: merge_results needs read_file")
    prefix = manifest.images_prefix if manifest is not None else ""
    sha256_of: dict[str, str] = {}  # file_name -> SHA-256, only while a split is to be derived
    lines: dict[str, bytes] = {e.key: e.model_dump_json().encode("utf-8") for e in files_inventory}
    files = set(lines)
    overlap = OverlapIndex()
    images = probed = decoded = 0
    uncopied: str | None = None

    def issues() -> Iterator[Issue]:
        nonlocal images, probed, decoded, uncopied
        for result in results:
            for image in result.images:
                key = image.entry.key
                if key in lines and key not in files:
                    continue  # a retried batch reported it twice
                pinned = items.get(key)
                if pinned is None or pinned != (image.entry.version_id, image.entry.etag):
                    what = "was not an item of the Map" if pinned is None else (
                        f"was checked at version {image.entry.version_id} (ETag {image.entry.etag}), not the listed "
                        f"{pinned[0]} (ETag {pinned[1]})")
                    raise ImageChecksIncomplete(f"a batch result names {key}, which {what}")
                images += 1
                if not image.copied and uncopied is None:
                    uncopied = key
                lines[key] = image.entry.model_dump_json().encode("utf-8")
                if derive and image.entry.sha256 is not None and key.startswith(prefix):
                    sha256_of[key[len(prefix):]] = image.entry.sha256
                overlap.add(image)
                if image.passed:
                    probed += len(image.locations)
                    decoded += len(image.locations) if image.decoded else 0
            yield from result.issues

    merge_image_issues(log, issues())
    if images != len(items):
        raise ImageChecksIncomplete(f"the image checks answered for {images} image files, the Map was given "
                                    f"{len(items)}")
    overlap.report(log.add)
    if uncopied is not None and log.error_count == 0:
        raise ImageChecksIncomplete(f"{uncopied} passed its checks but is not in the run's snapshot")
    splits, derived = dict(report.splits), report.derived_split
    if derive and manifest is not None and read_file is not None and log.error_count == 0:
        sides = derive_val_split(read_file(manifest.train), manifest, sha256_of, log, limits)
        if sides is not None:
            derived, derived_stats = sides
            splits.update(derived_stats)
    sha256_of.clear()  # a million names and hashes: not held while the inventory is joined
    checked = ImageCheck(mode="all", referenced=report.images.referenced, missing=report.images.missing,
                         probed=probed, decoded=decoded)
    merged = ValidationReport.build(source=report.source, log=log, manifest=report.manifest, dataset=report.dataset,
                                    splits=splits, images=checked,
                                    seconds=report.seconds + time.perf_counter() - started,
                                    derived_split=derived)
    inventory = b"".join(lines[key] + b"\n" for key in sorted(lines))
    return Merged(report=merged, inventory=inventory, images=images)
