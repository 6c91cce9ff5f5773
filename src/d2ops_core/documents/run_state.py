"""The run's state document: the JSON the state machine carries as ``$`` from state to state.

Writers: the execution input (``$.dataset``), the prepare Lambda (``$.plan``, built as :class:`Plan`)
and the ASL's ResultSelectors / Pass states (every other section). Readers: compose_notification
(``$`` passed in) and the status API (the execution's output, or the last state's). Each section
exists only once its state has run, so every section is optional; unknown keys are ignored so a
newer pipeline's documents still read (tests/unit/test_run_state.py runs the pipeline's paths and
validates every state's output with :class:`RunState`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from d2ops_core.champion import GateDecision
from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.documents.dataset_diff import DatasetDiffSummary
from d2ops_core.documents.evaluation import DifferenceInterval, GateThresholds


class JobNames(BaseModel):
    training_job: str
    evaluation_job: str
    model: str
    endpoint_config: str


class CapacitySize(BaseModel):
    """botocore's sagemaker ``CapacitySize`` (member names as the API spells them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    Type: Literal["INSTANCE_COUNT", "CAPACITY_PERCENT"]
    Value: int = Field(ge=1)


class TrafficRoutingConfig(BaseModel):
    """botocore's sagemaker ``TrafficRoutingConfig``: UpdateEndpoint's
    ``DeploymentConfig.BlueGreenUpdatePolicy.TrafficRoutingConfiguration``, passed on as dumped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    Type: Literal["ALL_AT_ONCE", "CANARY"]  # LINEAR is not used (nor emulated offline)
    WaitIntervalInSeconds: int = Field(ge=0, le=3600)
    CanarySize: CapacitySize | None = None

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # SageMaker takes no null members: ALL_AT_ONCE carries no CanarySize key at all.
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class EndpointPlan(BaseModel):
    instance_type: str
    instance_count: int
    # CreateEndpointConfig's ProductionVariants, whole: prepare_training adds InferenceAmiVersion on
    # the GPU families whose default driver cannot run the serving image (d2ops_core.platform), and
    # a JSONPath Parameters block cannot add a key conditionally. Empty in plans written before.
    production_variants: list[dict[str, Any]] = Field(default_factory=list)
    # CreateEndpointConfig's DataCaptureConfig, whole (prepare_training.service.data_capture_config): capture
    # off is EnableCapture false, since Parameters cannot leave the key out. None in plans written before.
    data_capture_config: dict[str, Any] | None = None
    poll_seconds: int
    max_wait_attempts: int
    traffic_routing: TrafficRoutingConfig


class ChampionRef(BaseModel):
    run_id: str
    model_data: str
    model_package_arn: str
    primary_metric: str
    primary_value: float


class Plan(BaseModel):
    """``$.plan``: everything later states need. The prepare Lambda returns it; the ASL's
    ResultSelector picks these keys; the notification and the status API read it back."""

    training_job: dict[str, Any]  # a CreateTrainingJob request
    evaluation_job: dict[str, Any]  # a CreateProcessingJob request
    names: JobNames
    gate: GateThresholds
    endpoint: EndpointPlan
    evaluation_report_uri: str
    champion: ChampionRef | None
    # What changed in the data since the champion's run (the full diff: its ``uri``); None without a champion.
    dataset_diff: DatasetDiffSummary | None = None
    # What the jobs read (runs/<run_id>/dataset/) and the validated inventory's digest, which the
    # registry entry and the artifact's metadata record. None in plans written before issue 21.
    dataset_snapshot_uri: str | None = None
    inventory_digest: str | None = None


class _Section(BaseModel):
    # Sections the status API shows whole keep their unmodelled keys ("allow"); the rest ignore them.
    model_config = ConfigDict(extra="allow")


class ValidationSummaryRef(_Section):
    """``$.validation.summary``: the validate Lambda's answer (validate_dataset.models.ValidationSummary),
    or, for a version the Distributed Map checked, Summarize image checks' final one."""

    report_uri: str | None = None
    # True between Validate dataset and Summarize image checks (the Map is checking the images).
    images_pending: bool = False
    image_count: int | None = None
    snapshot_uri: str | None = None
    inventory_uri: str | None = None
    inventory_digest: str | None = None


class ResultWriterRef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Bucket: str
    Key: str  # <Prefix>/<MapRunId>/manifest.json


class ImageCheck(BaseModel):
    """``$.image_check``: the Distributed Map's (Check images) output, as Step Functions writes it."""

    model_config = ConfigDict(extra="ignore")

    MapRunArn: str | None = None
    ResultWriterDetails: ResultWriterRef | None = None


