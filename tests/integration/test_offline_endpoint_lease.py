"""A stopped run gives the endpoint lease back: no state of the run runs after StopExecution, so the
release comes from ReleaseEndpointLeaseFunction on EventBridge's execution status change, which the
offline runtime delivers to the rules of template.yaml as EventBridge would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.sagemaker import JobOutcome
from tests.fixtures.offline.support import tiny_dataset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class HeldTraining:
    """A training job that runs until it is stopped (the run is stopped while it trains)."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        self.started.set()
        stop.wait(120)
        return JobOutcome(failure_reason="stopped")

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        raise AssertionError("a stopped run evaluates nothing")


def _until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_a_stopped_run_gives_its_endpoint_lease_back(tmp_path: Path) -> None:
    jobs = HeldTraining()
    with OfflineRuntime(tmp_path / "work", jobs=jobs) as rt:
        dynamodb, sfn = rt.client("dynamodb"), rt.client("stepfunctions")
        (table,) = rt.stack.tables
        key = {"endpoint_name": {"S": rt.stack.endpoint_name}}

        def holder() -> str | None:
            item = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
            return item["holder"]["S"] if item else None

        dataset = tiny_dataset(tmp_path / "datasets", "tiny", "v1", images=8, size=64)
        manifest_key, _ = rt.upload_dataset(dataset)
        started = rt.deliver_event(rt.upload_event(rt.stack.data_bucket, manifest_key))
        assert started is not None and started["action"] == "started", started
        arn = started["execution_arn"]
        assert jobs.started.wait(90), "the run never reached training"
        assert holder() == arn  # it trains under the lease

        sfn.stop_execution(executionArn=arn, error="Operator", cause="stopped by the test")
        assert sfn.describe_execution(executionArn=arn)["status"] == "ABORTED"
        _until(lambda: holder() is None, 20, "the stopped run's lease released")
