"""Fine-tuning by default (issue 20): PretrainedWeightsKey in the template, the prepare step's
`pretrained` channel and its refusal, before training, of a run whose weights are not there."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from d2ops import template as sam
from d2ops_core import pretrained
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training import handler as prepare_handler  # noqa: E402
from prepare_training.models import PrepareSettings  # noqa: E402
from prepare_training.service import (  # noqa: E402
    PretrainedWeightsAmbiguous,
    PretrainedWeightsMissing,
    PretrainedWeightsUnreadable,
    require_pretrained_weights,
)

KEY = pretrained.DEFAULT_KEY


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.prepare_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        s3.create_bucket(Bucket=support.DATA_BUCKET)
        support.put_inventory(s3, support.RUN_ID)
        yield s3


def prepare() -> dict[str, Any]:
    return dict(prepare_handler.handler(support.load_event("prepare_training", "defaults"),
                                        support.FakeLambdaContext()))


def channels(plan: dict[str, Any]) -> dict[str, str]:
    return {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in plan["training_job"]["InputDataConfig"]}


def test_the_template_default_is_the_documented_key_of_the_default_config() -> None:
    spec = sam.load_template().document["Parameters"]["PretrainedWeightsKey"]
    assert spec["Default"] == KEY == "pretrained/COCO-Detection/faster_rcnn_R_50_FPN_3x.pkl"
    assert spec["AllowedPattern"] == pretrained.KEY_PATTERN  # one rule for CloudFormation and the prepare step
    assert re.match(spec["AllowedPattern"], pretrained.SCRATCH)
    for bad in ("pretrained/*", "/abs.pkl", "a//b.pkl", "a b.pkl"):
        assert not re.match(spec["AllowedPattern"], bad), bad
    env = sam.load_template().functions()["PrepareTrainingFunction"].environment
    assert env["PRETRAINED_WEIGHTS_KEY"] == {"Ref": "PretrainedWeightsKey"}
    assert env["DATA_BUCKET"] == {"Ref": "DataBucket"}


def _role_statements(logical_id: str, key: str) -> list[dict[str, Any]]:
    tpl = sam.load_template()
    refs = {**tpl.parameter_defaults(), "PretrainedWeightsKey": key, "DataBucket": "data", "ArtifactsBucket": "art",
            "AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": support.ACCOUNT,
            "AWS::StackName": "d2ops", "TrainingImageUri": support.PREPARE_ENV["TRAINING_IMAGE_URI"]}

    def getatt(name: str, attribute: str) -> str:
        return f"arn:aws:s3:::{refs[name]}" if attribute == "Arn" and name in ("DataBucket", "ArtifactsBucket") \
            else f"{name}.{attribute}"

    props = tpl.resource(logical_id)["Properties"]
    # an IAM role's policies wrap their documents; a SAM function lists documents
    documents = [p.get("PolicyDocument", p) for p in props["Policies"]]
    resolved = sam.resolve(documents, refs, getatt=getatt, conditions=lambda n: tpl.condition(n, refs))
    return [s for d in resolved for s in d["Statement"] if s]


@pytest.mark.parametrize("logical_id", ["TrainingJobRole", "PrepareTrainingFunction"])
def test_the_roles_reach_exactly_the_weights_key(logical_id: str) -> None:
    statements = _role_statements(logical_id, "pretrained/mine/model.pkl")
    data = [s for s in statements if "arn:aws:s3:::data" in str(s["Resource"])]
    lists = [s for s in data if s["Action"] == "s3:ListBucket"]
    weights = [s for s in lists if "datasets" not in str(s["Condition"])]
    # ListBucket on exactly the key: S3 then answers an empty listing (not 403) for a missing object.
    assert [s["Condition"] for s in weights] == [{"StringEquals": {"s3:prefix": "pretrained/mine/model.pkl"}}]
    reads = [s["Resource"] for s in data if s["Action"] == "s3:GetObject"]
    assert "arn:aws:s3:::data/pretrained/*" not in str(reads)
    # none: neither the job nor the prepare step gets anything in the data bucket for weights
    assert "s3:prefix': 'none'" not in str(_role_statements(logical_id, pretrained.SCRATCH))
    assert "pretrained" not in str(_role_statements(logical_id, pretrained.SCRATCH))
    if logical_id == "TrainingJobRole":
        assert "arn:aws:s3:::data/pretrained/mine/model.pkl" in reads
    else:
        assert reads == []  # the prepare step lists; it never reads the weights


def test_the_pretrained_channel_is_exactly_the_key(aws: Any) -> None:
    support.put_pretrained_weights(aws)
    plan = prepare()
    assert channels(plan)["pretrained"] == f"s3://{support.DATA_BUCKET}/{KEY}"
    assert "weights" not in plan["training_job"]["HyperParameters"]
    boto3.client("sagemaker").create_training_job(**plan["training_job"])  # botocore's model accepts it


def test_missing_weights_fail_the_prepare_step_with_the_key_and_the_command(aws: Any) -> None:
    aws.put_object(Bucket=support.DATA_BUCKET, Key=KEY + ".old", Body=b"x")  # a prefix match is not the object
    with pytest.raises(PretrainedWeightsMissing) as raised:
        prepare()
    line = str(raised.value)
    assert "\n" not in line
    assert f"s3://{support.DATA_BUCKET}/{KEY}" in line
    assert "`d2ops weights upload FILE --stack d2ops`" in line
    assert pretrained.MODEL_ZOO_CHECKPOINTS["COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml"] in line
    assert "PretrainedWeightsKey=none" in line


def test_another_object_under_the_key_is_refused_before_the_job_would_fail_downloading_it(aws: Any) -> None:
    """Mutation caught: dropping the check (the job then fails at SageMaker's download of KEY.old)."""
    aws.put_object(Bucket=support.DATA_BUCKET, Key=KEY, Body=b"weights")
    aws.put_object(Bucket=support.DATA_BUCKET, Key=KEY + ".old", Body=b"x")
    with pytest.raises(PretrainedWeightsAmbiguous, match=re.escape(f"s3://{support.DATA_BUCKET}/{KEY}.old")):
        prepare()


def test_forbidden_is_not_reported_as_missing() -> None:
    settings = PrepareSettings.from_env(support.PREPARE_ENV)
    s3 = boto3.client("s3", region_name=support.REGION, aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(s3) as stub:
        stub.add_client_error("list_objects_v2", service_error_code="AccessDenied", http_status_code=403)
        with pytest.raises(PretrainedWeightsUnreadable, match=f"s3://{support.DATA_BUCKET}/{re.escape(KEY)}"):
            require_pretrained_weights(s3, settings)


def test_none_trains_from_scratch_without_a_channel_or_a_check(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRETRAINED_WEIGHTS_KEY", pretrained.SCRATCH)
    plan = prepare()  # nothing at any key
    assert set(channels(plan)) == {"dataset"}
    assert plan["training_job"]["HyperParameters"] == {"framework": "detectron2", "weights": "scratch",
                                                       "inventory_digest": plan["inventory_digest"],
                                                       "min_class_instances": "30"}


def test_the_torchvision_trainer_gets_no_detectron2_checkpoint(aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAMEWORK", "torchvision")
    plan = prepare()
    assert set(channels(plan)) == {"dataset"}
    assert plan["training_job"]["HyperParameters"] == {"framework": "torchvision",
                                                       "inventory_digest": plan["inventory_digest"],
                                                       "min_class_instances": "30"}


def test_a_key_with_wildcards_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="pretrained_weights_key"):
        PrepareSettings.from_env({**support.PREPARE_ENV, "PRETRAINED_WEIGHTS_KEY": "pretrained/*"})


@pytest.mark.parametrize(("manifest", "instance", "refused"), [
    ({"task": "instance_segmentation"}, "ml.g4dn.xlarge", "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml"),
    ({"training": {"model": "COCO-Detection/retinanet_R_50_FPN_3x.yaml"}}, "ml.g4dn.xlarge", "retinanet"),
    ({"task": "instance_segmentation"}, "ml.m5.xlarge", None),  # a CPU instance trains the CPU profile
    ({"training": {"model": "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml"}}, "ml.g4dn.xlarge", None),
    # a config shipped in the image is not a model-zoo config: the operator's key is taken as meant for it
    ({"training": {"model": "faster_rcnn_R_50_FPN_small_objects.yaml"}}, "ml.g4dn.xlarge", None),
])
def test_a_documented_key_must_name_the_config_the_run_trains(manifest: dict[str, Any], instance: str,
                                                               refused: str | None) -> None:
    from prepare_training.models import PrepareEvent
    from prepare_training.service import PretrainedWeightsMismatch, build_plan

    settings = PrepareSettings.from_env({**support.PREPARE_ENV, "TRAINING_INSTANCE_TYPE": instance})
    event = PrepareEvent.model_validate({**support.load_event("prepare_training", "defaults"), "manifest": manifest})
    if refused is None:
        build_plan(settings, event, None)
        return
    with pytest.raises(PretrainedWeightsMismatch, match=re.escape(KEY)) as raised:
        build_plan(settings, event, None)
    assert refused in str(raised.value) and "\n" not in str(raised.value)
    # a key of the operator's own naming is theirs to choose
    own = PrepareSettings.from_env({**support.PREPARE_ENV, "TRAINING_INSTANCE_TYPE": instance,
                                    "PRETRAINED_WEIGHTS_KEY": "pretrained/our-own/model.pkl"})
    build_plan(own, event, None)
