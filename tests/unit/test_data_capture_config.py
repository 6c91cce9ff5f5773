"""Data capture on the real endpoint (issue 32): the stack parameters, the endpoint config prepare_training plans
and the state passes, the bucket's retention and encryption of what is captured, one claim a test."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.template import load_template
from d2ops_core import s3_layout
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training import handler as prepare_handler  # noqa: E402
from prepare_training.models import PrepareSettings  # noqa: E402

TEMPLATE = load_template()
PARAMETERS = TEMPLATE.document["Parameters"]


def artifacts_bucket() -> dict[str, Any]:
    return dict(TEMPLATE.resource("ArtifactsBucket")["Properties"])


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.prepare_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        support.put_pretrained_weights(s3)
        support.put_inventory(s3, support.RUN_ID)
        yield boto3.client("sagemaker")


def planned_capture(percent: str | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, Any]:
    if percent is not None and monkeypatch is not None:
        monkeypatch.setenv("CAPTURE_SAMPLING_PERCENTAGE", percent)
    plan = prepare_handler.handler(support.load_event("prepare_training", "defaults"), support.FakeLambdaContext())
    config: dict[str, Any] = plan["endpoint"]["data_capture_config"]
    return config


def create_config(sagemaker: Any, capture: dict[str, Any]) -> dict[str, Any]:
    """CreateEndpointConfig as the state sends it: botocore validates DataCaptureConfig against the API model."""
    sagemaker.create_model(ModelName="m", PrimaryContainer={"Image": "x"},
                           ExecutionRoleArn="arn:aws:iam::123456789012:role/endpoint")
    sagemaker.create_endpoint_config(EndpointConfigName="c", DataCaptureConfig=capture, ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    described: dict[str, Any] = sagemaker.describe_endpoint_config(EndpointConfigName="c")
    return described


def test_the_sampling_parameter_is_a_percentage_defaulting_to_10_and_reaches_prepare() -> None:
    """Mutations caught: another default, a range that cannot turn capture off (MinValue 1) or exceeds 100, the
    variable not passed to the prepare Lambda (it would plan its own default whatever the operator set)."""
    spec = PARAMETERS["CaptureSamplingPercentage"]
    assert (spec["Type"], spec["Default"], spec["MinValue"], spec["MaxValue"]) == ("Number", 10, 0, 100)
    env = TEMPLATE.function("PrepareTrainingFunction").environment
    assert env["CAPTURE_SAMPLING_PERCENTAGE"] == {"Ref": "CaptureSamplingPercentage"}
    assert PrepareSettings.model_fields["capture_sampling_percentage"].default == spec["Default"]


def test_the_plan_captures_requests_and_answers_to_the_artifacts_bucket_capture_prefix(aws: Any) -> None:
    """Mutations caught: a destination other than s3_layout's (the monitor and label select would find nothing),
    input or output not captured, answers base64-encoded (no JsonContentTypes), capture off by default."""
    capture = planned_capture()
    assert capture["DestinationS3Uri"] == s3_layout.capture_destination_uri(support.ARTIFACTS_BUCKET)
    assert capture["DestinationS3Uri"] == f"s3://{support.ARTIFACTS_BUCKET}/capture"
    assert sorted(o["CaptureMode"] for o in capture["CaptureOptions"]) == ["Input", "Output"]
    assert capture["CaptureContentTypeHeader"] == {"JsonContentTypes": ["application/json"]}
    assert (capture["EnableCapture"], capture["InitialSamplingPercentage"]) == (True, 10)
    described = create_config(aws, capture)["DataCaptureConfig"]
    assert described["DestinationS3Uri"] == capture["DestinationS3Uri"]


@pytest.mark.parametrize(("percent", "enabled"), [("0", False), ("100", True), ("37", True)])
def test_the_sampling_percentage_is_planned_and_0_turns_capture_off_in_a_config_sagemaker_accepts(
        aws: Any, monkeypatch: pytest.MonkeyPatch, percent: str, enabled: bool) -> None:
    """0 % is EnableCapture false (the state cannot leave DataCaptureConfig out), and SageMaker's model takes
    InitialSamplingPercentage 0 (its range is 0-100). Mutations caught: the setting ignored, 0 sent with
    EnableCapture true, a shape botocore refuses."""
    capture = planned_capture(percent, monkeypatch)
    assert (capture["EnableCapture"], capture["InitialSamplingPercentage"]) == (enabled, int(percent))
    create_config(aws, capture)  # botocore validates it: a bad shape or range raises here


@pytest.mark.parametrize("percent", ["-1", "101", "ten"])
def test_a_sampling_percentage_out_of_range_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                 percent: str) -> None:
    env = {**support.PREPARE_ENV, "CAPTURE_SAMPLING_PERCENTAGE": percent}
    with pytest.raises(ValueError, match="capture_sampling_percentage"):
        PrepareSettings.from_env(env)


def test_the_state_passes_the_planned_capture_config_whole() -> None:
    """Mutation caught: the state dropping DataCaptureConfig (the endpoint would capture nothing) or spelling
    its own (the stack parameter would not reach it)."""
    definition = json.loads(support.DEFINITION.read_text())
    create = all_states(definition)["Create endpoint config"]
    assert create["Resource"].endswith("aws-sdk:sagemaker:createEndpointConfig")
    assert create["Parameters"]["DataCaptureConfig.$"] == "$.plan.endpoint.data_capture_config"


def test_captured_objects_expire_after_the_retention_parameter() -> None:
    """Mutations caught: no rule on capture/ (images kept for ever), a fixed number of days, the rule disabled,
    the bytes kept the bucket's 30 noncurrent days after the expiry."""
    spec = PARAMETERS["CaptureRetentionDays"]
    assert (spec["Type"], spec["Default"]) == ("Number", 30) and spec["MinValue"] >= 1
    rules = [r for r in artifacts_bucket()["LifecycleConfiguration"]["Rules"] if r.get("Prefix") == "capture/"]
    assert len(rules) == 1
    (rule,) = rules
    assert rule["Status"] == "Enabled" and rule["ExpirationInDays"] == {"Ref": "CaptureRetentionDays"}
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 1
    assert s3_layout.capture_prefix("any-endpoint").startswith(rule["Prefix"])


