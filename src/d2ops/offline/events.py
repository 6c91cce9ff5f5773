"""S3 "Object Created" events as EventBridge delivers them, and the rule's event pattern.

The offline runtime builds the event from the uploaded object's real metadata (size, ETag,
version id) and delivers it to the function the template's ``EventBridgeRule`` targets only
if the rule's pattern (from template.yaml) matches, as EventBridge would.
"""

from __future__ import annotations

import fnmatch
import uuid
from datetime import UTC, datetime
from typing import Any


def object_created_event(bucket: str, key: str, head: dict[str, Any], region: str, account_id: str,
                         sequencer: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"key": key, "size": int(head.get("ContentLength", 0)),
                           "etag": str(head.get("ETag", "")).strip('"'), "sequencer": f"{sequencer:018X}"}
    if head.get("VersionId"):
        obj["version-id"] = head["VersionId"]
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Object Created", "source": "aws.s3",
        "account": account_id, "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "region": region,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {"version": "0", "bucket": {"name": bucket}, "object": obj,
                   "request-id": uuid.uuid4().hex[:16].upper(), "requester": account_id,
                   "source-ip-address": "127.0.0.1", "reason": "PutObject"},
    }


def execution_status_change_event(described: dict[str, Any], region: str, account_id: str) -> dict[str, Any]:
    """EventBridge's "Step Functions Execution Status Change" for a DescribeExecution answer."""

    def millis(value: Any) -> int | None:
        return int(value.timestamp() * 1000) if isinstance(value, datetime) else None

    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states", "account": account_id, "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region, "resources": [described["executionArn"]],
        "detail": {"executionArn": described["executionArn"], "stateMachineArn": described["stateMachineArn"],
                   "name": described["name"], "status": described["status"],
                   "startDate": millis(described.get("startDate")), "stopDate": millis(described.get("stopDate")),
                   "input": described.get("input"), "output": described.get("output"),
                   "error": described.get("error"), "cause": described.get("cause")},
    }


def _value_matches(value: Any, rule: Any) -> bool:
    if isinstance(rule, dict):
        if "wildcard" in rule:
            return isinstance(value, str) and fnmatch.fnmatchcase(value, rule["wildcard"])
        if "prefix" in rule:
            return isinstance(value, str) and value.startswith(rule["prefix"])
        if "suffix" in rule:
            return isinstance(value, str) and value.endswith(rule["suffix"])
        if "anything-but" in rule:
            excluded = rule["anything-but"]
            return value not in (excluded if isinstance(excluded, list) else [excluded])
        if "exists" in rule:
            return (value is not None) == bool(rule["exists"])
        raise ValueError(f"event pattern operator {sorted(rule)} is not supported offline")
    return bool(value == rule)


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge matching: every pattern field must match; a list means any of its values."""
    for field, rule in pattern.items():
        value = event.get(field) if isinstance(event, dict) else None
        if isinstance(rule, dict) and not any(k in rule for k in ("wildcard", "prefix", "suffix", "anything-but",
                                                                  "exists")):
            if not isinstance(value, dict) or not matches(rule, value):
                return False
        elif isinstance(rule, list):
            if not any(_value_matches(value, r) for r in rule):
                return False
        elif not _value_matches(value, rule):
            return False
    return True
