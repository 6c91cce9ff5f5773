"""d2ops.sdk: the Estimator sends the very CreateTrainingJob request the pipeline's prepare step builds."""

from __future__ import annotations

import io
import json
import zipfile
from types import SimpleNamespace
from typing import Any

import pytest

from d2ops import sdk
from d2ops.offline.stack import load_stack

# The only member the SDK adds to the pipeline's request: it turns its own profiler off explicitly.
SDK_ONLY = {"ProfilerConfig": {"DisableProfiler": True}}
# Members the SDK leaves out when they hold the API's default (SageMaker reads a missing one as false).
SDK_OMITS_DEFAULTS = {"EnableManagedSpotTraining": False}


def _sent_request(settings: Any, **kwargs: Any) -> tuple[dict[str, Any], sdk.ExperimentJob]:
    """Fit the experiment with CreateTrainingJob answered in-process; returns what the SDK sent."""
    stack = load_stack()
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url="http://127.0.0.1:9",
                                    default_bucket=stack.artifacts_bucket)
    sent: dict[str, Any] = {}

    def answer(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        sent.update(json.loads(params["body"]))
        return SimpleNamespace(status_code=200), {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:"
                                                                    "training-job/x"}

    # Runs after botocore validated (AWS contract included) and serialised the request, in place of sending it.
    session.sagemaker_client.meta.events.register("before-call.sagemaker.CreateTrainingJob", answer)
    job = sdk.experiment_job(settings, f"s3://{stack.data_bucket}/datasets/shapes/v1/", sagemaker_session=session,
                             **kwargs)
    job.fit(wait=False)
    return sent, job


@pytest.fixture
def data_bucket() -> Any:
    """moto S3 with the stack's data bucket: the experiment lists its dataset prefix to size the volume."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=load_stack().data_bucket)
        yield s3


def test_the_estimator_sends_the_pipelines_training_job_request(data_bucket: Any) -> None:
    settings = sdk.offline_settings()
    body, job = _sent_request(settings, run_id="experiment-shapes-v1-1", training={"max_iter": 7, "seed": 3})
    assert job.job_name == "experiment-shapes-v1-1-train"
    # Key by key the prepare step's request, plus only what the SDK adds.
    assert {k: v for k, v in body.items() if k not in SDK_ONLY} == {
        k: v for k, v in job.request.items() if SDK_OMITS_DEFAULTS.get(k, ...) != v}
    assert {k: body[k] for k in body if k in SDK_ONLY} == SDK_ONLY
    assert job.request["HyperParameters"] == {"framework": settings.framework, "max_iter": "7", "seed": "3",
                                              "min_class_instances": str(settings.limits.min_class_instances)}
    assert job.request["AlgorithmSpecification"]["TrainingImage"] == settings.training_image_uri
    assert [c["ChannelName"] for c in job.request["InputDataConfig"]] == ["dataset"]
    assert list(job.inputs) == ["dataset"]  # the Estimator's fit sends the one channel
    assert job.request["ResourceConfig"]["VolumeSizeInGB"] == 50  # an empty prefix: the floor


def test_an_experiments_volume_is_sized_from_its_dataset_prefix(data_bucket: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation caught: the experiment's request sized without listing the prefix its channel downloads."""
    import botocore.client

    stack = load_stack()
    settings = sdk.offline_settings()
    prefix = "datasets/shapes/v1/"
    data_bucket.put_object(Bucket=stack.data_bucket, Key=prefix + "manifest.json", Body=b"{}")
    _, small = _sent_request(settings, run_id="experiment-small-1")
    original = botocore.client.BaseClient._make_api_call

    def sized(self: Any, operation: str, params: dict[str, Any]) -> Any:
        # The listing S3 would answer for a 70 GiB object under the prefix; nothing that large is written.
        answer = original(self, operation, params)
        if operation == "ListObjectsV2" and params.get("Prefix") == prefix:
            for item in answer.get("Contents") or []:
                item["Size"] = 70 * 1024**3
        return answer

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", sized)
    _, big = _sent_request(settings, run_id="experiment-big-1")
    assert small.request["ResourceConfig"]["VolumeSizeInGB"] == 50
    assert big.request["ResourceConfig"]["VolumeSizeInGB"] > 70


def test_spot_settings_and_checkpoints_follow_the_stack(data_bucket: Any) -> None:
    settings = sdk.offline_settings().model_copy(update={"use_spot": True, "max_training_seconds": 3600})
    body, _ = _sent_request(settings, run_id="experiment-spot-1")
    assert body["EnableManagedSpotTraining"] is True
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert body["CheckpointConfig"] == {"S3Uri": f"s3://{settings.artifacts_bucket}/checkpoints/experiment-spot-1/",
                                        "LocalPath": "/opt/ml/checkpoints"}


def test_overrides_past_the_stacks_limits_and_bad_uris_are_refused_by_name() -> None:
    stack = load_stack()
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url="http://127.0.0.1:9",
                                    default_bucket=stack.artifacts_bucket)
    settings = sdk.offline_settings()
    capped = settings.model_copy(update={"limits": settings.limits.model_copy(update={"max_iter": 100})})
    uri = f"s3://{stack.data_bucket}/datasets/shapes/v1/"
    with pytest.raises(sdk.ExperimentError, match="max_iter"):
        sdk.experiment_job(capped, uri, sagemaker_session=session, training={"max_iter": 1000})
    with pytest.raises(sdk.ExperimentError, match="max_itr"):  # a typo is named, as in a manifest
        sdk.experiment_job(capped, uri, sagemaker_session=session, training={"max_itr": 10})
    with pytest.raises(sdk.ExperimentError, match="datasets/<name>/<version>"):
        sdk.experiment_job(capped, f"s3://{stack.data_bucket}/shapes/", sagemaker_session=session)


