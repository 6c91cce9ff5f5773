"""Input and settings of the prepare step; its output, ``$.plan``, is the run state document's
:class:`d2ops_core.documents.run_state.Plan` (one model for the writer here and the readers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from d2ops_core import images, pretrained
from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.documents.run_state import (  # re-exported: the prepare step's output
    CapacitySize,
    ChampionRef,
    EndpointPlan,
    JobNames,
    Plan,
    TrafficRoutingConfig,
)
from d2ops_core.run_ids import RUN_ID_PATTERN
from d2ops_core.validation.manifest import Gate, StackLimits, TrainingOverrides


class ManifestSettings(BaseModel):
    """The manifest's optional keys as the validation summary passes them on."""

    model_config = ConfigDict(extra="forbid")

    task: Literal["detection", "instance_segmentation"] = "detection"
    training: TrainingOverrides = Field(default_factory=TrainingOverrides)
    gate: Gate | None = None


class ValidatedDataset(BaseModel):
    """What prepare needs of ``$.validation.summary`` (validate_dataset.models.ValidationSummary): the run's
    snapshot, which the jobs read instead of the mutable data prefix, and the inventory's digest."""

    model_config = ConfigDict(extra="ignore")

    images_pending: bool = False
    snapshot_uri: str | None = None
    inventory_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")


class PrepareEvent(BaseModel):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    dataset: DatasetRef
    manifest: ManifestSettings = Field(default_factory=ManifestSettings)
    validation: ValidatedDataset | None = Field(None, description="the validation summary; None is refused")


class PrepareSettings(BaseModel):
    """Stack parameters, passed to the function as environment variables (template.yaml)."""

    model_config = ConfigDict(frozen=True)

    artifacts_bucket: str = Field(min_length=3)
    # One role per job kind (template.yaml): each reaches only the S3 keys its job uses.
    training_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    evaluation_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    training_image_uri: str = Field(min_length=1)
    evaluation_image_uri: str = Field(min_length=1)
    framework: Literal["detectron2", "torchvision"] = "detectron2"
    training_instance_type: str = Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    training_instance_count: int = Field(ge=1, le=16)
    use_spot: bool
    max_training_seconds: int = Field(ge=60, le=432_000)
    evaluation_instance_type: str = Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    endpoint_instance_type: str = Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    endpoint_instance_count: int = Field(1, ge=1, le=10)
    endpoint_poll_seconds: int = Field(30, ge=1, le=3600)
    # Each check writes up to 20 history events in the deployment wait and 11 in the rollback wait;
    # 360 keeps the longest run under Step Functions' 25,000 (tests/unit/test_pipeline_history_budget.py).
    endpoint_max_wait_attempts: int = Field(120, ge=1, le=360)
    capture_sampling_percentage: int = Field(10, ge=0, le=100, description="CaptureSamplingPercentage: the share "
                                             "of InvokeEndpoint requests data capture keeps; 0 turns it off")
    limits: StackLimits = Field(description="the operator's limits a manifest may only tighten (MinMap, MaxRegression, "
                                            "the per-class gate, the interval, the training caps), read by "
                                            "StackLimits.from_env as validate_dataset reads them")
    data_bucket: str = Field(min_length=3, description="DataBucket: where the pretrained weights are")
    pretrained_weights_key: str = Field(min_length=1, max_length=1024, pattern=pretrained.KEY_PATTERN,
                                        description="PretrainedWeightsKey: the checkpoint's key, or 'none'")
    stack_name: str | None = Field(None, description="AWS::StackName, for the command a failure names")
    max_image_pixels: int = Field(images.MAX_PIXELS, ge=images.MIN_PIXELS_LIMIT, le=images.MAX_PIXELS_LIMIT,
                                  description="MaxImagePixels: the image rule's limit, passed on to the jobs")

    @field_validator("limits")
    @classmethod
    def _per_class_gate_is_set(cls, limits: StackLimits) -> StackLimits:
        """The plan always carries the per-class gate: its margin and instance count are required here."""
        if limits.max_class_regression is None or limits.min_class_instances is None:
            raise ValueError("MAX_CLASS_REGRESSION and MIN_CLASS_INSTANCES are required (the per-class gate)")
        return limits

    @property
    def fine_tunes(self) -> bool:
        """Whether runs start from the checkpoint at ``pretrained_weights_key`` (detectron2 only: the
        torchvision trainer has no checkpoint format of the model zoo's)."""
        return self.framework == "detectron2" and self.pretrained_weights_key != pretrained.SCRATCH

    @field_validator("use_spot", mode="before")
    @classmethod
    def _true_or_false(cls, value: object) -> object:
        # CloudFormation passes the UseSpotTraining parameter as the string "true" or "false".
        if isinstance(value, str):
            if value.lower() not in {"true", "false"}:
                raise ValueError(f"expected 'true' or 'false', got {value!r}")
            return value.lower() == "true"
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PrepareSettings:
        """Read ``ARTIFACTS_BUCKET``, ``TRAINING_ROLE_ARN``, ... (upper-case field names)."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        if "evaluation_image_uri" not in values and "training_image_uri" in values:
            values["evaluation_image_uri"] = values["training_image_uri"]
        values["limits"] = StackLimits.from_env(env)
        return cls.model_validate(values)


__all__ = ["CapacitySize", "ChampionRef", "EndpointPlan", "JobNames", "ManifestSettings", "Plan", "PrepareEvent",
           "PrepareSettings", "TrafficRoutingConfig"]
