"""The run's notification carries its cost (compose_notification), read back from a real SNS topic
(moto) through an SQS subscription, as a subscriber gets it.

SageMaker's answers come from botocore's Stubber (checked against the service model): moto's
DescribeTrainingJob reports no TrainingTimeInSeconds / BillableTimeInSeconds, which pricing needs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from d2ops_core import cost
from tests.fixtures.pipeline import support

support.function_path("compose_notification")
from compose_notification.models import MAX_SUBJECT, NotificationEvent  # noqa: E402
from compose_notification.service import compose  # noqa: E402

TRAIN, EVAL = "shapes-v1-bf3cc289798108cc-train", "shapes-v1-bf3cc289798108cc-eval"
ARN = f"arn:aws:sagemaker:{support.REGION}:{support.ACCOUNT}"
DEPLOYED = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
NOW = DEPLOYED + timedelta(minutes=30)


def event(outcome: str = "succeeded", *, name: str = "shapes",
          failure: dict[str, Any] | None = None) -> NotificationEvent:
    document: dict[str, Any] = {
        "dataset": {**support.DATASET.model_dump(), "name": name},
        "plan": support.plan_document({"training_job": TRAIN, "evaluation_job": EVAL,
                                       "endpoint_config": "shapes-v1-config"},
                                      instance_type="ml.g4dn.xlarge", instance_count=1),
        "deployment": {"mode": "update", "started_at": DEPLOYED.isoformat()}}
    if failure:
        document["failure"] = failure
    return NotificationEvent.model_validate({"outcome": outcome, "run_id": support.RUN_ID, "at": NOW.isoformat(),
                                             "document": document})


def stubbed_sagemaker(training_type: str = "ml.g4dn.xlarge") -> tuple[Any, Stubber]:
    client = boto3.client("sagemaker", region_name=support.REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    # Managed spot: 2 instances trained 3600 s wall clock, 1200 s billed.
    stubber.add_response("describe_training_job", {
        "TrainingJobName": TRAIN, "TrainingJobArn": f"{ARN}:training-job/{TRAIN}",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://a/model.tar.gz"}, "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed", "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": training_type, "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200}, "CreationTime": DEPLOYED - timedelta(hours=2),
        "EnableManagedSpotTraining": True, "TrainingTimeInSeconds": 3600, "BillableTimeInSeconds": 1200},
        {"TrainingJobName": TRAIN})
    stubber.add_response("describe_processing_job", {
        "ProcessingJobName": EVAL, "ProcessingJobArn": f"{ARN}:processing-job/{EVAL}",
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.xlarge",
                                                  "VolumeSizeInGB": 30}},
        "AppSpecification": {"ImageUri": "x"}, "ProcessingJobStatus": "Completed",
        "CreationTime": DEPLOYED - timedelta(minutes=20), "ProcessingStartTime": DEPLOYED - timedelta(minutes=20),
        "ProcessingEndTime": DEPLOYED - timedelta(minutes=10)}, {"ProcessingJobName": EVAL})
    stubber.activate()
    return client, stubber


def publish_and_receive(subject: str, message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Publish as the "Notify …" states do (the record merged with the fields) and read what a subscriber gets."""
    sns, sqs = boto3.client("sns", region_name=support.REGION), boto3.client("sqs", region_name=support.REGION)
    topic = sns.create_topic(Name="d2ops-notifications")["TopicArn"]
    queue = sqs.create_queue(QueueName="subscriber")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    sns.publish(TopicArn=topic, Subject=subject, Message=json.dumps(message))
    (received,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    envelope = json.loads(received["Body"])
    return envelope["Subject"], json.loads(envelope["Message"])


@mock_aws
def test_the_notification_carries_training_evaluation_endpoint_cost_and_spot_savings() -> None:
    sagemaker, stubber = stubbed_sagemaker()
    notification = compose(event(), sagemaker, env={})
    stubber.assert_no_pending_responses()
    champion = {"run_id": support.RUN_ID, "primary_metric": "bbox_AP", "primary_value": 0.71}
    subject, message = publish_and_receive(notification.subject, {**champion, **notification.fields.model_dump(
        mode="json")})
    g4dn, m5 = cost.DEFAULT_PRICES.training["ml.g4dn.xlarge"], cost.DEFAULT_PRICES.processing["ml.m5.xlarge"]
    priced = message["cost"]
    # The arithmetic spelled out: billed seconds x instances / 3600 x the hourly price.
    assert priced["training"]["cost_usd"] == pytest.approx(1200 * 2 / 3600 * g4dn, abs=2e-6)
    assert priced["training"]["spot_savings_usd"] == pytest.approx((3600 - 1200) * 2 / 3600 * g4dn, abs=2e-6)
    assert priced["training"]["spot_savings_percent"] == pytest.approx(66.67, abs=2e-6)
    assert priced["evaluation"]["cost_usd"] == pytest.approx(600 / 3600 * m5, abs=2e-6)
    assert priced["endpoint"]["seconds"] == 1800  # deployed to now: the endpoint time so far
    hosting = cost.DEFAULT_PRICES.hosting["ml.g4dn.xlarge"]
    assert priced["endpoint"]["cost_usd"] == pytest.approx(1800 / 3600 * hosting, abs=2e-6)
    total = priced["total_usd"]
    assert total == pytest.approx(priced["training"]["cost_usd"] + priced["evaluation"]["cost_usd"]
                                  + priced["endpoint"]["cost_usd"])
    assert subject == f"d2ops: shapes v1 deployed (cost ${total:,.2f})"
    assert message["primary_value"] == 0.71 and message["cost_unknown"] is None
    assert message["cost_summary"].startswith(f"${total:,.2f} (training ")
    assert "spot saved" in message["cost_summary"] and "endpoint" in message["cost_summary"]


@mock_aws
@pytest.mark.parametrize("table", ["/nonexistent/prices.json", '{"as_of": "yesterday"}'])
def test_an_unreadable_price_table_still_notifies_saying_why_the_cost_is_unknown(table: str) -> None:
    sagemaker, _ = stubbed_sagemaker()
    failure = {"error": "QualityGateFailed", "cause": "bbox_AP 0.2 < 0.3"}
    notification = compose(event("failed", failure=failure), sagemaker, env={cost.PRICE_TABLE_ENV: table})
    subject, message = publish_and_receive(notification.subject, {**failure, **notification.fields.model_dump(
        mode="json")})
    assert subject == "d2ops run failed: QualityGateFailed (shapes v1, cost unknown)"
    assert message["cost"] is None and cost.PRICE_TABLE_ENV in message["cost_unknown"]
    assert message["cost_summary"].startswith("cost unknown: ") and message["error"] == "QualityGateFailed"


@mock_aws
def test_an_instance_type_missing_from_the_table_is_named_and_the_rest_is_priced() -> None:
    sagemaker, _ = stubbed_sagemaker(training_type="ml.trn1.32xlarge")
    notification = compose(event(), sagemaker, env={})
    fields = notification.fields
    assert fields.cost is not None and fields.cost.unpriced == ["ml.trn1.32xlarge"]
    assert fields.cost_unknown is not None and "ml.trn1.32xlarge" in fields.cost_unknown
    assert fields.cost.training is not None and fields.cost.training.cost_usd is None
    assert fields.cost.evaluation is not None and fields.cost.endpoint is not None
    assert fields.cost.total_usd == pytest.approx(fields.cost.evaluation.cost_usd + fields.cost.endpoint.cost_usd)
    assert "incomplete: " in fields.cost_summary
    publish_and_receive(notification.subject, fields.model_dump(mode="json"))


@mock_aws
def test_a_job_sagemaker_cannot_describe_leaves_that_part_out_and_says_so() -> None:
    client = boto3.client("sagemaker", region_name=support.REGION)
    stubber = Stubber(client)
    stubber.add_client_error("describe_training_job", "AccessDeniedException", "not authorized", 400)
    stubber.add_client_error("describe_processing_job", "ValidationException",
                             f"Could not find processing job '{EVAL}'.", 400)  # never created: nothing billed
    stubber.activate()
    notification = compose(event(), client, env={})
    assert notification.fields.cost_unknown == f"training job {TRAIN} could not be described (AccessDeniedException)"
    assert notification.fields.cost is not None and notification.fields.cost.training is None
    assert notification.fields.cost.evaluation is None and notification.fields.cost.endpoint is not None


@mock_aws
def test_the_subject_fits_sns_whatever_the_dataset_is_called() -> None:
    sagemaker, _ = stubbed_sagemaker()
    notification = compose(event(name="Ünïcode\nname " + "x" * 150), sagemaker, env={})
    subject = notification.subject
    assert len(subject) == MAX_SUBJECT < 100 and subject.isascii() and "\n" not in subject and subject.endswith("...")
    assert subject.startswith("d2ops: Unicode name xxx")
    received, _ = publish_and_receive(subject, {})
    assert received == subject


def test_a_malformed_plan_still_notifies_saying_which_part_of_the_run_could_not_be_read() -> None:
    """The run state is read section by section (d2ops_core.documents.run_state): a plan the model
    refuses leaves the jobs out of the cost, named with the field, and the rest of the run still reads."""
    good = event("failed", failure={"error": "TrainingFailed", "cause": "OOM"})
    document = {**good.document.model_dump(mode="json", exclude_none=True), "plan": {"names": "not names"}}
    broken = NotificationEvent.model_validate({"outcome": "failed", "run_id": support.RUN_ID,
                                               "at": NOW.isoformat(), "document": document})
    notification = compose(broken, object(), env={})  # no plan: no job to describe, nothing to call
    assert notification.subject == "d2ops run failed: TrainingFailed (shapes v1, cost unknown)"
    assert notification.fields.cost_unknown is not None
    assert notification.fields.cost_unknown.startswith("the run's $.plan.")


@pytest.mark.parametrize(("case", "expected"), [
    # The gate refused a challenger trained on changed data: the notification says what changed.
    ("GateFailedRegression", "vs champion's shapes/v0: +4 -2 images; 1 renamed; 3 relabelled; 1 moved train<->val; "
                             "instances +7; new classes hexagon"),
    ("SmokeTestFailsRollsBack", None),  # the same diff, but not a gate refusal: not the question asked
    ("GateFailedThreshold", None),  # refused, but no champion: nothing to compare the data with
])
def test_a_gate_refusal_says_what_changed_in_the_data_since_the_champion(case: str, expected: str | None) -> None:
    execution = support.run_case(case)
    fields = support.state_output(execution, "Compose failure notification")["notification"]["fields"]
    assert fields["data_changes"] == expected
    if expected:
        assert fields["dataset_diff_uri"] == (f"s3://{support.ARTIFACTS_BUCKET}/runs/{support.RUN_ID}/"
                                              "dataset-diff.json")


@pytest.mark.parametrize(("case", "expected"), [
    # Refused on the interval, wholly below the tolerance: more images would not change that, so no count.
    ("GateFailedRegression", "bbox_AP challenger - champion: difference -0.020, 95% interval [-0.034, -0.012] "
                             "on 40 val images"),
    # Approved on an interval within the tolerance: no count either.
    ("SmokeTestFailsRollsBack", "bbox_AP challenger - champion: difference 0.020, 95% interval [-0.005, 0.045] "
                                "on 120 val images"),
    # Sent to review on an interval straddling -0.01: how many more val images would narrow it to the tolerance.
    ("ReviewRejected", "bbox_AP challenger - champion: difference 0.020, 95% interval [-0.025, 0.065] "
                       "on 40 val images; wider than the tolerance \u00b10.01: about 770 more val images "
                       "would narrow it"),
    ("GateFailedThreshold", None),  # no champion: nothing was compared
])
def test_the_notification_quotes_the_gate_s_interval(case: str, expected: str | None) -> None:
    """Mutation: the interval left out of the message, or the image count quoted for an interval within it."""
    execution = support.run_case(case)
    fields = support.state_output(execution, "Compose failure notification")["notification"]["fields"]
    assert fields["gate_comparison"] == expected


REVIEWER = "arn:aws:sts::123456789012:assumed-role/d2ops-ReviewerRole-1A2B3C/alice"


@pytest.mark.parametrize(("decision", "gate", "expected"), [
    # The gate's numbers decided: no review line.
    ("approve", {"decision": "approved", "approval_status": "Approved", "reason": "within the tolerance"}, None),
    # A person decided: who, when, why.
    ("review", {"decision": "approved", "approval_status": "Approved", "reason": "approved by ...",
                "decided_by": REVIEWER, "decided_at": "2026-11-23T10:15:00Z", "review_reason": "looks right"},
     f"approved by {REVIEWER} at 2026-11-23T10:15:00Z: looks right"),
    # Nobody decided in time: what ended the wait.
    ("review", {"decision": "rejected", "approval_status": "Rejected",
                "reason": "no decision within 7 days: refused; the gate asked for a review: x"},
     "no decision within 7 days: refused; the gate asked for a review: x"),
    # The run failed while it waited (its request, say): nobody decided.
    ("review", {"decision": "review", "approval_status": "PendingManualApproval", "reason": "needs a person"},
     "waiting for a person's decision when the run failed: nobody decided"),
])
def test_the_notification_says_who_decided_a_review(decision: str, gate: dict[str, Any],
                                                    expected: str | None) -> None:
    from compose_notification.service import review_line

    base = event("failed", failure={"error": "QualityGateFailed", "cause": "x"})
    document = {**base.document.model_dump(mode="json"), "evaluation": {"decision": decision}, "gate": gate}
    assert review_line(NotificationEvent.model_validate({**base.model_dump(mode="json"), "document": document})) \
        == expected
