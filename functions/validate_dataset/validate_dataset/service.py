"""Validate a dataset version in S3, snapshot and inventory it, store the full report with the run's artifacts.

Two entry points share this module:

- :func:`validate_dataset` (the validate state): lists the version once (ListObjectVersions), checks
  the manifest and annotations, and either checks and copies every image itself (at most
  ``inline_limit`` of them: the fast path) or writes the Distributed Map's items and returns
  ``images_pending``.
- :func:`summarize_images` (after the Map): merges the batches' results into the stored report,
  writes the inventory and returns the final summary.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from d2ops_core import s3_layout
from d2ops_core.failures import reason
from d2ops_core.validation import (
    Code,
    DatasetNotFound,
    DatasetUnreadable,
    ValidationReport,
    dataset_from_prefix,
    validate_version,
)
from d2ops_core.validation.codes import Severity, severity
from d2ops_core.validation.inventory import ImageItem, inventory_digest, read_inventory, write_jsonl
from d2ops_core.validation.manifest import StackLimits
from d2ops_core.validation.merge import (
    ImageChecksFailed,
    ImageChecksIncomplete,
    batch_results,
    first_failure,
    merge_results,
    newest_manifest_key,
    read_result_manifest,
)
from d2ops_core.validation.sources import S3Source
from validate_dataset.models import (
    DatasetName,
    IssueSummary,
    ResultWriterDetails,
    SummarizeImagesEvent,
    ValidateDatasetEvent,
    ValidationSummary,
)

__all__ = ["DatasetNotFound", "DatasetUnreadable", "ImageChecksFailed", "ImageChecksIncomplete", "report_key",
           "summarize_images", "validate_dataset"]
FIRST_ERRORS = 5
DEFAULT_INLINE_IMAGE_LIMIT = 2000
DEFAULT_IMAGE_CHECK_CONCURRENCY = 100


def report_key(run_id: str) -> str:
    """The run's full validation report in the artifacts bucket (the layout is d2ops_core.s3_layout's)."""
    return s3_layout.validation_report_key(run_id)


def summarize(report: ValidationReport, report_uri: str, **extra: Any) -> ValidationSummary:
    return ValidationSummary(
        valid=report.valid,
        dataset=DatasetName(name=report.dataset.name, version=report.dataset.version),
        counts=report.counts(),
        error_count=report.error_count,
        warning_count=report.warning_count,
        first_errors=[IssueSummary(code=str(i.code), message=i.message[:300], location=i.location)
                      for i in report.errors[:FIRST_ERRORS]],
        error_codes={code: n for code, n in report.issue_counts.items() if severity(Code(code)) is Severity.ERROR},
        report_uri=report_uri,
        derived_split=report.derived_split,
        manifest=report.manifest.optional_settings() if report.manifest else None,
        **extra,
    )


def _put(s3: Any, bucket: str, key: str, body: bytes, content_type: str) -> str:
    # Overwriting the same key makes a retried invocation idempotent.
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
    return s3_layout.s3_uri(bucket, key)


def _put_jsonl(s3: Any, bucket: str, key: str, records: Iterable[Any]) -> str:
    """Write JSONL through the scratch disk (a million items never sit in memory as one string)."""
    with tempfile.TemporaryFile(prefix="d2ops-jsonl-") as fh:
        write_jsonl(fh, records)
        fh.seek(0)
        s3.put_object(Bucket=bucket, Key=key, Body=fh, ContentType="application/x-ndjson")
    return s3_layout.s3_uri(bucket, key)


def validate_dataset(event: ValidateDatasetEvent, s3_client: Any, artifacts_bucket: str, *,
                     inline_limit: int = DEFAULT_INLINE_IMAGE_LIMIT,
                     concurrency: int = DEFAULT_IMAGE_CHECK_CONCURRENCY,
                     progress: Callable[[str], None] | None = None,
                     stack_limits: StackLimits | None = None) -> ValidationSummary:
    """Validate s3://bucket/prefix; raises DatasetNotFound (no manifest) or DatasetUnreadable (cannot list)."""
    source = S3Source(s3_client, event.bucket, event.prefix,
                      snapshot=(artifacts_bucket, s3_layout.snapshot_prefix(event.run_id)))
    result = validate_version(source, expected=dataset_from_prefix(event.prefix), progress=progress,
                              stack_limits=stack_limits, inline_limit=max(0, inline_limit), snapshot=True)
    report = result.report
    if report.has(Code.MANIFEST_MISSING):
        raise DatasetNotFound(f"no manifest.json under s3://{event.bucket}/{event.prefix}")
    report_uri = _put(s3_client, artifacts_bucket, report_key(event.run_id),
                      report.model_dump_json(indent=1).encode(), "application/json")
    common: dict[str, Any] = {"image_count": len(result.items), "image_check_concurrency": max(1, concurrency)}
    if result.images_pending:
        items_key = s3_layout.image_items_key(event.run_id)
        _put_jsonl(s3_client, artifacts_bucket, s3_layout.pending_inventory_key(event.run_id), result.inventory)
        items_uri = _put_jsonl(s3_client, artifacts_bucket, items_key, result.items)
        return summarize(report, report_uri, images_pending=True, image_items_uri=items_uri,
                         image_items_bucket=artifacts_bucket, image_items_key=items_key,
                         image_results_prefix=s3_layout.image_results_prefix(event.run_id), **common)
    data = b"".join(e.model_dump_json().encode("utf-8") + b"\n" for e in result.inventory)
    inventory_uri = _put(s3_client, artifacts_bucket, s3_layout.inventory_key(event.run_id), data,
                         "application/x-ndjson")
    complete = report.valid and result.snapshot_complete
    snapshot = s3_layout.snapshot_uri(artifacts_bucket, event.run_id) if complete else None
    return summarize(report, report_uri, snapshot_uri=snapshot, inventory_uri=inventory_uri,
                     inventory_digest=inventory_digest(data), **common)


