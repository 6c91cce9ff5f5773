"""The S3 trigger (functions/start_pipeline) against moto's Step Functions: one run per upload."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops_core import run_ids
from tests.fixtures.pipeline import support

support.function_path("start_pipeline")
from start_pipeline import handler as start_handler  # noqa: E402


@pytest.fixture
def sfn(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("stepfunctions")
        monkeypatch.setenv("STATE_MACHINE_ARN", support.create_state_machine(client))
        yield client


def deliver(event: dict[str, Any]) -> dict[str, Any]:
    return dict(start_handler.handler(event, support.FakeLambdaContext()))


def executions(sfn: Any) -> list[dict[str, Any]]:
    import os

    return list(sfn.list_executions(stateMachineArn=os.environ["STATE_MACHINE_ARN"])["executions"])


def test_the_same_upload_delivered_many_times_starts_one_run(sfn: Any) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    results = [deliver(copy.deepcopy(event)) for _ in range(12)]
    # The run is still RUNNING: duplicates are reported as duplicates, not as "started" again.
    assert [r["action"] for r in results] == ["started"] + ["already-started"] * 11
    assert len({r["run_id"] for r in results}) == 1
    assert len({r["execution_arn"] for r in results}) == 1
    (execution,) = executions(sfn)
    assert execution["name"] == results[0]["run_id"]
    assert execution["name"] == run_ids.run_id_for("shapes", "v1", event["detail"]["object"]["version-id"])
    started = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
    assert started["dataset"] == {"bucket": "d2ops-data-example", "prefix": "datasets/shapes/v1/", "name": "shapes",
                                  "version": "v1", "manifest_key": "datasets/shapes/v1/manifest.json",
                                  "manifest_version": event["detail"]["object"]["version-id"]}
    assert started["trigger"]["source"] == "s3-event"


def test_a_redelivery_after_the_run_ended_starts_nothing(sfn: Any) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    first = deliver(copy.deepcopy(event))
    sfn.stop_execution(executionArn=first["execution_arn"], error="Test", cause="ended")
    for _ in range(3):
        again = deliver(copy.deepcopy(event))
        assert again["action"] == "already-started" and again["run_id"] == first["run_id"]
    assert len(executions(sfn)) == 1


def test_a_changed_reupload_starts_a_second_run(sfn: Any) -> None:
    first = deliver(support.load_event("start_pipeline", "manifest_uploaded"))
    results = [deliver(support.load_event("start_pipeline", "manifest_reuploaded")) for _ in range(3)]
    assert len({r["run_id"] for r in results}) == 1 and results[0]["run_id"] != first["run_id"]
    assert {e["name"] for e in executions(sfn)} == {first["run_id"], results[0]["run_id"]}


def test_an_unversioned_bucket_uses_the_etag(sfn: Any) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    del event["detail"]["object"]["version-id"]
    one = deliver(copy.deepcopy(event))
    event["detail"]["object"]["etag"] = "another-etag"
    other = deliver(event)
    assert one["run_id"] != other["run_id"] and len(executions(sfn)) == 2


@pytest.mark.parametrize("key", [
    "datasets/shapes/v1/images/0001.jpg",
    "datasets/shapes/manifest.json",
    "datasets/shapes/v1/extra/manifest.json",
    "datasets/../v1/manifest.json",
    "other/shapes/v1/manifest.json",
    "datasets/shapes/v1/manifest.json.tmp",
])
def test_other_keys_are_ignored_with_a_reason(sfn: Any, key: str, caplog: pytest.LogCaptureFixture) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    event["detail"]["object"]["key"] = key
    result = deliver(event)
    assert result["action"] == "ignored" and result["run_id"] is None
    assert "datasets/<name>/<version>/manifest.json" in result["reason"] or "relative path" in result["reason"]
    assert executions(sfn) == []


def test_url_encoded_keys_are_decoded(sfn: Any) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    event["detail"]["object"]["key"] = "datasets/street+scenes/2026%2F11/manifest.json"
    result = deliver(event)
    assert result["action"] == "ignored"  # the decoded version contains a slash: not one segment
    event["detail"]["object"]["key"] = "datasets/street+scenes/v%C3%A9/manifest.json"
    result = deliver(event)
    assert result["action"] == "started"
    started = json.loads(sfn.describe_execution(executionArn=result["execution_arn"])["input"])
    assert (started["dataset"]["name"], started["dataset"]["version"]) == ("street scenes", "vé")


def test_a_malformed_event_is_an_error_not_a_run(sfn: Any) -> None:
    event = support.load_event("start_pipeline", "manifest_uploaded")
    del event["detail"]["object"]
    with pytest.raises(Exception, match="object"):
        deliver(event)
    assert executions(sfn) == []


class SameNameSemantics:
    """StartExecution as Step Functions documents it, atomically (moto's backend has no lock).

    A used name returns the original execution while it runs with identical input, and fails
    with ExecutionAlreadyExists otherwise.
    """

    class exceptions:
        class ExecutionAlreadyExists(Exception):
            pass

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.inputs: dict[str, str] = {}

    def start_execution(self, *, stateMachineArn: str, name: str, input: str) -> dict[str, Any]:
        with self.lock:
            if name in self.inputs and self.inputs[name] != input:
                raise self.exceptions.ExecutionAlreadyExists(name)
            self.inputs.setdefault(name, input)
        return {"executionArn": run_ids.execution_arn(stateMachineArn, name), "startDate": 0}


def test_a_hundred_concurrent_duplicate_deliveries_report_one_start() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from start_pipeline.models import ObjectCreatedEvent
    from start_pipeline.service import handle_object_created

    event = ObjectCreatedEvent.model_validate(support.load_event("start_pipeline", "manifest_uploaded"))
    client = SameNameSemantics()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda _: handle_object_created(event, client, support.STATE_MACHINE_ARN),
                                range(100)))
    actions = [r.action for r in results]
    assert actions.count("started") == 1 and actions.count("already-started") == 99
    assert len(client.inputs) == 1 and len({r.run_id for r in results}) == 1


@pytest.mark.parametrize("detail_type", ["Object Deleted", "Object Restore Completed", "object created", ""])
def test_an_event_that_is_not_an_upload_starts_nothing(sfn: Any, detail_type: str) -> None:
    """Only "Object Created" is an upload: a replayed "Object Deleted" of the manifest once started a run."""
    event = support.load_event("start_pipeline", "manifest_uploaded")
    event["detail-type"] = detail_type
    result = deliver(event)
    assert result["action"] == "ignored" and result["run_id"] is None
    assert repr(detail_type) in result["reason"] and "Object Created" in result["reason"]
    assert executions(sfn) == []


def test_a_key_that_is_not_url_encoded_utf8_starts_nothing(sfn: Any) -> None:
    """'%FF' decoded to U+FFFD and started a run of a key S3 cannot hold (it failed later as DatasetNotFound)."""
    event = support.load_event("start_pipeline", "manifest_uploaded")
    event["detail"]["object"]["key"] = "datasets/shapes%FF/v1/manifest.json"
    result = deliver(event)
    assert result["action"] == "ignored" and "not URL-encoded UTF-8" in result["reason"]
    assert executions(sfn) == []
