"""The prepare Lambda: requests SageMaker accepts (moto + botocore's API model), overrides, champion."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from d2ops_core import metrics, run_ids, s3_layout, sagemaker_jobs
from d2ops_core.champion import CHAMPION_KEY
from d2ops_core.validation.manifest import StackLimits
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training import handler as prepare_handler  # noqa: E402
from prepare_training.models import PrepareSettings  # noqa: E402


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    support.prepare_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        support.put_pretrained_weights(s3)
        support.put_inventory(s3, support.RUN_ID)  # the events' run: its inventory sizes the volumes
        yield {"s3": s3, "sagemaker": boto3.client("sagemaker")}


def prepare(case: str = "defaults", **changes: Any) -> dict[str, Any]:
    event = support.load_event("prepare_training", case)
    event.update(changes)
    return dict(prepare_handler.handler(event, support.FakeLambdaContext()))


def test_the_training_request_is_accepted_by_sagemaker(aws: dict[str, Any]) -> None:
    plan = prepare()
    job = plan["training_job"]
    aws["sagemaker"].create_training_job(**job)  # botocore validates every field against the API model
    described = aws["sagemaker"].describe_training_job(TrainingJobName=job["TrainingJobName"])
    assert described["TrainingJobName"] == plan["names"]["training_job"]
    run_id = support.load_event("prepare_training", "defaults")["run_id"]
    assert job["OutputDataConfig"]["S3OutputPath"] == f"s3://{support.ARTIFACTS_BUCKET}/runs/{run_id}/training/"
    # One channel carries the snapshot (the run's, never the mutable data prefix): two channels of the same
    # prefix, as train and val once were, download the dataset twice in File mode.
    assert [c["ChannelName"] for c in job["InputDataConfig"]] == ["dataset", "pretrained"]
    dataset = job["InputDataConfig"][0]
    assert dataset["DataSource"]["S3DataSource"]["S3Uri"] == s3_layout.snapshot_uri(support.ARTIFACTS_BUCKET, run_id)
    assert dataset["InputMode"] == job["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert job["InputDataConfig"][1]["DataSource"]["S3DataSource"]["S3Uri"] == (
        f"s3://d2ops-data-example/{support.PREPARE_ENV['PRETRAINED_WEIGHTS_KEY']}")
    assert job["ResourceConfig"]["InstanceCount"] == 2 and job["ResourceConfig"]["InstanceType"] == "ml.g4dn.xlarge"
    digest = support.load_event("prepare_training", "defaults")["validation"]["inventory_digest"]
    # min_class_instances: the plan's gate.min_class_instances, below which a class gets the pooled score threshold.
    assert job["HyperParameters"] == {"framework": "detectron2", "inventory_digest": digest,
                                      "min_class_instances": str(plan["gate"]["min_class_instances"])}
    assert plan["inventory_digest"] == digest
    assert plan["dataset_snapshot_uri"] == s3_layout.snapshot_uri(support.ARTIFACTS_BUCKET, run_id)
    dataset_input = next(i for i in plan["evaluation_job"]["ProcessingInputs"] if i["InputName"] == "dataset")
    assert dataset_input["S3Input"]["S3Uri"] == s3_layout.snapshot_uri(support.ARTIFACTS_BUCKET, run_id)
    # The release function knows the run's job by the same rule ("Created ... job is ours?"): name and output.
    assert job["TrainingJobName"] == run_ids.sagemaker_name(run_id, run_ids.TRAINING_JOB_SUFFIX)
    output = s3_layout.training_output_uri(support.ARTIFACTS_BUCKET, run_id)
    assert sagemaker_jobs.described_job_output(described) == output


def test_spot_training_waits_at_most_twice_the_runtime_and_checkpoints_to_s3(aws: dict[str, Any],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    job = prepare()["training_job"]
    assert job["EnableManagedSpotTraining"] is True
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 14400, "MaxWaitTimeInSeconds": 28800}
    run_id = support.load_event("prepare_training", "defaults")["run_id"]
    assert job["CheckpointConfig"] == {"S3Uri": f"s3://{support.ARTIFACTS_BUCKET}/checkpoints/{run_id}/",
                                       "LocalPath": "/opt/ml/checkpoints"}
    monkeypatch.setenv("USE_SPOT", "false")
    on_demand = prepare()["training_job"]
    assert on_demand["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in on_demand["StoppingCondition"]


def test_manifest_overrides_become_string_hyperparameters_and_gate_thresholds(aws: dict[str, Any],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The manifest's task is instance_segmentation: a stack fine-tuning it names Mask R-CNN's checkpoint.
    monkeypatch.setenv("PRETRAINED_WEIGHTS_KEY", support.MASK_WEIGHTS_KEY)
    support.put_pretrained_weights(aws["s3"], support.MASK_WEIGHTS_KEY)
    plan = prepare("manifest_overrides")
    assert plan["training_job"]["HyperParameters"] == {
        "framework": "detectron2", "max_iter": "3000", "ims_per_batch": "8", "base_lr": "0.01", "seed": "7",
        "inventory_digest": support.load_event("prepare_training", "manifest_overrides")["validation"][
            "inventory_digest"],
        "min_class_instances": "10"}  # the manifest's stricter gate.min_class_instances, the thresholds' support too
    # The manifest's task is instance_segmentation: the gate judges mask AP.
    assert plan["gate"] == {"primary_metric": "segm_AP", "min_map": 0.5, "max_regression": 0.005,
                            "max_class_regression": 0.05, "min_class_instances": 10, "confidence": 0.99,
                            "resamples": 2000, "min_compared_images": 50}
    monkeypatch.setenv("PRETRAINED_WEIGHTS_KEY", support.PREPARE_ENV["PRETRAINED_WEIGHTS_KEY"])
    assert prepare()["gate"] == {"primary_metric": "bbox_AP", "min_map": 0.3,  # detection; stack parameters
                                 "max_regression": 0.01, "max_class_regression": 0.1, "min_class_instances": 30,
                                 "confidence": 0.95, "resamples": 1000, "min_compared_images": 50}


@pytest.mark.parametrize(("manifest", "named"), [
    ({"gate": {"min_map": 0.0}}, "GATE_MIN_MAP_BELOW_STACK"),
    ({"gate": {"max_regression": 1.0}}, "GATE_MAX_REGRESSION_ABOVE_STACK"),
    ({"gate": {"min_map": 0.29, "max_regression": 0.0}}, "GATE_MIN_MAP_BELOW_STACK"),
    ({"training": {"max_iter": 101}}, "TRAINING_MAX_ITER_ABOVE_STACK"),
    ({"training": {"ims_per_batch": 17}}, "TRAINING_IMS_PER_BATCH_ABOVE_STACK"),
    ({"gate": {"max_class_regression": 0.5}}, "GATE_MAX_CLASS_REGRESSION_ABOVE_STACK"),
    ({"gate": {"min_class_instances": 31}}, "GATE_MIN_CLASS_INSTANCES_ABOVE_STACK"),
    ({"gate": {"confidence": 0.8}}, "GATE_CONFIDENCE_BELOW_STACK"),
    ({"gate": {"resamples": 999}}, "GATE_RESAMPLES_BELOW_STACK"),
])
def test_a_manifest_never_loosens_the_stack_limits(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                   manifest: dict[str, Any], named: str) -> None:
    # Validation rejects these first; prepare refuses them too, for input that skipped validation.
    from prepare_training.service import ManifestExceedsStackLimits

    monkeypatch.setenv("MAX_TRAINING_ITERATIONS", "100")
    monkeypatch.setenv("MAX_IMAGES_PER_BATCH", "16")
    with pytest.raises(ManifestExceedsStackLimits, match=named):
        prepare(manifest=manifest)
    at_the_limits = prepare(manifest={"gate": {"min_map": 0.3, "max_regression": 0.01},
                                      "training": {"max_iter": 100, "ims_per_batch": 16}})
    assert at_the_limits["gate"]["min_map"] == 0.3 and at_the_limits["gate"]["max_regression"] == 0.01


def test_out_of_bounds_overrides_are_refused(aws: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="max_iter"):
        prepare(manifest={"training": {"max_iter": 10_000_000}})
    with pytest.raises(ValidationError, match="learning_rate"):
        prepare(manifest={"training": {"learning_rate": 0.1}})


def test_metric_definitions_come_from_d2ops_metrics_and_match_trainer_lines(aws: dict[str, Any]) -> None:
    definitions = prepare()["training_job"]["AlgorithmSpecification"]["MetricDefinitions"]
    assert definitions == [dict(d) for d in metrics.METRIC_DEFINITIONS]
    for d in definitions:
        if d in metrics.PROGRESS_DEFINITIONS:  # the iteration and total of train:loss lines (test_training_metrics)
            continue
        line = f"[rank0] {metrics.format_metric_line(d['Name'], 0.4321, iteration=250)}"
        match = re.search(d["Regex"], line)
        assert match and float(match.group(1)) == pytest.approx(0.4321), d["Name"]
    # Names are distinct prefixes of nothing else: bbox_AP does not match a bbox_AP50 line.
    bbox_ap = next(d for d in definitions if d["Name"] == "val:bbox_AP")
    assert not re.search(bbox_ap["Regex"], metrics.format_metric_line("val:bbox_AP50", 0.9))


def test_the_evaluation_request_is_accepted_and_includes_the_champion(aws: dict[str, Any]) -> None:
    first = prepare()
    assert first["champion"] is None
    inputs = {i["InputName"]: i["S3Input"] for i in first["evaluation_job"]["ProcessingInputs"]}
    assert set(inputs) == {"challenger", "dataset"}  # the snapshot once, under the training channel's name
    assert inputs["challenger"]["S3Uri"] == (f"{first['training_job']['OutputDataConfig']['S3OutputPath']}"
                                             f"{first['names']['training_job']}/output/model.tar.gz")
    assert inputs["dataset"]["LocalPath"] == "/opt/ml/processing/input/dataset"
    aws["sagemaker"].create_processing_job(**first["evaluation_job"])
    described = aws["sagemaker"].describe_processing_job(ProcessingJobName=first["names"]["evaluation_job"])
    run_id = support.load_event("prepare_training", "defaults")["run_id"]
    assert described["ProcessingJobName"] == run_ids.sagemaker_name(run_id, run_ids.EVALUATION_JOB_SUFFIX)
    output = s3_layout.evaluation_output_uri(support.ARTIFACTS_BUCKET, run_id)
    assert sagemaker_jobs.described_job_output(described) == output

    champion_record = {"run_id": "shapes_v0_0123456789abcdef", "dataset": support.DATASET.model_dump(),
                       "model_package_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/d2ops-models/1",
                       "model_name": "shapes-v0-0123456789abcdef-model",
                       "model_data": "s3://d2ops-artifacts-example/runs/shapes_v0/model.tar.gz",
                       "endpoint_name": support.ENDPOINT_NAME, "endpoint_config_name": "shapes-v0-config",
                       "primary_metric": "bbox_AP", "primary_value": 0.62, "evaluation_uri": "s3://x/e.json",
                       "gate": {"decision": "approved", "approval_status": "Approved", "reason": "ok"},
                       "promoted_at": "2026-11-01T08:00:00Z"}
    aws["s3"].put_object(Bucket=support.ARTIFACTS_BUCKET, Key=CHAMPION_KEY, Body=json.dumps(champion_record))
    second = prepare()
    assert second["champion"]["run_id"] == "shapes_v0_0123456789abcdef"
    inputs = {i["InputName"]: i["S3Input"] for i in second["evaluation_job"]["ProcessingInputs"]}
    assert inputs["champion"]["S3Uri"] == champion_record["model_data"]
    assert inputs["champion"]["LocalPath"] == "/opt/ml/processing/input/champion"


def test_missing_or_bad_stack_settings_name_the_variable() -> None:
    env = dict(support.PREPARE_ENV)
    del env["TRAINING_IMAGE_URI"]
    with pytest.raises(ValidationError, match="training_image_uri"):
        PrepareSettings.from_env(env)
    with pytest.raises(ValidationError, match="use_spot"):
        PrepareSettings.from_env({**support.PREPARE_ENV, "USE_SPOT": "maybe"})
    with pytest.raises(ValidationError, match="min_map"):
        PrepareSettings.from_env({**support.PREPARE_ENV, "MIN_MAP": "1.5"})


def test_settings_cover_the_template_environment() -> None:
    from d2ops import template as sam

    env = sam.load_template().function("PrepareTrainingFunction").environment
    fields = {name.upper() for name in PrepareSettings.model_fields} | set(StackLimits.ENV)  # limits: StackLimits'
    ours = {k for k in env if not k.startswith(("POWERTOOLS_", "D2OPS_"))}
    assert ours <= fields, f"template sets variables the Lambda ignores: {sorted(ours - fields)}"
    required = {n.upper() for n, f in PrepareSettings.model_fields.items() if f.is_required() and n != "limits"}
    required |= {name for name, field in StackLimits.ENV.items() if StackLimits.model_fields[field].is_required()}
    assert required - {"EVALUATION_IMAGE_URI"} <= ours


@pytest.mark.parametrize(("instances", "routing"), [
    (None, {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600}),  # the stack's default: one instance
    ("1", {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600}),
    ("2", {"Type": "CANARY", "WaitIntervalInSeconds": 600, "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}}),
])
def test_the_plan_carries_a_traffic_routing_sagemaker_accepts_for_the_instance_count(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch, instances: str | None,
        routing: dict[str, Any]) -> None:
    """SageMaker refuses a canary over 50 % of the variant's instances, so one instance deploys all at
    once (with the same bake: the old fleet stays until it ends); the JSON has no null members."""
    if instances is not None:
        monkeypatch.setenv("ENDPOINT_INSTANCE_COUNT", instances)
    endpoint = prepare()["endpoint"]
    assert endpoint["traffic_routing"] == routing
    assert endpoint["instance_count"] == int(instances or 1)


@pytest.mark.parametrize(("validation", "says"), [
    (None, "no validation summary was passed"),
    ({"valid": True, "images_pending": True, "snapshot_uri": None, "inventory_digest": None},
     "still has images_pending"),
    ({"valid": True, "images_pending": False, "snapshot_uri": None,
      "inventory_digest": "sha256:" + "0" * 64}, "has no snapshot_uri"),
    ({"valid": True, "images_pending": False, "snapshot_uri": "s3://d2ops-artifacts-example/runs/x/dataset/",
      "inventory_digest": None}, "has no inventory_digest"),
])
def test_a_run_without_a_validated_snapshot_is_refused(aws: dict[str, Any], validation: Any, says: str) -> None:
    """Training reads only the snapshot validation made; a summary without one starts nothing."""
    from prepare_training.service import DatasetSnapshotMissing

    with pytest.raises(DatasetSnapshotMissing, match=says) as caught:
        prepare(validation=validation)
    assert "\n" not in str(caught.value) and "runs/shapes_v1_bf3cc289798108cc/dataset/" in str(caught.value)
    assert aws["sagemaker"].list_training_jobs()["TrainingJobSummaries"] == []


def test_a_snapshot_of_another_run_is_refused(aws: dict[str, Any]) -> None:
    """A summary pointing the channels at another run's (or any other) prefix is not this run's snapshot."""
    from prepare_training.service import DatasetSnapshotMissing

    validation = {**support.load_event("prepare_training", "defaults")["validation"],
                  "snapshot_uri": "s3://d2ops-artifacts-example/runs/someone_else/dataset/"}
    with pytest.raises(DatasetSnapshotMissing, match="is not this run's snapshot"):
        prepare(validation=validation)
