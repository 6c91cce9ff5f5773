"""Request and response models of the status API (they generate docs/status-api.openapi.json)."""

from __future__ import annotations

import unicodedata
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from d2ops_core.champion import ChampionRecord
from d2ops_core.cost import RunCost
from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.documents.dataset_diff import DatasetDiffSummary
from d2ops_core.documents.error_analysis import ErrorAnalysis
from d2ops_core.documents.evaluation import Comparison, HeldOutImages
from d2ops_core.documents.monitoring import MonitoringWindow
from d2ops_core.documents.review import MAX_REASON, ReviewDecision
from d2ops_core.documents.training_curve import TrainingProgress
from d2ops_core.evaluation_curves import PrCurves
from status_api.response_budget import DROPS

RunStatus = Literal["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"]
ENDPOINT_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"  # SageMaker's EndpointName


class RunSummary(BaseModel):
    run_id: str
    dataset_name: str | None = Field(description="the dataset name as it appears in the run id")
    dataset_version: str | None
    status: str
    started_at: str
    stopped_at: str | None = None


class RunList(BaseModel):
    runs: list[RunSummary]
    next_token: str | None = Field(None, description="pass as nextToken for the next page")


class StateStep(BaseModel):
    name: str
    status: Literal["running", "succeeded", "failed"]
    entered_at: str
    exited_at: str | None = None
    duration_seconds: float | None = None
    error: str | None = None


class TrainingInfo(BaseModel):
    job_name: str
    status: str | None = None
    secondary_status: str | None = None
    failure_reason: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    model_data: str | None = None
    progress: TrainingProgress | None = Field(
        None, description="iteration, loss, learning rate, time left and the loss curve, once the job has "
                          "published its first training metrics (none before, or when CloudWatch cannot be read); "
                          "a job that ended is read from CloudWatch once and its curve kept in S3")


class EndpointInfo(BaseModel):
    name: str | None = None
    mode: str | None = Field(None, description="create (first deployment) or update (blue/green)")
    status: str | None = None
    endpoint_config: str | None = None


class ReviewView(BaseModel):
    """A run the gate sent to a person: what it waits for, or who decided what, why and when."""

    status: Literal["requested", "waiting", "approved", "rejected", "not decided"] = Field(
        description="requested: the gate said review and the run is entering its wait; waiting: a reviewer may "
                    "decide now (POST /runs/{runId}/decision); approved / rejected: decided (decided_by, reason, "
                    "decided_at); not decided: the run stopped waiting without a decision (timed out at expires_at, "
                    "or the run ended)")
    gate_reason: str | None = Field(None, description="why the numbers could not settle it (the gate's reason)")
    review_because: list[str] = Field(default_factory=list, description=(
        "the gate's review reasons: uncertain, class_dropped, too_few_images, champion_training_unknown"))
    images_compared: int | None = Field(None, description="held-out val images both models were compared on")
    images_excluded: int | None = Field(None, description="val images left out because a model trained on them")
    requested_at: datetime | None = Field(None, description="when the run started waiting")
    expires_at: datetime | None = Field(None, description="when the wait times out and the model is refused")
    model_package_arn: str | None = Field(None, description="the registry entry, PendingManualApproval until decided")
    decided_by: str | None = Field(None, description="the reviewer's IAM ARN, as API Gateway saw the caller")
    reason: str | None = None
    decided_at: datetime | None = None


class RunDetail(BaseModel):
    run_id: str
    execution_arn: str
    status: str
    started_at: str
    stopped_at: str | None = None
    dataset: DatasetRef | None = None
    current_state: str | None = Field(None, description="the state the run is in (running runs)")
    timeline: list[StateStep]
    validation: dict[str, Any] | None = Field(None, description="the validation summary (full report at report_uri)")
    training: TrainingInfo | None = None
    evaluation: dict[str, Any] | None = None
    gate: dict[str, Any] | None = Field(None, description="decision, approval_status and reason")
    model_package_arn: str | None = None
    endpoint: EndpointInfo | None = None
    failure: dict[str, Any] | None = Field(None, description="what the pipeline recorded before failing")
    error: str | None = None
    cause: str | None = None
    dataset_diff: DatasetDiffSummary | None = Field(
        None, description="what changed in the data since the champion's run (the full diff at its uri; None: no "
                          "champion, or the run has not prepared training yet)")
    cost: RunCost | None = Field(None, description="SageMaker instance time x price: training (with spot savings), "
                                                   "evaluation and the endpoint during the run")
    review: ReviewView | None = Field(None, description="a person's review, for runs the gate sent to one (None "
                                                        "otherwise)")


