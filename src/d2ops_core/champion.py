"""The champion: the model currently serving, recorded as ``champion.json`` in the artifacts bucket.

The state machine's "Promote to champion" step writes this object after a deployment
passed its smoke test (the record is assembled by the "Record champion" state of
``statemachine/training_pipeline.asl.json``; the path tests parse it with
:class:`ChampionRecord`). The prepare Lambda reads it to evaluate the challenger against the
champion, the status API reads it for ``GET /models``. An S3 object in the versioned
artifacts bucket is the simplest record all three can read, online and offline, and its
version history is the history of promotions.

Standard library and pydantic only: Lambdas import this through the CoreLayer.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.s3_probe import read_listed

CHAMPION_KEY = "champion.json"
HISTORY_PREFIX = "endpoint-history/"
MAX_HISTORY_ENTRIES = 1000  # objects read per history answer: years of promotions


class GateDecision(BaseModel):
    """``$.gate``: what the quality gate decided, and, when it asked a person (decision "review"), who decided
    and why ("Read review decision" replaces the review's "PendingManualApproval" with the outcome)."""

    decision: str  # approved | rejected | review (waiting for a person)
    approval_status: str  # the Model Registry status: Approved | Rejected | PendingManualApproval
    reason: str = Field(description="the decision's reason, whole: the gate's, or who decided and why")
    decided_by: str | None = Field(None, description=(
        "the reviewer's IAM ARN when a person decided (the gate sent the model to review); None when the gate's "
        "numbers decided, or when nobody decided before the review timed out"))
    decided_at: str | None = Field(None, description="when the reviewer decided (ISO 8601)")
    review_reason: str | None = Field(None, description="the reviewer's own words")


class ChampionRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str
    dataset: DatasetRef
    model_package_arn: str
    model_name: str
    model_data: str  # s3://.../model.tar.gz, the evaluation job's champion input
    endpoint_name: str
    endpoint_config_name: str
    primary_metric: str
    primary_value: float
    evaluation_uri: str
    gate: GateDecision
    promoted_at: str


class _S3Client(Protocol):
    exceptions: Any

    def get_object(self, **kwargs: Any) -> Any: ...

    def list_objects_v2(self, **kwargs: Any) -> Any: ...


def read_champion(s3: _S3Client, bucket: str) -> ChampionRecord | None:
    """The current champion, or None before the first promotion.

    Existence is asked by listing (:func:`d2ops_core.s3_probe.read_listed`): readers may list only
    ``champion.json``, and a GET of the missing record could answer 403 rather than 404.
    """
    body = read_listed(s3, bucket, CHAMPION_KEY)
    return None if body is None else ChampionRecord.model_validate_json(body)


# ----- endpoint history ---------------------------------------------------------------------
# Append-only: the state machine writes one object per event and never rewrites one (keys
# carry the run id), so the history survives whatever later runs do to champion.json:
#   endpoint-history/<endpoint>/promoted-<run>.json     a ChampionRecord ("Record endpoint history")
#   endpoint-history/<endpoint>/rolled-back-<run>.json  an EndpointRollback ("Record rollback in endpoint history",
#                                                       after the pipeline's or an alarm's rollback)


RolledBackBy = Literal["pipeline", "alarm"]


class EndpointRollback(BaseModel):
    """A deployment that was undone: the run's failure record, as "Record rolled-back deployment" (the
    pipeline's own smoke test or endpoint check failed) or "Record alarm rollback" (SageMaker's
    deployment guardrails rolled the update back because an AutoRollbackConfiguration alarm fired) builds it.
    """

    model_config = ConfigDict(extra="ignore")

    run_id: str
    dataset: DatasetRef
    endpoint_name: str
    model_package_arn: str | None = None
    rolled_back_at: str
    cause: str
    # Records written before alarm rollbacks were recorded carry neither field: they were the pipeline's.
    rolled_back_by: RolledBackBy = Field("pipeline", description=(
        "who decided: 'pipeline' (its smoke test or endpoint check failed) or 'alarm' (SageMaker's auto-rollback)"))
    alarms: list[str] = Field(default_factory=list, description=(
        "the AutoRollbackConfiguration alarms in ALARM when the rollback was seen (empty: none was any more)"))
    kept_serving: str | None = Field(None, description="the endpoint config that went on serving (the old one)")
    rollback: dict[str, Any] | None = Field(None, description="what undoing did (the UpdateEndpoint or its error)")


class ServedPeriod(BaseModel):
    """One model's time on the endpoint, from its promotion to the next one (None: still serving)."""

    run_id: str
    dataset_name: str
    dataset_version: str
    model_package_arn: str
    endpoint_config_name: str
    primary_metric: str
    primary_value: float
    evaluation_uri: str
    promoted_because: str = Field(description="the quality gate's reason when it was promoted")
    approved_by: str | None = Field(None, description="the reviewer's IAM ARN when a person approved it (the gate "
                                                      "sent it to review); None when the gate's numbers did")
    served_from: str
    served_to: str | None = None
    replaced_by_run: str | None = None
    why_replaced: str | None = Field(None, description="the replacing run's gate reason")


class RolledBackAttempt(BaseModel):
    run_id: str
    dataset_name: str
    dataset_version: str
    model_package_arn: str | None
    at: str
    why: str = Field(description="why the deployment was undone")
    action: str | None = Field(None, description="what undoing it did")
    rolled_back_by: RolledBackBy = "pipeline"
    alarms: list[str] = Field(default_factory=list, description="the alarms that made SageMaker roll it back")
    alarm_reasons: list[str] = Field(default_factory=list, description="their StateReason, as CloudWatch gave it")
    kept_serving: str | None = Field(None, description="the endpoint config that went on serving")


class EndpointHistory(BaseModel):
    """What served the endpoint when, newest first, and the deployments that were rolled back."""

    endpoint_name: str
    served: list[ServedPeriod]
    rolled_back: list[RolledBackAttempt]
    unreadable: list[str] = Field(default_factory=list, description=(
        "history objects left out because they are not records the state machine writes, each with why"))


def history_prefix(endpoint_name: str) -> str:
    return f"{HISTORY_PREFIX}{endpoint_name}/"


def build_history(endpoint_name: str, promotions: list[ChampionRecord],
                  rollbacks: list[EndpointRollback], unreadable: list[str] | None = None) -> EndpointHistory:
    """Served periods from the promotions in time order: each ends where the next begins."""
    ordered = sorted(promotions, key=lambda p: p.promoted_at)
    served: list[ServedPeriod] = []
    # [:len] : an endpoint with rollbacks only (its first deployment deleted) has no promotion at all.
    for record, successor in zip(ordered, [*ordered[1:], None][:len(ordered)], strict=True):
        served.append(ServedPeriod(
            run_id=record.run_id, dataset_name=record.dataset.name, dataset_version=record.dataset.version,
            model_package_arn=record.model_package_arn, endpoint_config_name=record.endpoint_config_name,
            primary_metric=record.primary_metric, primary_value=record.primary_value,
            evaluation_uri=record.evaluation_uri, promoted_because=record.gate.reason,
            approved_by=record.gate.decided_by, served_from=record.promoted_at,
            served_to=successor.promoted_at if successor else None,
            replaced_by_run=successor.run_id if successor else None,
            why_replaced=successor.gate.reason if successor else None))
    attempts = [RolledBackAttempt(run_id=r.run_id, dataset_name=r.dataset.name, dataset_version=r.dataset.version,
                                  model_package_arn=r.model_package_arn, at=r.rolled_back_at, why=r.cause,
                                  action=_action(r.rollback), rolled_back_by=r.rolled_back_by, alarms=r.alarms,
                                  alarm_reasons=_alarm_reasons(r.rollback), kept_serving=r.kept_serving)
                for r in sorted(rollbacks, key=lambda r: r.rolled_back_at, reverse=True)]
    return EndpointHistory(endpoint_name=endpoint_name, served=served[::-1], rolled_back=attempts,
                           unreadable=unreadable or [])


def _action(rollback: dict[str, Any] | None) -> str | None:
    if not rollback:
        return None
    if rollback.get("action"):
        return str(rollback["action"])
    if rollback.get("Error"):  # undoing failed: the Catch's error record
        return f"undoing failed: {rollback['Error']}"
    return None


def _alarm_reasons(rollback: dict[str, Any] | None) -> list[str]:
    reasons = (rollback or {}).get("alarm_reasons") or []
    return [str(r) for r in reasons] if isinstance(reasons, list) else [str(reasons)]


class _S3Lister(_S3Client, Protocol):
    def get_paginator(self, operation_name: str) -> Any: ...


def read_endpoint_history(s3: _S3Lister, bucket: str, endpoint_name: str) -> EndpointHistory | None:
    """The endpoint's history from its append-only records, or None when it has none."""
    prefix = history_prefix(endpoint_name)
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
        if len(keys) >= MAX_HISTORY_ENTRIES:
            break
    if not keys:
        return None
    promotions: list[ChampionRecord] = []
    rollbacks: list[EndpointRollback] = []
    unreadable: list[str] = []
    for key in keys[:MAX_HISTORY_ENTRIES]:
        name = key[len(prefix):]
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        try:
            if name.startswith("promoted-"):
                promotions.append(ChampionRecord.model_validate_json(body))
            elif name.startswith("rolled-back-"):
                rollbacks.append(EndpointRollback.model_validate_json(body))
        except ValidationError as exc:
            # One bad object (written by hand, truncated) must not hide the rest of the audit trail.
            problem = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in problem["loc"]) or "document"
            unreadable.append(f"s3://{bucket}/{key}: not an endpoint history record ({where}: {problem['msg']})")
    return build_history(endpoint_name, promotions, rollbacks, unreadable)
