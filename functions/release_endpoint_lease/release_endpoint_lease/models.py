"""The endpoint lease item, the run's jobs, and the event that ends the run.

The state machine writes the item (``Acquire endpoint lease``: a conditional UpdateItem) and
releases it on its own exit paths; this function releases it for executions that ended where
no state ran (stopped, timed out). The attribute names below are the item's schema; the ASL
uses the same names (tests/unit/test_endpoint_lease.py checks both sides agree).

It also stops the run's SageMaker jobs still running when the execution ended abnormally: a
``.sync`` state stops its job itself, but the wait for a job whose create response was lost
("Training job already created?" ...) is a Describe loop, which stopping the execution just ends.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.sagemaker_jobs import JobKind

KEY_ATTRIBUTE = "endpoint_name"  # the table's hash key: one lease per endpoint
HOLDER_ATTRIBUTE = "holder"  # the holding execution's ARN
ENDED_STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
# An execution that ended this way may have left a job running (a succeeded run waited for both).
ABNORMAL_END_STATUSES = ("FAILED", "TIMED_OUT", "ABORTED")


class ExecutionStatusDetail(BaseModel):
    model_config = ConfigDict(extra="ignore")

    executionArn: str = Field(min_length=1)
    stateMachineArn: str = Field(min_length=1)
    name: str
    status: str


class ExecutionStatusChange(BaseModel):
    """EventBridge "Step Functions Execution Status Change" (only the fields this function reads)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    source: Literal["aws.states"]
    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    detail: ExecutionStatusDetail


class JobStop(BaseModel):
    """What became of one of the run's jobs."""

    kind: JobKind
    name: str
    action: Literal["stopped", "not-running", "not-found", "not-ours"]
    status: str | None = Field(default=None, description="the job's status when it was looked at")


class ReleaseResult(BaseModel):
    execution_arn: str
    endpoint_name: str
    status: str
    action: Literal["released", "not-held", "still-running"]
    jobs: list[JobStop] = Field(default_factory=list, description="the run's jobs, after an abnormal end")