def test_captured_objects_are_encrypted_like_the_rest_of_the_bucket(aws: Any) -> None:
    """SageMaker encrypts captured data with KmsKeyId when given, else the bucket's default applies. Mutation
    caught: the bucket moved to KMS without the capture config naming its key (or the other way round)."""
    (default,) = artifacts_bucket()["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    algorithm = default["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
    capture = planned_capture()
    if algorithm == "AES256":
        assert "KmsKeyId" not in capture
    else:  # aws:kms: the capture must name the bucket's key (and the endpoint role may use it)
        assert capture.get("KmsKeyId") == default["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]


def test_the_smoke_test_marks_its_requests_so_capture_readers_can_leave_them_out() -> None:
    """botocore's Stubber checks the request the smoke test really sends (and validates it against the API
    model: InferenceId's length and pattern). Mutation caught: the InferenceId dropped (smoke-test images
    would count as traffic in the monitor and the labelling queue)."""
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    support.function_path("smoke_test_endpoint")
    from smoke_test_endpoint.models import SmokeTestEvent
    from smoke_test_endpoint.service import _invoke_once

    from d2ops_core.documents.capture import SMOKE_TEST_INFERENCE_ID

    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", aws_access_key_id="x",
                           aws_secret_access_key="x")
    event = SmokeTestEvent(endpoint_name="d2ops-detector", bucket="b", prefix="datasets/shapes/v1/")
    with Stubber(runtime) as stub:
        answer = b'{"detections": [], "image": {"width": 4, "height": 3}}'
        stub.add_response("invoke_endpoint", {"Body": StreamingBody(io.BytesIO(answer), len(answer)),
                                              "ContentType": "application/json"},
                          {"EndpointName": "d2ops-detector", "ContentType": "image/png", "Accept": "application/json",
                           "Body": b"png", "InferenceId": SMOKE_TEST_INFERENCE_ID})
        _invoke_once(event, runtime, "images/a.png", b"png", "image/png")
        stub.assert_no_pending_responses()