def test_experiment_run_ids_never_read_as_pipeline_run_ids() -> None:
    from datetime import UTC, datetime

    from d2ops_core import run_ids

    run_id = sdk.experiment_run_id("my shapes", "v_2", datetime(2026, 11, 23, 4, 5, 6, tzinfo=UTC))
    assert run_id == "experiment-my-shapes-v-2-20261123T040506"
    assert run_ids.split_run_id(run_id) is None


def test_a_deployed_stacks_settings_are_its_prepare_functions_environment() -> None:
    import boto3
    from moto import mock_aws

    logical_id = "PrepareTrainingFunction"
    environment = load_stack().functions[logical_id].environment
    with mock_aws():
        session = boto3.session.Session(region_name="us-east-1")
        role = session.client("iam").create_role(RoleName="fn", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as archive:
            archive.writestr("handler.py", "def handler(event, context):\n    return event\n")
        session.client("s3").create_bucket(Bucket="code")
        session.client("s3").put_object(Bucket="code", Key="fn.zip", Body=code.getvalue())
        template = {"Resources": {logical_id: {"Type": "AWS::Lambda::Function", "Properties": {
            "Runtime": "python3.11", "Handler": "handler.handler", "Role": role,
            "Code": {"S3Bucket": "code", "S3Key": "fn.zip"}, "Environment": {"Variables": environment}}}}}
        session.client("cloudformation").create_stack(StackName="my-d2ops", TemplateBody=json.dumps(template))
        assert sdk.stack_settings("my-d2ops", session) == sdk.offline_settings()
        with pytest.raises(sdk.ExperimentError, match="stack not-deployed: cannot read its PrepareTrainingFunction"):
            sdk.stack_settings("not-deployed", session)


def test_an_experiment_fine_tunes_like_the_pipeline_and_is_refused_without_the_weights() -> None:
    import boto3
    from moto import mock_aws

    stack = load_stack()
    settings = sdk.offline_settings().model_copy(update={"framework": "detectron2"})
    key = settings.pretrained_weights_key
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=stack.data_bucket)
        with pytest.raises(sdk.ExperimentError, match=f"no pretrained weights at s3://{stack.data_bucket}/{key}"):
            _sent_request(settings, run_id="experiment-weights-1")
        s3.put_object(Bucket=stack.data_bucket, Key=key, Body=b"weights")
        _, job = _sent_request(settings, run_id="experiment-weights-2")
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job.request["InputDataConfig"]}
    assert channels["pretrained"] == f"s3://{stack.data_bucket}/{key}"
    assert "pretrained" in job.inputs  # the Estimator's fit sends it too
