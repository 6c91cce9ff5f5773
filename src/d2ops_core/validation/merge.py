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

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.validation.images import OverlapIndex, merge_image_issues
from d2ops_core.validation.inventory import ImageBatchResult, InventoryEntry
from d2ops_core.validation.report import ImageCheck, Issue, IssueLog, ValidationReport


class ImageChecksIncomplete(Exception):
    """The Map's results do not cover every image item (failed or pending children, a missing image):
    the dataset cannot be called valid. Step Functions routes on this name."""


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


def batch_results(s3: Any, bucket: str, manifest: ResultWriterManifest) -> Iterator[ImageBatchResult]:
    """Every child's ImageBatchResult, one result file at a time; failed or pending children raise."""
    files = manifest.ResultFiles
    if files.FAILED or files.PENDING:
        raise ImageChecksIncomplete(f"the image checks have {len(files.FAILED)} failed and {len(files.PENDING)} "
                                    f"pending result files ({(files.FAILED or files.PENDING)[0].Key})")
    for result_file in files.SUCCEEDED:
        records = json.loads(_get(s3, manifest.DestinationBucket or bucket, result_file.Key))
        if not isinstance(records, list):
            raise ImageChecksIncomplete(f"{result_file.Key} is not a JSON array of child executions")
        for n, record in enumerate(records):
            output = record.get("Output") if isinstance(record, dict) else None
            if not isinstance(output, str):
                raise ImageChecksIncomplete(f"{result_file.Key}[{n}] has no Output (status "
                                            f"{record.get('Status') if isinstance(record, dict) else '?'})")
            yield ImageBatchResult.model_validate_json(output)


class Merged(BaseModel):
    report: ValidationReport
    inventory: bytes = Field(description="the inventory file's bytes: sorted by key, one InventoryEntry a line")
    images: int


def merge_results(report: ValidationReport, files_inventory: Iterable[InventoryEntry],
                  results: Iterable[ImageBatchResult], *, expected_images: int) -> Merged:
    """The stored (pending) report with every batch's issues, the content overlap and the image counts.

    Raises ImageChecksIncomplete when the results name a different number of distinct images than
    the items the Map was given (``expected_images``).
    """
    started = time.perf_counter()
    log = IssueLog.from_report(report)
    lines: dict[str, bytes] = {e.key: e.model_dump_json().encode("utf-8") for e in files_inventory}
    overlap = OverlapIndex()
    seen: set[str] = set()
    probed = decoded = 0

    def issues() -> Iterator[Issue]:
        nonlocal probed, decoded
        for result in results:
            for image in result.images:
                key = image.entry.key
                if key in seen:
                    continue  # a retried batch reported it twice
                seen.add(key)
                lines[key] = image.entry.model_dump_json().encode("utf-8")
                overlap.add(image)
                if image.passed:
                    probed += len(image.locations)
                    decoded += len(image.locations) if image.decoded else 0
            yield from result.issues

    merge_image_issues(log, issues())
    if len(seen) != expected_images:
        raise ImageChecksIncomplete(f"the image checks answered for {len(seen)} image files, the Map was given "
                                    f"{expected_images}")
    overlap.report(log.add)
    images = ImageCheck(mode="all", referenced=report.images.referenced, missing=report.images.missing,
                        probed=probed, decoded=decoded)
    merged = ValidationReport.build(source=report.source, log=log, manifest=report.manifest, dataset=report.dataset,
                                    splits=report.splits, images=images,
                                    seconds=report.seconds + time.perf_counter() - started,
                                    derived_split=report.derived_split)
    inventory = b"".join(lines[key] + b"\n" for key in sorted(lines))
    return Merged(report=merged, inventory=inventory, images=len(seen))
