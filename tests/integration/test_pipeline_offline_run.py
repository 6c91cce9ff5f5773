"""The real definition with the real Lambda handlers, against moto's server on loopback.

Only what cannot run here is stood in for: the Step Functions service (the ASL interpreter),
SageMaker's containers (moto runs the control plane; the evaluation job's output is written
by the test) and the endpoint's runtime (a local InvokeEndpoint endpoint). The Lambdas reach
AWS through boto3 and AWS_ENDPOINT_URL, unmodified.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from d2ops import synth
from d2ops import template as sam
from d2ops.asl.interpreter import Execution
from d2ops_core import run_ids, run_start, s3_layout
from d2ops_core.champion import CHAMPION_KEY, ChampionRecord
from d2ops_core.dataset_diff import compare, directory_reader, index_version
from d2ops_core.dataset_identity import DatasetRef
from d2ops_core.documents.dataset_diff import DatasetDiff, DatasetDiffSummary
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import Boto3Integrations, FakeRuntime, LambdaInvoker

pytestmark = pytest.mark.integration

DETECTIONS = {"detections": [{"box": [3.0, 4.0, 20.5, 30.0], "score": 0.91, "class_id": 1, "class_name": "square"}],
              "image": {"width": 64, "height": 64}}
# The challenger artifact's score_thresholds as the evaluation job copies them into its report.
CHALLENGER_THRESHOLDS = {"square": 0.61, "disc": 0.5538, "traffic light": 0.4}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp, support.fake_runtime() as runtime_url:
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": runtime_url,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": support.REGION,
               "POWERTOOLS_TRACE_DISABLED": "1", "POWERTOOLS_LOG_LEVEL": "WARNING",
               **support.PREPARE_ENV}
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        s3, sns, sqs = boto3.client("s3"), boto3.client("sns"), boto3.client("sqs")
        for bucket in (support.DATA_BUCKET, support.ARTIFACTS_BUCKET):
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        support.put_pretrained_weights(s3)
        topic = sns.create_topic(Name=support.TOPIC_ARN.rpartition(":")[2])["TopicArn"]
        assert topic == support.TOPIC_ARN
        queue = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
        table = sam.load_template().resource("EndpointLeaseTable")["Properties"]
        boto3.client("dynamodb").create_table(TableName=support.LEASE_TABLE, KeySchema=table["KeySchema"],
                                              AttributeDefinitions=table["AttributeDefinitions"],
                                              BillingMode=table["BillingMode"])
        boto3.client("sagemaker").create_model_package_group(ModelPackageGroupName=support.substitutions()["ModelPackageGroupName"])
        yield {"s3": s3, "sqs": sqs, "queue": queue, "sagemaker": boto3.client("sagemaker"), "lambdas": LambdaInvoker(),
               "dynamodb": boto3.client("dynamodb")}
    server.stop()


def upload(stack: dict[str, Any], tmp: Path, version: str, *, drop_image: bool = False,
           manifest: dict[str, Any] | None = None, without_val: bool = False,
           rename_image: bool = False) -> DatasetRef:
    local = tmp / version
    synth.generate(local, images=8, size=64, version=version, seed=len(version))
    if rename_image:  # the first train image under a new name: the same bytes, so a rename to the dataset diff
        doc = json.loads((local / "annotations/train.json").read_text())
        old = doc["images"][0]["file_name"]
        doc["images"][0]["file_name"] = old.replace(".jpg", "-renamed.jpg")
        (local / "images" / old).rename(local / "images" / doc["images"][0]["file_name"])
        (local / "annotations/train.json").write_text(json.dumps(doc))
    if without_val:  # a train-only version: val is derived (d2ops_core.validation.split)
        doc = json.loads((local / "manifest.json").read_text())
        (local / doc.pop("val")).unlink()
        (local / "manifest.json").write_text(json.dumps(doc))
    if manifest:
        doc = json.loads((local / "manifest.json").read_text())
        (local / "manifest.json").write_text(json.dumps({**doc, **manifest}))
    if drop_image:
        next(p for p in sorted((local / "images").rglob("*")) if p.is_file()).unlink()
    prefix = s3_layout.dataset_prefix("shapes", version)
    for path in sorted(p for p in local.rglob("*") if p.is_file() and p.name != "manifest.json"):
        stack["s3"].upload_file(str(path), support.DATA_BUCKET, prefix + path.relative_to(local).as_posix())
    key = prefix + "manifest.json"  # last, as the contract says
    put = stack["s3"].put_object(Bucket=support.DATA_BUCKET, Key=key, Body=(local / "manifest.json").read_bytes())
    return run_start.dataset_ref(support.DATA_BUCKET, key, put["VersionId"], put["ETag"])


def write_evaluation(stack: dict[str, Any], kind: str, request: dict[str, Any]) -> None:
    """What the evaluation container writes: evaluation.json in the job's output prefix."""
    if kind != "ProcessingJob":
        return
    inputs = {i["InputName"] for i in request["ProcessingInputs"]}
    scores = {"metrics": {"bbox_AP": 0.55, "bbox_AP50": 0.9, "bbox_AP75": 0.6}, "per_class": {}}
    champion = {"metrics": {"bbox_AP": 0.5, "bbox_AP50": 0.88, "bbox_AP75": 0.5}} if "champion" in inputs else None
    # Enough held-out images (MinComparedImages) for the gate to approve the better challenger unattended.
    report: dict[str, Any] = {"primary_metric": "bbox_AP", "val_images": 60, "class_instances": {},
                              "challenger": scores, "champion": champion,
                              "challenger_score_thresholds": CHALLENGER_THRESHOLDS}
    if champion is not None:
        report["comparison"] = support.point_comparison(report)
        report["held_out"] = support.held_out(report)
    bucket, prefix = s3_layout.parse_s3_uri(request["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"])
    stack["s3"].put_object(Bucket=bucket, Key=prefix + "evaluation.json", Body=json.dumps(report))


