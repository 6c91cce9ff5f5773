"""Where a run's data lives in S3: the dataset versions' keys in the data bucket, and everything a run
writes under ``runs/<run id>/`` (its spot checkpoints under ``checkpoints/<run id>/``) in the artifacts
bucket (docs/interfaces.md). Writers and readers take keys from here, never spell the layout themselves.
"""

from __future__ import annotations

import re

MANIFEST_NAME = "manifest.json"
DATASETS_ROOT = "datasets"
RUNS_ROOT = "runs"
CHECKPOINTS_ROOT = "checkpoints"
VALIDATION_REPORT_NAME = "report.json"
EVALUATION_REPORT_NAME = "evaluation.json"
INVENTORY_NAME = "inventory.jsonl"
SNAPSHOT_DIR = "dataset"
_SEGMENT = re.compile(r"^[^/\\]+$")
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<key>.*)$")


class NotADatasetManifest(ValueError):
    """The object key is not ``datasets/<name>/<version>/manifest.json``."""


def parse_manifest_key(key: str) -> tuple[str, str]:
    """``datasets/<name>/<version>/manifest.json`` -> (name, version); anything else raises."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != DATASETS_ROOT or parts[3] != MANIFEST_NAME:
        raise NotADatasetManifest(f"{key!r} is not {DATASETS_ROOT}/<name>/<version>/{MANIFEST_NAME}")
    name, version = parts[1], parts[2]
    for label, value in (("name", name), ("version", version)):
        if not _SEGMENT.match(value) or value in {".", ".."}:
            raise NotADatasetManifest(f"{key!r}: dataset {label} {value!r} is empty or a relative path segment")
    return name, version


def dataset_prefix(name: str, version: str) -> str:
    return f"{DATASETS_ROOT}/{name}/{version}/"


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    match = _S3_URI.match(uri)
    if not match:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return match["bucket"], match["key"]


def run_prefix(run_id: str) -> str:
    """``runs/<run id>/``: the key prefix of everything the run writes to the artifacts bucket."""
    return f"{RUNS_ROOT}/{run_id}/"


def validation_report_key(run_id: str) -> str:
    """Where validate_dataset stores the run's full validation report (the status API reads it back)."""
    return f"{run_prefix(run_id)}validation/{VALIDATION_REPORT_NAME}"


def inventory_key(run_id: str) -> str:
    """The run's inventory (d2ops_core.validation.inventory): every object it read, pinned, sorted by key."""
    return f"{run_prefix(run_id)}{INVENTORY_NAME}"


def pending_inventory_key(run_id: str) -> str:
    """The inventory of the files validate_dataset read itself (manifest, annotations) while the image
    checks are still running; the summarize step adds the images and writes :func:`inventory_key`."""
    return f"{run_prefix(run_id)}validation/files-inventory.jsonl"


def image_items_key(run_id: str) -> str:
    """The Distributed Map's items: one ImageItem JSON per line."""
    return f"{run_prefix(run_id)}validation/image-items.jsonl"


def image_results_prefix(run_id: str) -> str:
    """The Map's ResultWriter prefix (Step Functions adds ``<map run id>/manifest.json`` and result files)."""
    return f"{run_prefix(run_id)}validation/image-results"


def snapshot_prefix(run_id: str) -> str:
    """``runs/<run id>/dataset/``: the run's copy (by VersionId) of every object it validated."""
    return f"{run_prefix(run_id)}{SNAPSHOT_DIR}/"


def review_request_key(run_id: str) -> str:
    """A run waiting for a person's decision (d2ops_core.documents.review.ReviewRequest, with its task token)."""
    return f"{run_prefix(run_id)}review/request.json"


def review_decision_key(run_id: str) -> str:
    """The person's decision on the run (d2ops_core.documents.review.ReviewDecision), written once."""
    return f"{run_prefix(run_id)}review/decision.json"