class ValidationSection(BaseModel):
    model_config = ConfigDict(extra="ignore")

    summary: ValidationSummaryRef | None = None


class TrainingResult(BaseModel):
    """``$.training``: selected from DescribeTrainingJob (``Train model`` / ``Read created training job``)."""

    model_config = ConfigDict(extra="ignore")

    job_name: str | None = None
    job_arn: str | None = None
    status: str | None = None
    model_data: str | None = None


class EvaluationJobResult(BaseModel):
    """``$.evaluation_job``: selected from DescribeProcessingJob."""

    model_config = ConfigDict(extra="ignore")

    job_name: str | None = None
    status: str | None = None


class EvaluationSection(_Section):
    """``$.evaluation``: the summarize_evaluation Lambda's answer, selected key by key by the ASL."""

    report_uri: str | None = None
    primary_metric: str | None = None
    challenger_value: float | None = None
    # The gate's comparison (the Lambda's summary): what the notification and the status readers quote.
    interval: DifferenceInterval | None = None
    val_images: int | None = None
    more_val_images: int | None = None
    max_regression: float | None = None


class Registration(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_package_arn: str | None = None


class Deployment(BaseModel):
    """``$.deployment``: written by the create/update endpoint state only when its call succeeded;
    ``started_at`` ($$.State.EnteredTime) is where endpoint time starts to be billed."""

    model_config = ConfigDict(extra="ignore")

    mode: str | None = None  # create (first deployment) or update (blue/green)
    endpoint_arn: str | None = None
    started_at: datetime | None = None

    @field_validator("started_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        # Step Functions writes ...Z; a naive time from an older document is read as UTC.
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class EndpointDescription(_Section):
    """``$.endpoint``: the run's last DescribeEndpoint answer, as SageMaker spells it."""

    EndpointStatus: str | None = None


class ChampionSection(BaseModel):
    """``$.champion`` as far as the readers need it (the full record: d2ops_core.champion.ChampionRecord)."""

    model_config = ConfigDict(extra="ignore")

    endpoint_name: str | None = None


class Failure(_Section):
    """``$.failure``: what a ``Record … failure`` state wrote (error, cause and what the error needs)."""

    error: str
    cause: str | None = None
    report_uri: str | None = None


class RunState(BaseModel):
    """The run's state document (``$``): only the sections the readers use are modelled."""

    model_config = ConfigDict(extra="ignore")

    dataset: DatasetRef | None = Field(None, description="the execution input's dataset (start_pipeline)")
    validation: ValidationSection | None = Field(None, description="'Validate dataset': the validate Lambda's summary")
    image_check: ImageCheck | None = Field(None, description="'Check images': the Distributed Map's results")
    plan: Plan | None = Field(None, description="'Prepare training job': the prepare Lambda's plan")
    training: TrainingResult | None = Field(None, description="'Train model' / 'Read created training job'")
    evaluation_job: EvaluationJobResult | None = Field(
        None, description="'Evaluate challenger and champion' / 'Read created evaluation job'")
    evaluation: EvaluationSection | None = Field(None, description="'Read evaluation report'")
    gate: GateDecision | None = Field(None, description="the quality gate's Pass states")
    registration: Registration | None = Field(None, description="'Register model version'")
    deployment: Deployment | None = Field(None, description="'Create endpoint' / 'Update endpoint (blue/green)'")
    endpoint: EndpointDescription | None = Field(None, description="'Check endpoint status' (DescribeEndpoint)")
    champion: ChampionSection | None = Field(None, description="'Record champion'")
    failure: Failure | None = Field(None, description="a 'Record … failure' Pass state")

    _unreadable: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def unreadable(self) -> dict[str, str]:
        """Sections :meth:`read` left out, each with why (empty when every section read)."""
        return self._unreadable

    @classmethod
    def read(cls, document: Any) -> RunState:
        """Section by section: a malformed section is left out (named in :attr:`unreadable`) and the
        rest still read, so a run with one odd section still answers; a non-object reads as empty."""
        if isinstance(document, RunState):
            return document
        sections = document if isinstance(document, dict) else {}
        values: dict[str, Any] = {}
        unreadable: dict[str, str] = {}
        for name in cls.model_fields:
            value = sections.get(name)
            if value is None:
                continue
            try:  # every section is optional, so one validates on its own
                cls.model_validate({name: value})
            except ValidationError as exc:
                first = exc.errors()[0]
                unreadable[name] = f"$.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
                continue
            values[name] = value
        state = cls.model_validate(values)
        state._unreadable = unreadable
        return state