class WithUpdateEndpoint(Boto3Integrations):
    """moto 5.2.5 has no UpdateEndpoint: switch the endpoint's config in moto's backend (it runs in
    this process), after the same existence checks SageMaker makes."""

    def __call__(self, resource: str, parameters: Any, context: Any) -> Any:
        if not resource.endswith(":sagemaker:updateEndpoint"):
            return super().__call__(resource, parameters, context)
        from moto.sagemaker.models import sagemaker_backends

        self.calls.append(("sagemaker:updateEndpoint", parameters))
        client = boto3.client("sagemaker")
        endpoint = client.describe_endpoint(EndpointName=parameters["EndpointName"])
        config = client.describe_endpoint_config(EndpointConfigName=parameters["EndpointConfigName"])
        fake = sagemaker_backends[support.ACCOUNT][support.REGION].endpoints[parameters["EndpointName"]]
        fake.endpoint_config_name = config["EndpointConfigName"]
        return {"EndpointArn": endpoint["EndpointArn"]}


def run(stack: dict[str, Any], dataset: DatasetRef,
        lambdas: Any = None) -> tuple[Execution, Boto3Integrations]:
    # One answer per smoke-test request (the state's Payload.requests).
    requests = all_states(support.machine().definition)["Smoke test endpoint"]["Parameters"]["Payload"]["requests"]
    FakeRuntime.answers += [(200, "application/json", json.dumps(DETECTIONS).encode())] * requests
    aws = WithUpdateEndpoint(after_job=lambda kind, request: write_evaluation(stack, kind, request))
    trigger = run_start.Trigger(source="s3-event", object_key=dataset.manifest_key,
                                object_version=dataset.manifest_version)
    run_id = run_ids.run_id_for(dataset.name, dataset.version, dataset.manifest_version)
    execution = support.machine().run(run_start.execution_input(dataset, trigger), execution_name=run_id,
                                      executors={"arn:aws:states:::lambda:invoke": lambdas or stack["lambdas"],
                                                 "arn:aws:states:::*": aws})
    return execution, aws


def notifications(stack: dict[str, Any]) -> list[dict[str, Any]]:
    messages = stack["sqs"].receive_message(QueueUrl=stack["queue"], MaxNumberOfMessages=10).get("Messages", [])
    for m in messages:
        stack["sqs"].delete_message(QueueUrl=stack["queue"], ReceiptHandle=m["ReceiptHandle"])
    return [json.loads(m["Body"]) for m in messages]


def champion(stack: dict[str, Any]) -> ChampionRecord:
    body = stack["s3"].get_object(Bucket=support.ARTIFACTS_BUCKET, Key=CHAMPION_KEY)["Body"].read()
    return ChampionRecord.model_validate_json(body)


