"""A new account's first run, offline: spot GPU training over its quota ends the run at once, and the
notification and the status API say which quota, its value, and what to do (issue 20, "fail fast").

The whole offline stack runs: the S3 trigger, the real validation and preparation Lambdas, the real
state machine on its real clock, the offline SageMaker, which refuses CreateTrainingJob over the offline
account's quota (d2ops.offline.quotas: a new account's spot GPU training quota is 0) in SageMaker's own
words, then describe_failure, compose_notification, SNS (to an SQS queue here) and the status API over
HTTP. No job runs, so this takes seconds. The retry path (throttling) is
tests/integration/test_offline_sync_job_retries.py, on the virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import RunSummary, run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core.platform import quota_name
from tests.fixtures.offline.support import tiny_dataset

pytestmark = pytest.mark.integration

QUOTA_LINE = "quota '{}' is 0 instances (0 in use, this run asked for 1): set UseSpotTraining=false"


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineRuntime, RunSummary, list[Any]]]:
    root = tmp_path_factory.mktemp("fail-fast")
    dataset = tiny_dataset(root, "spot", "v1", images=6)
    with OfflineRuntime(root / "work", parameters={"UseSpotTraining": "true"}) as rt:
        sqs, sns = rt.client("sqs"), rt.client("sns")
        queue = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        topic = next(t["TopicArn"] for t in sns.list_topics()["Topics"] if t["TopicArn"].endswith(rt.stack.topic_name))
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
        summary = run_pipeline(rt, dataset, out=lambda line: None, timeout=120)
        messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", [])
        yield rt, summary, messages


def _history(rt: OfflineRuntime, summary: RunSummary) -> list[dict[str, Any]]:
    sfn = rt.client("stepfunctions")
    arn = f"{rt.stack.state_machine_arn.replace(':stateMachine:', ':execution:')}:{summary.run_id}"
    return list(sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"])


def test_a_spot_quota_of_zero_ends_the_run_within_a_minute_without_a_wait(
        refused: tuple[OfflineRuntime, RunSummary, list[Any]]) -> None:
    rt, summary, _ = refused
    assert (summary.status, summary.error) == ("FAILED", "TrainingFailed")
    events = _history(rt, summary)
    entered = [(e["stateEnteredEventDetails"]["name"], e["timestamp"]) for e in events
               if e["type"].endswith("StateEntered")]
    names = [name for name, _ in entered]
    assert names.count("Train model") == 1 and "Training failed" in names
    train = names.index("Train model")
    assert not any(name.startswith("Wait") for name in names[train:]), names
    started: datetime = entered[train][1]
    assert (events[-1]["timestamp"] - started).total_seconds() < 60
    (refusal,) = [e["taskFailedEventDetails"] for e in events if e["type"] == "TaskFailed"]
    assert refusal["error"] == "SageMaker.ResourceLimitExceededException"  # modelled: its own name
    assert "Error Code: ResourceLimitExceeded" in refusal["cause"]
    # SageMaker started nothing.
    assert rt.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_the_notification_and_the_status_api_say_which_quota_and_what_to_do(
        refused: tuple[OfflineRuntime, RunSummary, list[Any]]) -> None:
    rt, summary, messages = refused
    expected = QUOTA_LINE.format(quota_name(rt.stack.parameters["TrainingInstanceType"], "spot training"))
    (message,) = [json.loads(m["Body"]) for m in messages]
    assert message["error"] == "TrainingFailed" and expected in message["cause"]
    assert "request-service-quota-increase --service-code sagemaker" in message["cause"]
    status, data, _ = offline_status_api(rt.status_api.url).request("GET", f"/runs/{summary.run_id}")
    run = json.loads(data)
    assert status == 200 and run["error"] == "TrainingFailed"
    assert expected in run["cause"] and "\n" not in run["cause"] and "Traceback" not in run["cause"]


def test_the_offline_stack_reports_its_quotas_by_name(refused: tuple[OfflineRuntime, RunSummary, list[Any]]) -> None:
    rt, _, _ = refused
    gpu = rt.stack.parameters["TrainingInstanceType"]
    assert rt.quotas.value(quota_name(gpu, "spot training")) == 0
    assert rt.sagemaker.quotas is rt.quotas  # one table: what refuses is what is reported
