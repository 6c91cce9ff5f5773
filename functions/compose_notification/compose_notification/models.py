"""What the "Compose … notification" states pass in (parts of the run's state document) and get back."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.cost import RunCost

# SNS Publish: a Subject must be "less than 100 characters long", with no line breaks or control
# characters (botocore's model); we also keep it ASCII for mail clients.
MAX_SUBJECT = 99


class PlanNames(BaseModel):
    model_config = ConfigDict(extra="ignore")

    training_job: str | None = None
    evaluation_job: str | None = None
    endpoint_config: str | None = None


class PlanEndpoint(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instance_type: str | None = None
    instance_count: int = 1


class PlanRef(BaseModel):
    """``$.plan`` as the prepare Lambda built it: the names and endpoint settings pricing needs."""

    model_config = ConfigDict(extra="ignore")

    names: PlanNames = Field(default_factory=PlanNames)
    endpoint: PlanEndpoint = Field(default_factory=PlanEndpoint)


class DeploymentRef(BaseModel):
    """``$.deployment``: the create/update state's result; ``started_at`` is when it was entered."""

    model_config = ConfigDict(extra="ignore")

    mode: str | None = None
    started_at: datetime | None = None


class DatasetName(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = "?"
    version: str = "?"


class FailureRef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    error: str


class RunDocument(BaseModel):
    """The run's state document (``$``); only what the notification reads is modelled."""

    model_config = ConfigDict(extra="ignore")

    dataset: DatasetName = Field(default_factory=DatasetName)
    plan: PlanRef | None = None
    deployment: DeploymentRef | None = None
    failure: FailureRef | None = None


class NotificationEvent(BaseModel):
    outcome: Literal["succeeded", "failed"]
    run_id: str = Field(min_length=1, max_length=80)
    at: datetime = Field(description="when the notification is composed ($$.State.EnteredTime): the endpoint "
                                     "time so far ends here")
    document: RunDocument


class NotificationFields(BaseModel):
    """Merged into the notification's JSON message, beside the failure or champion record."""

    cost: RunCost | None = Field(description="the run's SageMaker cost (d2ops_core.cost); None when unknown")
    cost_summary: str = Field(description="one line for people: the total and its parts, or why it is unknown")
    cost_unknown: str | None = Field(None, description="why the cost (or part of it) could not be computed")


class Notification(BaseModel):
    subject: str = Field(max_length=MAX_SUBJECT, pattern=r"^[\x20-\x7e]+$")
    fields: NotificationFields

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
