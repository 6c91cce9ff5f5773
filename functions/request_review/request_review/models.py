"""The review's two tasks: what "Wait for review" and "Read review decision" pass in, and what the second
gives back (``$.gate``). The documents they write and read are d2ops_core.documents.review's."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.champion import GateDecision
from d2ops_core.documents.review import MAX_TASK_TOKEN
from d2ops_core.platform import APPROVAL_DESCRIPTION_MAX
from d2ops_core.run_ids import RUN_ID_PATTERN

# ReviewTimeoutSeconds' bounds (template.yaml): the state machine's TimeoutSeconds covers the longest.
MIN_TIMEOUT_SECONDS = 60
MAX_TIMEOUT_SECONDS = 1_209_600  # 14 days


class DatasetLabel(BaseModel):
    """The run's ``$.dataset`` as far as the message needs it."""

    model_config = ConfigDict(extra="ignore")

    name: str
    version: str


class RequestReviewEvent(BaseModel):
    """"Wait for review" (``lambda:invoke.waitForTaskToken``): the task token the decision completes, and what
    is to be decided."""

    task_token: str = Field(min_length=1, max_length=MAX_TASK_TOKEN, description="$$.Task.Token")
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    execution_arn: str = Field(min_length=1)
    dataset: DatasetLabel
    model_package_arn: str = Field(min_length=1, description="the registry entry, PendingManualApproval")
    gate_reason: str
    review_because: list[str]
    images_compared: int = Field(ge=0)
    requested_at: datetime = Field(description="when the wait began ($$.State.EnteredTime): its timeout counts "
                                               "from here, and a retried invocation writes the same request")
    timeout_seconds: int = Field(ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS,
                                 description="the wait's TimeoutSeconds (ReviewTimeoutSeconds)")


class RequestAnswer(BaseModel):
    """The invocation's answer: Step Functions records it (TaskSubmitted) and waits on the token."""

    request_uri: str
    expires_at: datetime
    message_id: str


class ReadDecisionEvent(BaseModel):
    """"Read review decision": how the wait ended (``$.review``), and what the gate said."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    review: Any = Field(description="the callback's output (a ReviewDecision, as the status API sends it), or what "
                                    "the wait's Catch recorded: {Error, Cause} of a time-out or a SendTaskFailure")
    timeout_seconds: int = Field(ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS)
    gate_reason: str


class ReviewedGate(GateDecision):
    """``$.gate`` once the review ended: Approved only when a person approved; everything else is Rejected."""

    decision: Literal["approved", "rejected"]
    approval_status: Literal["Approved", "Rejected"]
    approval_description: str = Field(
        max_length=APPROVAL_DESCRIPTION_MAX,
        description="the registry's ApprovalDescription: '<approved|rejected> by <ARN>: <reason>' (or why nobody "
                    "decided), one line, cut to SageMaker's limit")
