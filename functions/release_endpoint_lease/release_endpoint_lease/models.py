"""The endpoint lease item and the event that ends it.

The state machine writes the item (``Acquire endpoint lease``: a conditional UpdateItem) and
releases it on its own exit paths; this function releases it for executions that ended where
no state ran (stopped, timed out). The attribute names below are the item's schema; the ASL
uses the same names (tests/unit/test_endpoint_lease.py checks both sides agree).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KEY_ATTRIBUTE = "endpoint_name"  # the table's hash key: one lease per endpoint
HOLDER_ATTRIBUTE = "holder"  # the holding execution's ARN
ENDED_STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


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


class ReleaseResult(BaseModel):
    execution_arn: str
    endpoint_name: str
    status: str
    action: Literal["released", "not-held", "still-running"]
