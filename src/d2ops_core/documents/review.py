"""A person's review of a challenger the quality gate could not settle (decision "review").

- :class:`ReviewRequest`: ``runs/<run id>/review/request.json``, written by the ``request_review`` Lambda
  (the "Wait for review" Task, ``lambda:invoke.waitForTaskToken``) with the task token the decision
  completes; read by the status API's ``POST /runs/{runId}/decision``.
- :class:`ReviewDecision`: what the decider sent, the callback's output (``SendTaskSuccess``), recorded
  as ``runs/<run id>/review/decision.json``, in the run (``$.review``), the registry entry's
  ``ApprovalDescription`` and the endpoint history.

The task token is a bearer secret for completing the task: only the review request holds it, in the
encrypted artifacts bucket, readable by the status API's role.
Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.run_ids import RUN_ID_PATTERN

# botocore's stepfunctions model: taskToken is 1-2048 characters; SendTaskSuccess's output at most 256 KiB.
MAX_TASK_TOKEN = 2048
# A reason a person can read in one go; the registry's ApprovalDescription ("<verb> by <arn>: <reason>", 1,024
# characters) keeps what fits of it, cut visibly, and the run and the decision record keep it whole.
MAX_REASON = 1000

Verdict = Literal["approved", "rejected"]


class ReviewRequest(BaseModel):
    """A run waiting for a person: where to send the decision and what it is about."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    execution_arn: str
    task_token: str = Field(min_length=1, max_length=MAX_TASK_TOKEN)
    requested_at: datetime
    expires_at: datetime = Field(description="when the wait times out and the model is refused")
    model_package_arn: str = Field(description="the registry entry, PendingManualApproval until decided")
    gate_reason: str = Field(description="why the numbers could not settle it (the gate's reason)")
    review_because: list[str] = Field(description="the gate's review reasons (d2ops_core.gate_decision)")


class ReviewDecision(BaseModel):
    """A person's decision: the callback's output and the run's record of who decided and why."""

    model_config = ConfigDict(extra="forbid")

    decision: Verdict
    decided_by: str = Field(min_length=1, max_length=2048, description="the caller's IAM ARN, as API Gateway saw it")
    reason: str = Field(min_length=1, max_length=MAX_REASON)
    decided_at: datetime
