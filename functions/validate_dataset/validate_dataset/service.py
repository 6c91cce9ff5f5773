"""Validate a dataset version in S3, store the full report with the run's artifacts, return a summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from d2ops_core import runs
from d2ops_core.validation import Code, DatasetNotFound, DatasetUnreadable, ValidationReport, validate_s3
from d2ops_core.validation.codes import Severity, severity
from d2ops_core.validation.manifest import StackLimits
from validate_dataset.models import DatasetName, IssueSummary, ValidateDatasetEvent, ValidationSummary

__all__ = ["DatasetNotFound", "DatasetUnreadable", "report_key", "validate_dataset"]
FIRST_ERRORS = 5


def report_key(run_id: str) -> str:
    """The run's full validation report in the artifacts bucket (the layout is d2ops_core.runs')."""
    return runs.validation_report_key(run_id)


def summarize(report: ValidationReport, report_uri: str) -> ValidationSummary:
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
    )


def validate_dataset(event: ValidateDatasetEvent, s3_client: Any, artifacts_bucket: str, *, image_sample: int,
                     progress: Callable[[str], None] | None = None,
                     stack_limits: StackLimits | None = None) -> ValidationSummary:
    """Validate s3://bucket/prefix; raises DatasetNotFound (no manifest) or DatasetUnreadable (cannot list)."""
    report = validate_s3(s3_client, event.bucket, event.prefix, image_sample=image_sample, progress=progress,
                         stack_limits=stack_limits)
    if report.has(Code.MANIFEST_MISSING):
        raise DatasetNotFound(f"no manifest.json under s3://{event.bucket}/{event.prefix}")
    key = report_key(event.run_id)
    # Overwriting the same key makes a retried invocation idempotent.
    s3_client.put_object(Bucket=artifacts_bucket, Key=key, Body=report.model_dump_json(indent=1).encode(),
                         ContentType="application/json")
    return summarize(report, runs.s3_uri(artifacts_bucket, key))