def test_first_deployment_then_blue_green_update(stack: dict[str, Any], tmp_path: Path) -> None:
    first, aws = run(stack, upload(stack, tmp_path, "v1"))
    assert first.status == "SUCCEEDED", (first.error, first.cause)
    called = [name for name, _ in aws.calls]
    assert "sagemaker:createEndpoint" in called and "sagemaker:updateEndpoint" not in called
    record = champion(stack)
    assert record.run_id == first.name and record.primary_value == 0.55
    endpoint = stack["sagemaker"].describe_endpoint(EndpointName=support.ENDPOINT_NAME)
    assert endpoint["EndpointStatus"] == "InService" and endpoint["EndpointConfigName"] == record.endpoint_config_name
    (message,) = notifications(stack)
    assert message["run_id"] == first.name and message["gate"]["decision"] == "approved"
    # Priced by the compose_notification function from moto's job records: the endpoint's time so
    # far is always known; what moto leaves out (training times) is absent, never made up.
    cost = message["cost"]
    assert cost["endpoint"]["instance_type"] == first.output["plan"]["endpoint"]["instance_type"]
    assert cost["endpoint"]["seconds"] >= 0 and message["cost_unknown"] is None
    assert cost["total_usd"] == pytest.approx(sum(cost[p]["cost_usd"] for p in ("training", "evaluation", "endpoint")
                                                  if cost[p] is not None), abs=1e-5)
    assert message["cost_summary"].startswith("$") and " so far; us-east-1 prices of " in message["cost_summary"]
    report = first.output["validation"]["summary"]["report_uri"]
    assert stack["s3"].head_object(**dict(zip(("Bucket", "Key"), s3_layout.parse_s3_uri(report), strict=True)))
    assert FakeRuntime.requests[-1][0] == f"/endpoints/{support.ENDPOINT_NAME}/invocations"
    # The challenger's per-class thresholds reach its registry entry, in the form CustomerMetadataProperties takes.
    (register,) = [p for name, p in aws.calls if name == "sagemaker:createModelPackage"]
    assert register["CustomerMetadataProperties"]["score_thresholds"] == "square=0.61 disc=0.5538 traffic_light=0.4"

    second, aws = run(stack, upload(stack, tmp_path, "v2", rename_image=True))
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    called = [name for name, _ in aws.calls]
    assert "sagemaker:updateEndpoint" in called and "sagemaker:createEndpoint" not in called
    job = stack["sagemaker"].describe_processing_job(ProcessingJobName=second.output["plan"]["names"]["evaluation_job"])
    champion_input = next(i for i in job["ProcessingInputs"] if i["InputName"] == "champion")
    assert champion_input["S3Input"]["S3Uri"] == record.model_data  # evaluated against the first run's model
    assert second.output["evaluation"]["champion_value"] == 0.5
    assert champion(stack).run_id == second.name
    endpoint = stack["sagemaker"].describe_endpoint(EndpointName=support.ENDPOINT_NAME)
    assert endpoint["EndpointConfigName"] == second.output["plan"]["names"]["endpoint_config"]
    group = support.substitutions()["ModelPackageGroupName"]
    packages = stack["sagemaker"].list_model_packages(ModelPackageGroupName=group)["ModelPackageSummaryList"]
    assert sorted(p["ModelApprovalStatus"] for p in packages) == ["Approved", "Approved"]
    assert notifications(stack)[0]["run_id"] == second.name

    # What changed in the data since the champion: computed by the real prepare Lambda from both runs'
    # inventories and snapshots, stored next to the run, the same counts `d2ops diff` gives the two directories.
    assert first.output["plan"]["dataset_diff"] is None  # no champion yet
    summary = DatasetDiffSummary.model_validate(second.output["plan"]["dataset_diff"])
    assert summary.error is None and summary.champion_run_id == first.name and summary.against == "shapes/v1"
    bucket, key = s3_layout.parse_s3_uri(summary.uri or "")
    assert key == s3_layout.dataset_diff_key(second.name)
    stored = DatasetDiff.model_validate_json(stack["s3"].get_object(Bucket=bucket, Key=key)["Body"].read())
    assert (stored.a.run_id, stored.b.run_id) == (first.name, second.name)
    assert stored.a.source == stored.b.source == "run snapshot"
    assert stored.b.inventory_digest == second.output["validation"]["summary"]["inventory_digest"]
    local = compare(*(index_version(str(tmp_path / v) + "/", "directory", *directory_reader(str(tmp_path / v)))
                      for v in ("v1", "v2")))
    assert stored.images == local.images and stored.classes == local.classes
    assert (summary.renamed, summary.added, summary.removed, summary.same) == (1, 0, 0, False)


