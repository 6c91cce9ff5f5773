"""Cost per run: SageMaker's reported times x the price table (src/d2ops_core/cost.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from d2ops_core import cost

TABLE = cost.PriceTable(as_of="2026-01-01", region="eu-west-1", source="test", training={"ml.g4dn.xlarge": 0.9},
                        processing={"ml.m5.xlarge": 0.36}, hosting={"ml.g4dn.xlarge": 1.8})
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _training_job(training: int, billable: int, count: int = 2, spot: bool = True) -> dict[str, object]:
    # The shape of DescribeTrainingJob's answer (botocore's sagemaker model), trimmed to what is priced.
    resources = {"InstanceType": "ml.g4dn.xlarge", "InstanceCount": count, "VolumeSizeInGB": 50}
    return {"TrainingJobName": "run-1-train", "ResourceConfig": resources,
            "EnableManagedSpotTraining": spot, "TrainingTimeInSeconds": training, "BillableTimeInSeconds": billable}


def test_spot_training_is_billed_for_billable_seconds_and_the_rest_is_saved() -> None:
    priced = cost.training_cost(_training_job(training=3600, billable=1080), TABLE)
    assert priced is not None and priced.spot
    assert priced.instance_seconds == 2160  # two hosts x BillableTimeInSeconds
    assert priced.cost_usd == pytest.approx(2160 / 3600 * 0.9)
    assert priced.on_demand_cost_usd == pytest.approx(2 * 0.9)
    assert priced.spot_savings_usd == pytest.approx(2 * 0.9 - 0.54)
    assert priced.spot_savings_percent == pytest.approx(70.0)  # AWS: 1 - Billable / Training


def test_on_demand_training_saves_nothing_and_unfinished_jobs_are_not_priced() -> None:
    priced = cost.training_cost(_training_job(training=600, billable=600, count=1, spot=False), TABLE)
    assert priced is not None and priced.spot_savings_usd == 0 and priced.spot_savings_percent == 0
    assert cost.training_cost({"TrainingJobName": "x", "ResourceConfig": {}}, TABLE) is None


def test_a_run_sums_its_priced_parts_and_names_the_unpriced_instance_types() -> None:
    training = cost.training_cost(_training_job(training=1800, billable=1800, count=1), TABLE)
    evaluation = cost.processing_cost({"ProcessingJobName": "run-1-eval", "ProcessingStartTime": START,
                                       "ProcessingEndTime": START + timedelta(minutes=10),
                                       "ProcessingResources": {"ClusterConfig": {"InstanceType": "ml.m5.xlarge",
                                                                                 "InstanceCount": 1}}}, TABLE)
    endpoint = cost.endpoint_cost("run-1-config", "ml.p5.48xlarge", 1, 900, TABLE)
    run = cost.run_cost(TABLE, training, evaluation, endpoint)
    assert evaluation is not None and evaluation.cost_usd == pytest.approx(0.06)
    assert run.total_usd == pytest.approx(0.45 + 0.06)
    assert run.unpriced == ["ml.p5.48xlarge"] and run.endpoint is not None and run.endpoint.cost_usd is None
    assert (run.prices_as_of, run.prices_region) == ("2026-01-01", "eu-west-1")
    still_running = {"ProcessingJobName": "e", "ProcessingStartTime": START, "ProcessingResources": {}}
    assert cost.processing_cost(still_running, TABLE) is None
    running = cost.processing_cost(still_running, TABLE, now=START + timedelta(seconds=30))
    assert running is not None and running.seconds == 30


def test_the_price_table_is_overridable_by_file_or_inline_json_and_bad_tables_are_named(tmp_path: Path) -> None:
    assert cost.load_price_table({}) is cost.DEFAULT_PRICES
    assert cost.DEFAULT_PRICES.hourly("hosting", "ml.g4dn.xlarge") is not None  # the template's default type
    path = tmp_path / "prices.json"
    path.write_text(TABLE.model_dump_json())
    assert cost.load_price_table({cost.PRICE_TABLE_ENV: str(path)}) == TABLE
    assert cost.load_price_table({cost.PRICE_TABLE_ENV: TABLE.model_dump_json()}) == TABLE
    with pytest.raises(cost.PriceTableError, match="cannot read it"):
        cost.load_price_table({cost.PRICE_TABLE_ENV: str(tmp_path / "missing.json")})
    path.write_text(json.dumps({**TABLE.model_dump(), "as_of": "last week"}))
    with pytest.raises(cost.PriceTableError, match="as_of"):
        cost.load_price_table({cost.PRICE_TABLE_ENV: str(path)})


def test_the_status_api_prices_a_run_from_its_jobs_and_its_deployment_time() -> None:
    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    from status_api.service import run_cost

    doc = {"plan": support.plan_document(instance_type="ml.g4dn.xlarge", instance_count=2),
           # as the create/update state's ResultSelector writes it ($$.State.EnteredTime)
           "deployment": {"mode": "create", "started_at": "2026-01-01T13:00:00.000Z"}}
    evaluation = {"ProcessingJobName": "e", "ProcessingStartTime": START,
                  "ProcessingEndTime": START + timedelta(hours=1),
                  "ProcessingResources": {"ClusterConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1}}}
    priced = run_cost(doc, _training_job(training=3600, billable=1800), evaluation,
                      stopped=START + timedelta(hours=1, minutes=30), table=TABLE)
    assert priced is not None and priced.endpoint is not None
    assert priced.endpoint.instance_seconds == 2 * 1800 and priced.endpoint.cost_usd == pytest.approx(1.8)
    assert priced.total_usd == pytest.approx(0.9 + 0.36 + 1.8)  # 2 hosts x 30 billable min, 1 h eval, endpoint
    assert run_cost({}, None, None, stopped=None, table=TABLE) is None  # nothing ran yet
    garbled = {**doc, "deployment": {"started_at": "yesterday"}}  # unreadable: no endpoint time, not a 500
    unpriced = run_cost(garbled, None, evaluation, stopped=START + timedelta(hours=2), table=TABLE)
    assert unpriced is not None and unpriced.endpoint is None


@pytest.mark.parametrize("deployment", [None, "2026-01-01T13:00:00.000Z"], ids=["update call failed", "deployed"])
def test_the_status_api_and_the_notification_bill_the_same_endpoint_time(deployment: str | None,
                                                                        tmp_path: Path) -> None:
    """A run failing at its 'Update endpoint (blue/green)' call has entered the state but has no
    $.deployment (the Catch writes $.error): neither the status API nor the notification bills endpoint
    time for it; a deployed run is billed the same in both."""
    import boto3
    from botocore.stub import Stubber

    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    support.function_path("compose_notification")
    from compose_notification.models import NotificationEvent
    from compose_notification.service import compose
    from status_api.service import run_cost

    names = {"training_job": "run-1-train", "evaluation_job": "run-1-eval", "endpoint_config": "run-1-config"}
    doc: dict[str, object] = {
        "dataset": support.DATASET.model_dump(),
        "plan": support.plan_document(names, instance_type="ml.g4dn.xlarge", instance_count=2)}
    if deployment is None:
        doc["error"] = {"Error": "SageMaker.ValidationException", "Cause": "Cannot update in-progress endpoint"}
    else:
        doc["deployment"] = {"mode": "update", "started_at": deployment}
    ended = START + timedelta(hours=1, minutes=30)
    training = {**_training_job(training=3600, billable=1800), "TrainingJobName": "run-1-train"}
    status_api = run_cost(doc, training, None, stopped=ended, table=TABLE)

    sagemaker = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(sagemaker)  # the same job, as DescribeTrainingJob answers (checked against botocore's model)
    stubber.add_response("describe_training_job", {
        **training, "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/run-1-train",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://a/model.tar.gz"}, "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed", "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200}, "CreationTime": START}, {"TrainingJobName": "run-1-train"})
    stubber.add_client_error("describe_processing_job", "ValidationException",
                             "Could not find processing job 'run-1-eval'.", 400)
    stubber.activate()
    (tmp_path / "prices.json").write_text(TABLE.model_dump_json())
    event = NotificationEvent.model_validate({"outcome": "failed" if deployment is None else "succeeded",
                                              "run_id": "shapes_v1_0123456789abcdef", "at": ended.isoformat(),
                                              "document": doc})
    notified = compose(event, sagemaker, env={cost.PRICE_TABLE_ENV: str(tmp_path / "prices.json")}).fields.cost
    stubber.assert_no_pending_responses()

    assert status_api is not None and notified is not None
    assert status_api == notified
    if deployment is None:
        assert notified.endpoint is None and notified.total_usd == pytest.approx(0.9)  # training only
    else:
        assert notified.endpoint is not None and notified.endpoint.instance_seconds == 2 * 1800