class StartRunRequest(BaseModel):
    dataset_uri: str = Field(pattern=r"^s3://[^/]+/datasets/[^/]+/[^/]+/?(manifest\.json)?$",
                             description="s3://<DataBucket>/datasets/<name>/<version>/",
                             examples=["s3://my-data-bucket/datasets/shapes/v1/"])


class StartRunResponse(BaseModel):
    run_id: str
    execution_arn: str
    already_started: bool = Field(description="true when this upload's run existed already (idempotent)")


class DecisionRequest(BaseModel):
    """``POST /runs/{runId}/decision``: a reviewer's decision on a run waiting for review."""

    model_config = ConfigDict(extra="forbid")  # a misspelt "reason" is an error, not a silent default

    decision: Literal["approve", "reject"]
    reason: str | None = Field(None, min_length=1, max_length=MAX_REASON, description=(
        "why (required to reject; approving without one records \"approved\"): one line, recorded in the run, "
        "the registry entry's ApprovalDescription and the endpoint history"), examples=["checked the drop by hand"])

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value:
            raise ValueError("the reason is blank")
        # The reason lands in one-line places (the registry's description, the notification, logs).
        if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
            raise ValueError("the reason must be one line of printable text (no control or format characters)")
        return value

    @model_validator(mode="after")
    def _reject_says_why(self) -> DecisionRequest:
        if self.decision == "reject" and self.reason is None:
            raise ValueError("a rejection needs a reason (1-1000 characters)")
        return self


class DecisionResponse(ReviewDecision):
    """The decision the run received (the callback's output, recorded at runs/<run id>/review/decision.json)."""

    run_id: str
    already_decided: bool = Field(description="true when this answers a repeated request: the same caller's same "
                                              "decision was recorded before (a retry after a lost answer)")


class ModelVersion(BaseModel):
    model_package_arn: str
    version: int | None = None
    approval_status: str
    created_at: str
    description: str | None = None


class ModelsResponse(BaseModel):
    champion: ChampionRecord | None
    versions: list[ModelVersion]
    next_token: str | None = None


class ErrorResponse(BaseModel):
    """What 400 and 404 answers carry (Powertools' error shape)."""

    statusCode: int  # the wire name Powertools uses
    message: str


class GraphNode(BaseModel):
    name: str
    kind: str = Field(description="the ASL state type")
    status: Literal["succeeded", "failed", "caught", "running", "not reached"]
    x: float
    y: float
    duration_seconds: float | None = Field(None, description="time in the state (the last visit when it looped)")


class GraphEdge(BaseModel):
    source: str
    target: str
    kind: Literal["next", "choice", "default", "catch"]
    taken: bool = Field(description="the run went this way")


class GraphLine(BaseModel):
    """One line of a stage (d2ops_core.stage_timeline.Line): a state's visit, or a loop's rounds as one."""

    title: str = Field(description="the state's name, or the loop's when ``loop`` (its rounds in ``rounds``)")
    status: Literal["succeeded", "missed", "caught", "failed", "running"] = Field(
        description="missed: an error the definition expects (d2ops_core.pipeline_stages.EXPECTED_MISSES)")
    states: list[str] = Field(description="the states this line stands for")
    rounds: int = Field(description="the loop's rounds, or the visits of a state entered several times in a row")
    loop: bool
    duration_seconds: float | None
    error: str | None = None
    note: str | None = Field(None, description="what an expected miss meant")


