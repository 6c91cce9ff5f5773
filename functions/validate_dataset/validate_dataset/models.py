"""The validate Lambda's input (built by the state machine) and its small output."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.run_ids import RUN_ID_PATTERN
from d2ops_core.validation.codes import Code
from d2ops_core.validation.report import DatasetName  # the report's own model: one class for both documents
from d2ops_core.validation.split import DerivedSplit


class ValidateDatasetEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = Field(min_length=1, max_length=900, description="datasets/<name>/<version>/")
    run_id: str = Field(pattern=RUN_ID_PATTERN, description="the Step Functions execution name")


class IssueSummary(BaseModel):
    code: Code  # the validator's enum: a code it cannot emit (in a mock, a test) is refused
    message: str
    location: str


class ValidationSummary(BaseModel):
    """What the state machine keeps: small enough for any state payload; the full report is at report_uri."""

    valid: bool
    dataset: DatasetName
    counts: dict[str, int]
    error_count: int
    warning_count: int
    first_errors: list[IssueSummary] = Field(max_length=5)
    error_codes: dict[str, int] = Field(default_factory=dict, description="every error counted by code (bounded by "
                                                                         "the set of codes): the rejection metrics")
    report_uri: str
    derived_split: DerivedSplit | None = Field(default=None, description="how val was derived from train when the "
                                                                         "dataset version has none (the run keeps it)")
    manifest: dict[str, Any] | None = Field(description="optional manifest keys (task, training, gate), defaults "
                                                        "applied; null when the manifest is invalid")
    # Issue 21: every image checked (inline, or by the Distributed Map), the snapshot and the inventory.
    images_pending: bool = Field(default=False, description="too many images to check inline: the Distributed "
                                                            "Map checks image_items_uri; valid is provisional")
    image_items_uri: str | None = Field(default=None, description="s3:// URI of image-items.jsonl (pending only)")
    image_items_bucket: str | None = Field(default=None, description="its bucket (the Map's ItemReader.Bucket)")
    image_items_key: str | None = Field(default=None, description="its key (the Map's ItemReader.Key)")
    image_results_prefix: str | None = Field(default=None, description="where the Map's ResultWriter writes "
                                                                       "(its Prefix; pending only)")
    image_count: int = Field(default=0, description="distinct image files present and referenced")
    image_check_concurrency: int = Field(default=100, ge=1, description="the Map's MaxConcurrency "
                                                                          "(ImageCheckConcurrency)")
    snapshot_uri: str | None = Field(default=None, description="s3://<artifacts>/runs/<run id>/dataset/: what "
                                                               "training and evaluation read (set when valid)")
    inventory_uri: str | None = Field(default=None, description="s3:// URI of the run's inventory.jsonl (final "
                                                                "summaries only)")
    inventory_digest: str | None = Field(default=None, description="sha256:<hex> of inventory.jsonl's bytes "
                                                                   "(final summaries only)")


class ResultWriterDetails(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    Bucket: str = Field(min_length=3, max_length=63)
    Key: str = Field(min_length=1, description="<prefix>/<map run id>/manifest.json")


class MapError(BaseModel):
    """What the Map's Catch put at ``$.error``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    Error: str | None = None
    Cause: str | None = None


class SummarizeImagesEvent(BaseModel):
    """The summarize step's input: the run and the Map's ``ResultWriterDetails``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = Field(min_length=1, max_length=900, description="datasets/<name>/<version>/")
    run_id: str = Field(pattern=RUN_ID_PATTERN, description="the Step Functions execution name")
    result_writer: ResultWriterDetails | None = Field(None, description="the Map's output; absent when the Map "
                                                                        "failed (then the step explains why)")
    map_error: MapError | None = Field(None, description="the Map's error, from its Catch, when it failed")
