"""Release the endpoint lease if, and only if, the ended execution still holds it."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from release_endpoint_lease.models import (
    ENDED_STATUSES,
    HOLDER_ATTRIBUTE,
    KEY_ATTRIBUTE,
    ExecutionStatusChange,
    ReleaseResult,
)


def release_lease(dynamodb: Any, table: str, endpoint_name: str, holder: str) -> bool:
    """Delete the lease item when ``holder`` holds it; False when it does not (released, or another run's)."""
    try:
        dynamodb.delete_item(TableName=table, Key={KEY_ATTRIBUTE: {"S": endpoint_name}},
                             ConditionExpression="#holder = :holder",
                             ExpressionAttributeNames={"#holder": HOLDER_ATTRIBUTE},
                             ExpressionAttributeValues={":holder": {"S": holder}})
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise  # throttling or access: fail so EventBridge retries the delivery
    return True


def handle_status_change(event: ExecutionStatusChange, dynamodb: Any, table: str,
                         endpoint_name: str) -> ReleaseResult:
    detail = event.detail
    if detail.status not in ENDED_STATUSES:  # RUNNING, PENDING_REDRIVE: the run may still need its lease
        return ReleaseResult(execution_arn=detail.executionArn, endpoint_name=endpoint_name, status=detail.status,
                             action="still-running")
    released = release_lease(dynamodb, table, endpoint_name, detail.executionArn)
    return ReleaseResult(execution_arn=detail.executionArn, endpoint_name=endpoint_name, status=detail.status,
                         action="released" if released else "not-held")