class GraphStage(BaseModel):
    """A stage of the pipeline (d2ops_core.pipeline_stages.STAGES) with the run's way through it."""

    key: str
    title: str
    status: Literal["succeeded", "caught", "failed", "running", "not reached"]
    duration_seconds: float | None
    lines: list[GraphLine] = Field(description="the states the run went through here, in order")
    folded: list[str] = Field(description="the stage's states the run never entered")
    next_stages: list[str] = Field(description="keys of the stages the run went to from this one")


class RunGraph(BaseModel):
    """The state machine laid out (d2ops_core.state_graph), each state with its outcome in this run."""

    run_id: str
    width: float
    height: float
    box_width: float
    box_height: float
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    stages: list[GraphStage] = Field(default_factory=list, description=(
        "the run by stage, what the console draws: every stage in the pipeline's order, the states the run "
        "went through in each (loops as one line), the ones it never reached folded"))


class ModelScoresView(BaseModel):
    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]] = Field(default_factory=dict)


class ReportLink(BaseModel):
    """One S3 document of the evaluation report, to download whole (a presigned GET of the artifacts bucket)."""

    name: Literal["evaluation", "pr_curves", "errors"] = Field(
        description="evaluation: evaluation.json (metrics, per-class tables, comparison); pr_curves: "
                    "report/pr_curves.json; errors: report/errors.json")
    uri: str = Field(description="the document's s3:// URI")
    url: str = Field(description="a presigned HTTPS GET of it, no signing needed; valid until expires_at (or "
                                 "sooner, when the status API's own credentials expire first)")
    expires_at: datetime


class EvaluationView(BaseModel):
    """The run's evaluation report (evaluation.json) with its precision-recall curves (pr_curves.json) and
    error analysis (errors.json)."""

    report_uri: str
    primary_metric: str
    val_images: int
    challenger: ModelScoresView
    champion: ModelScoresView | None = None
    held_out: HeldOutImages | None = Field(
        None, description="which val images the comparison used: those neither model was trained on (None without "
                          "a champion, and in reports written before they were counted)")
    comparison: Comparison | None = Field(
        None, description="challenger - champion by a paired bootstrap over the held-out val images: the interval "
                          "the gate judged, overall and per judged class, and every class's point APs (None "
                          "without a champion)")
    pr_curves: PrCurves | None = Field(None, description="absent for reports written before the curves were kept")
    errors: ErrorAnalysis | None = Field(None, description="AP by object size, confusion matrix with background, "
                                         "the worst val images drawn; absent for reports written before it")
    truncated: bool = Field(False, description=(
        "the whole report would not fit one answer (Lambda answers at most 6 MB): the parts named in left_out are "
        "left out (emptied or null), and full_report links the documents that hold them"))
    left_out: list[str] = Field(default_factory=list, description=(
        "the parts left out of a truncated answer, in the order they are given up (the largest and least needed "
        "first): " + ", ".join(name for name, _ in DROPS)))
    full_report: list[ReportLink] = Field(default_factory=list, description=(
        "a truncated answer's documents, each linked whole (empty when nothing was left out)"))


class WindowProblem(BaseModel):
    key: str = Field(description="the window's S3 object, s3://...")
    message: str = Field(description="why it is left out (one line)")


class MonitoringView(BaseModel):
    """``GET /endpoints/{endpointName}/monitoring``: the monitor's windows (d2ops_core.documents.monitoring)."""

    endpoint: str
    windows: list[MonitoringWindow] = Field(description="newest first: each statistic's test value against its "
                                                        "threshold, and the window's verdict")
    problems: list[WindowProblem] = Field(default_factory=list, description=(
        "window objects in the range that are not monitoring windows of this endpoint, left out"))
    older_windows: bool = Field(False, description="the range holds windows older than the oldest answered (raise "
                                                   "limit, or pass to=)")
    truncated: bool = Field(False, description=(
        "the oldest of the windows asked for are left out: with them the answer would pass Lambda's 6 MB"))
