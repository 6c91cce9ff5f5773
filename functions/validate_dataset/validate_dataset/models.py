"""The validate Lambda's input (built by the state machine) and its small output."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.validation.codes import Code
from d2ops_core.validation.report import DatasetName  # the report's own model: one class for both documents
from d2ops_core.validation.split import DerivedSplit


class ValidateDatasetEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = Field(min_length=1, max_length=900, description="datasets/<name>/<version>/")
    run_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,80}$", description="the Step Functions execution name")


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