def dataset_diff_key(run_id: str) -> str:
    """The diff of the run's dataset against the champion's (d2ops_core.documents.dataset_diff.DatasetDiff)."""
    return f"{run_prefix(run_id)}dataset-diff.json"


def training_curve_key(run_id: str) -> str:
    """The run's ended training job's progress and loss curve (d2ops_core.documents.training_curve.TrainingCurve),
    stored once by the status API so that later answers need not read CloudWatch."""
    return f"{run_prefix(run_id)}training-curve.json"


def snapshot_uri(artifacts_bucket: str, run_id: str) -> str:
    """What the training and evaluation channels read: the snapshot, never the mutable data prefix."""
    return s3_uri(artifacts_bucket, snapshot_prefix(run_id))


def checkpoint_uri(artifacts_bucket: str, run_id: str) -> str:
    """The training job's ``CheckpointConfig.S3Uri``: a spot restart of the same job resumes from it."""
    return s3_uri(artifacts_bucket, f"{CHECKPOINTS_ROOT}/{run_id}/")


def training_output_uri(artifacts_bucket: str, run_id: str) -> str:
    """The run's training job's ``S3OutputPath``; also how a job of this name is known to be this run's."""
    return s3_uri(artifacts_bucket, f"{run_prefix(run_id)}training/")


def evaluation_output_uri(artifacts_bucket: str, run_id: str) -> str:
    """The run's evaluation (processing) job's output ``S3Uri``; also how that job is known to be this run's."""
    return s3_uri(artifacts_bucket, f"{run_prefix(run_id)}evaluation/")


def evaluation_report_uri(artifacts_bucket: str, run_id: str) -> str:
    """The evaluation job's report: ``evaluation.json`` in its output (``model_code.evaluation`` writes it)."""
    return evaluation_output_uri(artifacts_bucket, run_id) + EVALUATION_REPORT_NAME


# --- after deployment: data capture and monitoring (issue 32) -------------------------------------
CAPTURE_ROOT = "capture"
MONITORING_ROOT = "monitoring"
MONITORING_BASELINE_NAME = "monitoring-baseline.json"


def capture_destination_uri(artifacts_bucket: str) -> str:
    """The endpoint config's ``DataCaptureConfig.DestinationS3Uri``; SageMaker adds ``<endpoint>/<variant>/...``."""
    return s3_uri(artifacts_bucket, CAPTURE_ROOT)


def capture_prefix(endpoint: str, variant: str | None = None) -> str:
    """``capture/<endpoint>/[<variant>/]``: where SageMaker writes an endpoint's (one variant's) captured records."""
    return f"{CAPTURE_ROOT}/{endpoint}/" + (f"{variant}/" if variant else "")


def capture_hour_prefix(endpoint: str, variant: str, year: int, month: int, day: int, hour: int) -> str:
    """``capture/<endpoint>/<variant>/yyyy/mm/dd/hh/``: one hour of capture files (UTC, SageMaker's layout)."""
    return f"{capture_prefix(endpoint, variant)}{year:04d}/{month:02d}/{day:02d}/{hour:02d}/"


def monitoring_baseline_key(run_id: str) -> str:
    """The baseline the monitor compares capture windows with: the run's model on its own val set, written by
    the evaluation job beside its report (d2ops_core.documents.monitoring.MonitoringBaseline)."""
    return f"{run_prefix(run_id)}evaluation/{MONITORING_BASELINE_NAME}"


def monitoring_prefix(endpoint: str) -> str:
    """``monitoring/<endpoint>/``: the monitor's window verdicts (d2ops_core.documents.monitoring.MonitoringWindow)."""
    return f"{MONITORING_ROOT}/{endpoint}/"


def monitoring_window_key(endpoint: str, window_start_iso: str) -> str:
    """One window's verdict; ``window_start_iso`` is ``YYYY-MM-DDTHH:MMZ``, so keys sort by time."""
    return f"{monitoring_prefix(endpoint)}windows/{window_start_iso}.json"
