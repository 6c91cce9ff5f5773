"""The endpoint lease: the release Lambda against moto's DynamoDB, and its schema as the ASL uses it."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parser import ValidationError
from moto import mock_aws

from d2ops import template as sam
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("release_endpoint_lease")
from release_endpoint_lease import handler as release_handler  # noqa: E402
from release_endpoint_lease.models import ENDED_STATUSES, HOLDER_ATTRIBUTE, KEY_ATTRIBUTE  # noqa: E402

EVENT = support.load_event("release_endpoint_lease", "execution_aborted")
HOLDER = EVENT["detail"]["executionArn"]
STATES = all_states(json.loads(support.DEFINITION.read_text()))


@pytest.fixture
def dynamodb(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    monkeypatch.setenv("LEASE_TABLE_NAME", support.LEASE_TABLE)
    monkeypatch.setenv("ENDPOINT_NAME", support.ENDPOINT_NAME)
    monkeypatch.setenv("ARTIFACTS_BUCKET", support.ARTIFACTS_BUCKET)
    with mock_aws():
        client = boto3.client("dynamodb")
        props = sam.load_template().resource("EndpointLeaseTable")["Properties"]
        client.create_table(TableName=support.LEASE_TABLE, KeySchema=props["KeySchema"],
                            AttributeDefinitions=props["AttributeDefinitions"], BillingMode=props["BillingMode"])
        yield client


def hold(dynamodb: Any, holder: str) -> None:
    dynamodb.put_item(TableName=support.LEASE_TABLE, Item={KEY_ATTRIBUTE: {"S": support.ENDPOINT_NAME},
                                                          HOLDER_ATTRIBUTE: {"S": holder}})


def holder(dynamodb: Any) -> str | None:
    item = dynamodb.get_item(TableName=support.LEASE_TABLE, Key={KEY_ATTRIBUTE: {"S": support.ENDPOINT_NAME}},
                             ConsistentRead=True).get("Item")
    return item[HOLDER_ATTRIBUTE]["S"] if item else None


def deliver(event: dict[str, Any]) -> dict[str, Any]:
    return dict(release_handler.handler(event, support.FakeLambdaContext()))


def test_a_stopped_execution_releases_the_lease_it_holds(dynamodb: Any) -> None:
    hold(dynamodb, HOLDER)
    result = deliver(EVENT)
    assert result["action"] == "released"
    # It looked for the run's jobs too (SageMaker on moto knows none: the run never got that far).
    assert [(j["kind"], j["action"]) for j in result["jobs"]] == [("training", "not-found"),
                                                                  ("processing", "not-found")]
    assert holder(dynamodb) is None
    assert deliver(EVENT)["action"] == "not-held"  # EventBridge may deliver twice


def test_another_runs_lease_is_left_alone(dynamodb: Any) -> None:
    other = HOLDER.rpartition(":")[0] + ":shapes-v2-0123456789abcdef"
    hold(dynamodb, other)
    assert deliver(EVENT)["action"] == "not-held"
    assert holder(dynamodb) == other


def test_a_running_execution_keeps_its_lease(dynamodb: Any) -> None:
    hold(dynamodb, HOLDER)
    running = copy.deepcopy(EVENT)
    running["detail"]["status"] = "RUNNING"
    assert deliver(running)["action"] == "still-running"
    assert holder(dynamodb) == HOLDER


def test_an_event_that_is_not_an_execution_status_change_is_refused(dynamodb: Any) -> None:
    wrong = copy.deepcopy(EVENT)
    wrong["detail-type"] = "Object Created"
    with pytest.raises(ValidationError, match="detail-type"):
        deliver(wrong)


def test_the_state_machine_and_the_function_agree_on_the_item_and_the_statuses() -> None:
    for name in ("Acquire endpoint lease", "Read endpoint lease", "Clear stale endpoint lease",
                 "Release endpoint lease", "Release endpoint lease after failure"):
        params = STATES[name]["Parameters"]
        assert list(params["Key"]) == [KEY_ATTRIBUTE], name
        assert params["ExpressionAttributeNames"] == {"#holder": HOLDER_ATTRIBUTE}, name
    assert STATES["Endpoint lease still held?"]["Choices"][0]["Variable"] == f"$.lease_holder.Item.{HOLDER_ATTRIBUTE}.S"
    tpl = sam.load_template()
    (key,) = tpl.resource("EndpointLeaseTable")["Properties"]["KeySchema"]
    assert key["AttributeName"] == KEY_ATTRIBUTE
    rule = tpl.resource("ReleaseEndpointLeaseFunction")["Properties"]["Events"]["ExecutionEnded"]["Properties"]
    assert sorted(rule["Pattern"]["detail"]["status"]) == sorted(ENDED_STATUSES)
