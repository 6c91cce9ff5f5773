"""The "Wait for review" Lambda (functions/request_review): the run's review request, with its task token,
written where the status API's decision route reads it, and one message telling people what to decide, why,
until when and how; read back from moto's S3 and through an SQS subscription of the topic, as a subscriber
gets it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from d2ops import template as sam
from d2ops_core.documents.review import ReviewRequest
from d2ops_core.s3_layout import review_request_key
from tests.fixtures.pipeline import support

support.function_path("request_review")
from request_review import handler as request_handler  # noqa: E402
from request_review.models import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS, RequestReviewEvent  # noqa: E402

EVENT = support.load_event("request_review", "wait_for_review")
RUN = EVENT["run_id"]
BUCKET = support.ARTIFACTS_BUCKET
STACK = "d2ops-dev"


class World:
    def __init__(self) -> None:
        self.s3, self.sns, self.sqs = boto3.client("s3"), boto3.client("sns"), boto3.client("sqs")
        self.s3.create_bucket(Bucket=BUCKET)
        self.topic = self.sns.create_topic(Name="d2ops-notifications")["TopicArn"]
        self.queue = self.sqs.create_queue(QueueName="subscriber")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=arn)

    def invoke(self, **changes: Any) -> dict[str, Any]:
        return dict(request_handler.handler({**EVENT, **changes}, support.FakeLambdaContext()))

    def request_bytes(self) -> bytes:
        return bytes(self.s3.get_object(Bucket=BUCKET, Key=review_request_key(RUN))["Body"].read())

    def messages(self) -> list[tuple[str, dict[str, Any]]]:
        got = self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages", [])
        return [(json.loads(m["Body"])["Subject"], json.loads(json.loads(m["Body"])["Message"])) for m in got]


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    support.aws_env(monkeypatch)
    with mock_aws():
        w = World()
        monkeypatch.setenv("ARTIFACTS_BUCKET", BUCKET)
        monkeypatch.setenv("NOTIFICATION_TOPIC_ARN", w.topic)
        monkeypatch.setenv("STACK_NAME", STACK)
        yield w


def test_the_request_holds_the_token_and_expires_when_the_wait_times_out(world: World) -> None:
    answer = world.invoke()
    request = ReviewRequest.model_validate_json(world.request_bytes())  # what POST /runs/{runId}/decision reads
    event = RequestReviewEvent.model_validate(EVENT)
    assert request.task_token == EVENT["task_token"] and request.run_id == RUN
    assert request.execution_arn == EVENT["execution_arn"] and request.model_package_arn == EVENT["model_package_arn"]
    assert (request.gate_reason, request.review_because) == (EVENT["gate_reason"], ["uncertain"])
    # Counted from the wait's start, as Step Functions counts TimeoutSeconds: not from the Lambda's clock.
    assert request.requested_at == event.requested_at
    assert request.expires_at == event.requested_at + timedelta(seconds=604800)
    assert answer["request_uri"] == f"s3://{BUCKET}/runs/{RUN}/review/request.json"


def test_people_are_told_what_to_decide_why_until_when_and_how_but_never_the_token(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.invoke()
    ((subject, message),) = world.messages()
    assert subject == "d2ops: review needed: shapes v2 (until 2026-11-30 09:30 UTC)"
    assert len(subject) < 100 and subject.isascii()
    assert message["event"] == "review requested" and message["run_id"] == RUN
    assert message["expires_at"] == "2026-11-30T09:30:12.345000Z"
    assert EVENT["gate_reason"] in message["summary"] and "refused" in message["summary"]
    assert message["review_because"] == ["uncertain"] and message["images_compared"] == 84
    assert message["model_package_arn"] == EVENT["model_package_arn"]
    assert "7 days" in message["if_nobody_decides"]
    how = message["how_to_decide"]
    assert how[0] == f"d2ops approve {RUN} [--reason TEXT] --stack {STACK}"
    assert how[1] == f"d2ops reject {RUN} --reason TEXT --stack {STACK}"
    assert how[2].startswith(f"POST /runs/{RUN}/decision on the stack's status API")
    assert how[3] == f"d2ops console --stack {STACK}: the run's Review panel, Approve / Reject"
    # The token completes the task: a bearer secret kept in the encrypted bucket, not in mail or logs.
    assert EVENT["task_token"] not in json.dumps(message) and EVENT["task_token"] not in capsys.readouterr().out


def test_an_invocation_run_twice_writes_the_same_request_and_a_retry_s_new_token_replaces_it(world: World) -> None:
    """Lambda may run an invocation twice with the same token; a Step Functions retry of the task brings a new
    token, and only that one completes the task now. Mutation: the request's time taken from the clock."""
    world.invoke()
    first = world.request_bytes()
    world.invoke()
    assert world.request_bytes() == first
    world.invoke(task_token="AQCEAAAAKgAAAAMAAAAAAAAAAfRetriedAttemptsToken")
    assert ReviewRequest.model_validate_json(world.request_bytes()).task_token.endswith("RetriedAttemptsToken")


def test_people_are_told_only_once_the_request_is_written(world: World) -> None:
    """A message that sends people to decide on a run whose request is missing would get them a 404."""
    world.s3.delete_bucket(Bucket=BUCKET)
    with pytest.raises(Exception, match="NoSuchBucket"):
        world.invoke()
    assert world.messages() == []


def test_the_wait_s_bounds_are_the_stack_parameter_s() -> None:
    """The Lambda refuses a timeout the stack could not have set (and the machine's time limit covers the
    largest one: tests/unit/test_pipeline_definition.py)."""
    parameter = sam.load_template().document["Parameters"]["ReviewTimeoutSeconds"]
    assert (parameter["MinValue"], parameter["MaxValue"], parameter["Default"]) == (
        MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS, 604800)
    with pytest.raises(ValidationError, match="timeout_seconds"):
        RequestReviewEvent.model_validate({**EVENT, "timeout_seconds": MAX_TIMEOUT_SECONDS + 1})


def test_the_function_may_write_only_the_review_request_and_publish_to_the_topic() -> None:
    from tests.unit.test_template_hygiene import _grants

    fn = sam.load_template().function("RequestReviewFunction")
    assert fn.handler == "request_review.handler.handler"
    assert fn.environment["NOTIFICATION_TOPIC_ARN"] == {"Ref": "NotificationTopic"}
    assert fn.environment["ARTIFACTS_BUCKET"] == {"Ref": "ArtifactsBucket"}
    grants = _grants("RequestReviewFunction")
    assert ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/runs/*/review/request.json") in grants
    assert {a for a, _ in grants} == {"s3:PutObject", "sns:Publish", "kms:Decrypt", "kms:GenerateDataKey*"}
    assert _grants("ReadReviewDecisionFunction") == set()  # it reads its input and calls nothing


def test_a_stack_without_a_name_is_decided_without_stack(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline runtime's stack is addressed by its work dir (STACK_NAME empty, d2ops.offline.stack):
    `d2ops approve RUN` there; a `--stack d2ops` would look for a CloudFormation stack that does not exist."""
    from d2ops.offline.stack import OFFLINE_FUNCTION_ENV

    assert OFFLINE_FUNCTION_ENV["RequestReviewFunction"]["STACK_NAME"] == ""
    monkeypatch.setenv("STACK_NAME", "")
    world.invoke()
    ((_, message),) = world.messages()
    assert message["how_to_decide"][:2] == [f"d2ops approve {RUN} [--reason TEXT]",
                                            f"d2ops reject {RUN} --reason TEXT"]
    assert not any("--stack" in line for line in message["how_to_decide"])