def test_an_invalid_dataset_is_rejected_by_the_real_validator(stack: dict[str, Any], tmp_path: Path) -> None:
    execution, aws = run(stack, upload(stack, tmp_path, "broken", drop_image=True))
    assert execution.status == "FAILED" and execution.error == "DatasetRejected", execution.cause
    assert [name for name, _ in aws.calls] == ["sns:publish"]  # nothing trained
    (message,) = notifications(stack)
    assert message["error"] == "DatasetRejected" and message["first_errors"]
    assert message["cost"] is None and message["cost_summary"] == "no SageMaker job ran: nothing billed"
    bucket, key = s3_layout.parse_s3_uri(message["report_uri"])
    report = json.loads(stack["s3"].get_object(Bucket=bucket, Key=key)["Body"].read())
    assert report  # the full report sits next to the run's artifacts


def test_a_manifest_that_loosens_the_stack_gate_is_rejected_before_training(stack: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    # The attack of issue 10: the stack's gate is MinMap 0.30 / MaxRegression 0.01 (support.PREPARE_ENV).
    loose = {"gate": {"min_map": 0, "max_regression": 1}, "training": {"max_iter": 1}}
    execution, aws = run(stack, upload(stack, tmp_path, "loose", manifest=loose))
    assert execution.status == "FAILED" and execution.error == "DatasetRejected", execution.cause
    assert [name for name, _ in aws.calls] == ["sns:publish"]  # no training job, no endpoint
    (message,) = notifications(stack)
    assert [e["code"] for e in message["first_errors"]] == ["GATE_MIN_MAP_BELOW_STACK",
                                                            "GATE_MAX_REGRESSION_ABOVE_STACK"]
    assert message["first_errors"][0]["location"] == "manifest.json:gate.min_map"
    bucket, key = s3_layout.parse_s3_uri(message["report_uri"])
    report = json.loads(stack["s3"].get_object(Bucket=bucket, Key=key)["Body"].read())
    assert {i["code"] for i in report["errors"]} == {"GATE_MAX_REGRESSION_ABOVE_STACK", "GATE_MIN_MAP_BELOW_STACK"}
    assert "MinMap 0.3" in report["errors"][0]["message"]
    listed = stack["s3"].list_objects_v2(Bucket=support.ARTIFACTS_BUCKET, Prefix=f"runs/{execution.name}/")
    # only the validation report and the inventory of what it read: nothing trained, nothing snapshotted
    assert [o["Key"] for o in listed["Contents"]] == [s3_layout.inventory_key(execution.name), key]


def test_a_version_without_val_runs_on_a_derived_split_recorded_in_the_run(stack: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    execution, _ = run(stack, upload(stack, tmp_path, "trainonly", without_val=True))
    assert execution.status == "SUCCEEDED", (execution.error, execution.cause)
    derived = execution.output["validation"]["summary"]["derived_split"]  # in the run, not only in the report
    assert derived["keyed_on"] == "shapes" and derived["val_images"] >= 1 and derived["train_images"] >= 1
    bucket, key = s3_layout.parse_s3_uri(execution.output["validation"]["summary"]["report_uri"])
    report = json.loads(stack["s3"].get_object(Bucket=bucket, Key=key)["Body"].read())
    assert report["derived_split"] == derived
    assert report["splits"]["val"]["images"] == derived["val_images"]
    job = stack["sagemaker"].describe_training_job(TrainingJobName=execution.output["plan"]["names"]["training_job"])
    # no val split of its own: the dataset channel is the version, and the trainer derives the same split
    assert {c["ChannelName"] for c in job["InputDataConfig"]} == {"dataset", "pretrained"}


def test_a_version_over_the_inline_limit_is_checked_by_the_distributed_map_and_trains_on_its_snapshot(
        stack: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past InlineImageLimit the images are checked and copied by the Distributed Map's real check_images
    Lambda (ItemReader, ItemBatcher, ResultWriter through moto's S3), merged by the real summarize handler;
    an image overwritten in the data bucket right after validation never reaches the jobs: their channels
    are the snapshot, which holds the validated bytes."""
    import hashlib

    monkeypatch.setenv("INLINE_IMAGE_LIMIT", "2")
    dataset = upload(stack, tmp_path, "v7")
    local = tmp_path / "v7"
    images = sorted(p for p in (local / "images").rglob("*") if p.is_file())
    assert len(images) > 2  # over the limit: the Map path
    victim = images[0].relative_to(local).as_posix()
    validated = images[0].read_bytes()
    summarize_arn = support.substitutions()["SummarizeImagesFunctionArn"]

    def overwrite_after_validation(resource: str, parameters: Any, context: Any) -> Any:
        answer = stack["lambdas"](resource, parameters, context)
        if parameters["FunctionName"] == summarize_arn:  # validated, snapshotted: now someone syncs again
            stack["s3"].put_object(Bucket=support.DATA_BUCKET, Key=dataset.prefix + victim, Body=b"tampered")
        return answer

    execution, aws = run(stack, dataset, lambdas=overwrite_after_validation)
    assert execution.status == "SUCCEEDED", (execution.error, execution.cause)
    entered = support.entered_states(execution)
    assert entered[:5] == ["Validate dataset", "Dataset valid?", "Check images", "Summarize image checks",
                           "Dataset valid?"]
    batches = support.task_parameters(execution, "Check image batch")
    assert sum(len(b["Payload"]["Items"]) for b in batches) == len(images)
    summary = execution.output["validation"]["summary"]
    assert summary["valid"] is True and summary["images_pending"] is False
    snapshot = s3_layout.snapshot_uri(support.ARTIFACTS_BUCKET, execution.name)
    assert summary["snapshot_uri"] == snapshot
    manifest_key = execution.output["image_check"]["ResultWriterDetails"]["Key"]
    assert manifest_key.startswith(s3_layout.image_results_prefix(execution.name) + "/")
    stack["s3"].head_object(Bucket=support.ARTIFACTS_BUCKET, Key=manifest_key)

    # The data bucket now holds other bytes; the jobs read the snapshot, which holds the validated ones.
    assert stack["s3"].get_object(Bucket=support.DATA_BUCKET, Key=dataset.prefix + victim)["Body"].read() == b"tampered"
    (train_request,) = [p for name, p in aws.calls if name == "sagemaker:createTrainingJob"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in train_request["InputDataConfig"]}
    assert channels.pop("dataset") == snapshot and set(channels) <= {"pretrained"}  # the snapshot, downloaded once
    (eval_request,) = [p for name, p in aws.calls if name == "sagemaker:createProcessingJob"]
    assert {i["InputName"]: i["S3Input"]["S3Uri"] for i in eval_request["ProcessingInputs"]}["dataset"] == snapshot
    bucket, prefix = s3_layout.parse_s3_uri(snapshot)
    trained_on = stack["s3"].get_object(Bucket=bucket, Key=prefix + victim)
    assert trained_on["Body"].read() == validated
    tags = stack["s3"].get_object_tagging(Bucket=bucket, Key=prefix + victim)["TagSet"]
    assert {"Key": "d2ops-snapshot", "Value": "true"} in tags
    # Every object the channel hands the job is the local version's file, byte for byte.
    listed = stack["s3"].list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    assert {o["Key"][len(prefix):] for o in listed} == {p.relative_to(local).as_posix() for p in local.rglob("*")
                                                        if p.is_file()}
    for obj in listed:
        body = stack["s3"].get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert body == (local / obj["Key"][len(prefix):]).read_bytes(), obj["Key"]

    # The inventory's digest: in the summary, the training job, the plan and the registry entry.
    inventory = stack["s3"].get_object(Bucket=support.ARTIFACTS_BUCKET, Key=s3_layout.inventory_key(execution.name))
    digest = "sha256:" + hashlib.sha256(inventory["Body"].read()).hexdigest()
    assert summary["inventory_digest"] == digest
    assert train_request["HyperParameters"]["inventory_digest"] == digest
    (register,) = [p for name, p in aws.calls if name == "sagemaker:createModelPackage"]
    assert register["CustomerMetadataProperties"]["inventory_digest"] == digest
    assert register["CustomerMetadataProperties"]["dataset_snapshot"] == snapshot