def _own_results(details: ResultWriterDetails, run_id: str, artifacts_bucket: str) -> tuple[str, str]:
    """The ResultWriter manifest's bucket and key, refused unless they are this run's own image results."""
    bucket, key = details.Bucket, details.Key
    prefix = s3_layout.image_results_prefix(run_id) + "/"
    if bucket != artifacts_bucket or not key.startswith(prefix) or not key.endswith("/manifest.json"):
        raise ImageChecksIncomplete(f"the Map's results are expected under s3://{artifacts_bucket}/{prefix}, "
                                    f"not at {s3_layout.s3_uri(bucket, key)}")
    return bucket, key


# A batch that failed on these fails the run as the validate step would have: the data cannot be read.
_UNREADABLE = {"DatasetUnreadable", "DatasetNotFound"}


def explain_failed_image_checks(event: SummarizeImagesEvent, s3_client: Any, artifacts_bucket: str) -> NoReturn:
    """The Map failed: raise the first failed batch's own error, read from the Map Run's result files.

    A failed child reaches its Map only as States.ExceedToleratedFailureThreshold, whose Cause says
    nothing about the images; the ResultWriter writes the failed children's records all the same.
    """
    map_error = event.map_error.Error if event.map_error else None
    key = newest_manifest_key(s3_client, artifacts_bucket, s3_layout.image_results_prefix(event.run_id))
    if key is None:
        why = reason(event.map_error.Cause) if event.map_error else None
        raise ImageChecksFailed(f"the image checks failed before writing any result ({map_error or 'no error'}"
                                f"{': ' + why if why else ''})")
    failed, error, cause = first_failure(s3_client, artifacts_bucket, read_result_manifest(s3_client,
                                                                                           artifacts_bucket, key))
    why = reason(cause)
    first = f"{error or 'an unnamed error'}{': ' + why if why else ''}"
    if error in _UNREADABLE:
        raise DatasetUnreadable(f"an image batch could not read the dataset: {why or error}")
    raise ImageChecksFailed(f"image batches failed ({failed} result file(s) of failures, "
                            f"{s3_layout.s3_uri(artifacts_bucket, key)}); the first: {first}")


def _lines(s3: Any, bucket: str, key: str) -> Iterable[bytes]:
    """An S3 object's lines, streamed."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    yield from body.iter_lines()


def summarize_images(event: SummarizeImagesEvent, s3_client: Any, artifacts_bucket: str, *,
                     concurrency: int = DEFAULT_IMAGE_CHECK_CONCURRENCY) -> ValidationSummary:
    """Merge the Distributed Map's results into the run's report; write the inventory; the final summary.

    Raises ImageChecksIncomplete when the results do not cover every item (the Map tolerates no failure,
    so this means results went missing): a dataset is never passed with images unchecked.
    """
    if event.result_writer is None:
        explain_failed_image_checks(event, s3_client, artifacts_bucket)
    key = report_key(event.run_id)
    report = ValidationReport.model_validate_json(s3_client.get_object(Bucket=artifacts_bucket, Key=key)["Body"].read())
    items = {}
    for line in _lines(s3_client, artifacts_bucket, s3_layout.image_items_key(event.run_id)):
        if line.strip():
            item = ImageItem.model_validate_json(line)
            items[item.key] = (item.version_id, item.etag)
    files = list(read_inventory(_lines(s3_client, artifacts_bucket, s3_layout.pending_inventory_key(event.run_id))))
    manifest = read_result_manifest(s3_client, *_own_results(event.result_writer, event.run_id, artifacts_bucket))
    if any(not f.Key.startswith(s3_layout.image_results_prefix(event.run_id) + "/")
           for f in (*manifest.ResultFiles.SUCCEEDED, *manifest.ResultFiles.FAILED, *manifest.ResultFiles.PENDING)) \
            or manifest.DestinationBucket not in (None, artifacts_bucket):
        raise ImageChecksIncomplete("the Map's result manifest names result files outside this run's image results")
    snapshot = s3_layout.snapshot_prefix(event.run_id)

    def read_snapshot(rel: str) -> bytes:  # the bytes validation read, copied before the Map started
        return bytes(s3_client.get_object(Bucket=artifacts_bucket, Key=snapshot + rel)["Body"].read())

    merged = merge_results(report, files, batch_results(s3_client, artifacts_bucket, manifest), items=items,
                           read_file=read_snapshot)
    report_uri = _put(s3_client, artifacts_bucket, key, merged.report.model_dump_json(indent=1).encode(),
                      "application/json")
    inventory_uri = _put(s3_client, artifacts_bucket, s3_layout.inventory_key(event.run_id), merged.inventory,
                         "application/x-ndjson")
    items_key = s3_layout.image_items_key(event.run_id)
    # Every image was copied by its batch when it passed; the files were copied before the Map started.
    snapshot_uri = s3_layout.snapshot_uri(artifacts_bucket, event.run_id) if merged.report.valid else None
    return summarize(merged.report, report_uri, images_pending=False,
                     image_items_uri=s3_layout.s3_uri(artifacts_bucket, items_key), image_items_bucket=artifacts_bucket,
                     image_items_key=items_key, image_count=merged.images,
                     image_check_concurrency=max(1, concurrency), snapshot_uri=snapshot_uri,
                     inventory_uri=inventory_uri, inventory_digest=inventory_digest(merged.inventory))
