"""Validation of COCO dataset versions (manifest, annotations, image files) for the Lambda, the CLI and offline runs.

Ships in the Lambda layer: no torch, moto or other heavy imports anywhere in this package.
"""

from d2ops_core.validation.coco import Thresholds
from d2ops_core.validation.codes import Code, Severity
from d2ops_core.validation.dataset import Validated, dataset_from_prefix, validate_local, validate_s3, validate_version
from d2ops_core.validation.errors import DatasetNotFound, DatasetUnreadable
from d2ops_core.validation.manifest import Manifest, manifest_json_schema
from d2ops_core.validation.report import Issue, ValidationReport

__all__ = [
    "Code",
    "DatasetNotFound",
    "DatasetUnreadable",
    "Issue",
    "Manifest",
    "Severity",
    "Thresholds",
    "Validated",
    "ValidationReport",
    "dataset_from_prefix",
    "manifest_json_schema",
    "validate_local",
    "validate_s3",
    "validate_version",
]
