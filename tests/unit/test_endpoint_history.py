"""The endpoint's history from its append-only records (d2ops_core.champion), read back through S3 (moto)."""

from __future__ import annotations

import boto3
from moto import mock_aws

from d2ops_core.champion import ChampionRecord, EndpointRollback, build_history, history_prefix, read_endpoint_history
from d2ops_core.dataset_identity import DatasetRef

BUCKET = "artifacts"
ENDPOINT = "d2ops-detector"


def dataset(version: str) -> DatasetRef:
    return DatasetRef(bucket="data", prefix=f"datasets/shapes/{version}/", name="shapes", version=version,
                      manifest_key=f"datasets/shapes/{version}/manifest.json", manifest_version="1")


def promotion(run: str, version: str, at: str, value: float, reason: str) -> ChampionRecord:
    return ChampionRecord.model_validate({
        "run_id": run, "dataset": dataset(version).model_dump(), "model_package_arn": f"arn:pkg/{run}",
        "model_name": f"{run}-model", "model_data": f"s3://{BUCKET}/runs/{run}/model.tar.gz", "endpoint_name": ENDPOINT,
        "endpoint_config_name": f"{run}-config", "primary_metric": "bbox_AP", "primary_value": value,
        "evaluation_uri": f"s3://{BUCKET}/runs/{run}/evaluation/evaluation.json",
        "gate": {"decision": "approved", "approval_status": "Approved", "reason": reason}, "promoted_at": at})


def rollback(run: str, at: str) -> EndpointRollback:
    return EndpointRollback(run_id=run, dataset=dataset("v3"), endpoint_name=ENDPOINT, model_package_arn="arn:pkg/r3",
                            rolled_back_at=at, cause="deploying model r3-model failed (SmokeTestFailed)",
                            rollback={"action": "rolled back to the previous endpoint config"})


def test_each_promotion_serves_until_the_next_and_rollbacks_are_listed_apart() -> None:
    first = promotion("r1", "v1", "2026-01-01T00:00:00Z", 0.5, "first model: 0.5 >= 0.3")
    second = promotion("r2", "v2", "2026-02-01T00:00:00Z", 0.6, "0.6 >= champion floor 0.49")
    history = build_history(ENDPOINT, [second, first], [rollback("r3", "2026-03-01T00:00:00Z")])
    assert [p.run_id for p in history.served] == ["r2", "r1"]  # newest first
    current, old = history.served
    assert (current.served_from, current.served_to, current.replaced_by_run) == ("2026-02-01T00:00:00Z", None, None)
    assert (old.served_to, old.replaced_by_run, old.why_replaced) == ("2026-02-01T00:00:00Z", "r2",
                                                                       "0.6 >= champion floor 0.49")
    assert (old.dataset_version, old.model_package_arn, old.primary_value) == ("v1", "arn:pkg/r1", 0.5)
    (attempt,) = history.rolled_back
    assert (attempt.run_id, attempt.action) == ("r3", "rolled back to the previous endpoint config")
    assert "SmokeTestFailed" in attempt.why


def test_an_alarm_rollback_names_its_alarms_and_an_endpoint_with_rollbacks_only_has_a_history() -> None:
    # A record from before alarm rollbacks were recorded reads as the pipeline's.
    old = EndpointRollback.model_validate_json(rollback("r3", "2026-03-01T00:00:00Z").model_dump_json(
        exclude={"rolled_back_by", "alarms", "kept_serving"}))
    by_alarm = EndpointRollback(
        run_id="r4", dataset=dataset("v4"), endpoint_name=ENDPOINT, rolled_back_at="2026-04-01T00:00:00Z",
        cause="deploying model r4-model failed (EndpointRolledBack)", rolled_back_by="alarm",
        alarms=["d2ops-EndpointErrorAlarm"], kept_serving="r2-config",
        rollback={"action": "SageMaker rolled the update back", "alarm_reasons": ["Threshold Crossed: 5 errors"]})
    history = build_history(ENDPOINT, [], [old, by_alarm])  # no promotion at all: the first deploy was undone
    assert history.served == []
    newest, oldest = history.rolled_back
    assert (newest.run_id, newest.rolled_back_by, newest.alarms, newest.kept_serving) == (
        "r4", "alarm", ["d2ops-EndpointErrorAlarm"], "r2-config")
    assert newest.alarm_reasons == ["Threshold Crossed: 5 errors"]
    assert (oldest.rolled_back_by, oldest.alarms, oldest.alarm_reasons) == ("pipeline", [], [])


@mock_aws
def test_read_endpoint_history_reads_the_records_the_state_machine_writes() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    assert read_endpoint_history(s3, BUCKET, ENDPOINT) is None  # nothing deployed yet
    prefix = history_prefix(ENDPOINT)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}promoted-r1.json",
                  Body=promotion("r1", "v1", "2026-01-01T00:00:00Z", 0.5, "first").model_dump_json())
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}rolled-back-r3.json",
                  Body=rollback("r3", "2026-03-01T00:00:00Z").model_dump_json())
    s3.put_object(Bucket=BUCKET, Key=f"{history_prefix('other-endpoint')}promoted-x.json",
                  Body=promotion("x", "v9", "2026-01-05T00:00:00Z", 0.9, "other").model_dump_json())
    history = read_endpoint_history(s3, BUCKET, ENDPOINT)
    assert history is not None
    assert [p.run_id for p in history.served] == ["r1"] and history.served[0].served_to is None
    assert [r.run_id for r in history.rolled_back] == ["r3"]


@mock_aws
def test_a_record_that_is_not_the_documented_shape_is_named_and_the_rest_still_reads() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    prefix = history_prefix(ENDPOINT)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}promoted-r1.json",
                  Body=promotion("r1", "v1", "2026-01-01T00:00:00Z", 0.5, "first").model_dump_json())
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}promoted-r2.json", Body=b'{"run_id": "r2"}')
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}rolled-back-r3.json", Body=b"\x00 truncated {")
    history = read_endpoint_history(s3, BUCKET, ENDPOINT)
    assert history is not None
    assert [p.run_id for p in history.served] == ["r1"]
    assert len(history.unreadable) == 2
    assert "promoted-r2.json: not an endpoint history record" in history.unreadable[0]
    assert "rolled-back-r3.json" in history.unreadable[1]
