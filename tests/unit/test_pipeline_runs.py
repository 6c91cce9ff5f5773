"""d2ops_core.run_ids: run ids and SageMaker names for any dataset name, version and object version."""

from __future__ import annotations

import random
import re
import string
from typing import Any

import pytest

from d2ops_core import run_ids, run_start, s3_layout, s3_probe, sagemaker_jobs

SAGEMAKER_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def test_many_random_names_give_valid_distinct_identifiers() -> None:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "._-"
    seen_runs: set[str] = set()
    seen_jobs: set[str] = set()
    for _ in range(2000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 64)))
        version = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 64)))
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        run_id = run_ids.run_id_for(name, version, token)
        assert EXECUTION_NAME.match(run_id), run_id
        assert run_id == run_ids.run_id_for(name, version, token)  # deterministic
        job = run_ids.sagemaker_name(run_id, "train")
        assert SAGEMAKER_NAME.match(job) and len(job) <= 63, job
        seen_runs.add(run_id)
        seen_jobs.add(job)
    assert len(seen_runs) == len(seen_jobs) == 2000


def test_the_object_version_decides_the_run() -> None:
    assert run_ids.run_id_for("shapes", "v1", "a") != run_ids.run_id_for("shapes", "v1", "b")
    assert run_start.object_version_token("3HL4kq", '"etag"') == "3HL4kq"
    assert run_start.object_version_token("null", '"d41d8cd9"') == "d41d8cd9"  # unversioned bucket
    assert run_start.object_version_token(None, "d41d8cd9") == "d41d8cd9"
    with pytest.raises(ValueError, match="neither a version id nor an ETag"):
        run_start.object_version_token(None, None)


NOT_MANIFESTS = ["datasets/a/manifest.json", "datasets/a/b/c/manifest.json", "datasets//v1/manifest.json",
                 "datasets/./v1/manifest.json", "datasets/a/../manifest.json", "x/a/b/manifest.json",
                 "datasets/a/b/Manifest.json", "datasets/a\\b/v1/manifest.json"]


@pytest.mark.parametrize("key", NOT_MANIFESTS)
def test_only_dataset_manifests_are_runs(key: str) -> None:
    with pytest.raises(s3_layout.NotADatasetManifest):
        s3_layout.parse_manifest_key(key)


def test_execution_arns_and_uris() -> None:
    sm = "arn:aws-cn:states:cn-north-1:123456789012:stateMachine:pipeline"
    assert run_ids.execution_arn(sm, "r_1") == "arn:aws-cn:states:cn-north-1:123456789012:execution:pipeline:r_1"
    with pytest.raises(ValueError, match="not a state machine ARN"):
        run_ids.execution_arn("arn:aws:states:us-east-1:1:execution:x:y", "r")
    assert s3_layout.parse_s3_uri("s3://my-bucket/datasets/a/b/") == ("my-bucket", "datasets/a/b/")
    with pytest.raises(ValueError, match="not an s3://bucket/key URI"):
        s3_layout.parse_s3_uri("https://my-bucket/x")


def test_bad_suffixes_are_refused() -> None:
    with pytest.raises(ValueError, match="suffix"):
        run_ids.sagemaker_name("r", "Train_Job")


def stubbed_s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client("s3", aws_access_key_id="testing", aws_secret_access_key="testing")


def test_existence_is_asked_by_listing_the_exact_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing champion is None without a GET (which a prefix-scoped role may see as 403)."""
    from botocore.stub import Stubber

    from d2ops_core.champion import CHAMPION_KEY, read_champion

    s3 = stubbed_s3(monkeypatch)
    with Stubber(s3) as stub:  # an unexpected GetObject would fail: nothing is stubbed for it
        listing = {"Bucket": "artifacts", "Prefix": CHAMPION_KEY, "MaxKeys": 1}
        stub.add_response("list_objects_v2", {"KeyCount": 0}, listing)
        assert read_champion(s3, "artifacts") is None
        stub.add_response("list_objects_v2", {"KeyCount": 1, "Contents": [{"Key": "champion.json.bak"}]}, listing)
        assert read_champion(s3, "artifacts") is None
        stub.add_response("list_objects_v2", {"KeyCount": 1, "Contents": [{"Key": CHAMPION_KEY}]}, listing)
        assert s3_probe.key_listed(s3, "artifacts", CHAMPION_KEY)
        stub.assert_no_pending_responses()


def test_the_run_layout_in_the_artifacts_bucket() -> None:
    run_id = run_ids.run_id_for("shapes", "v1", "abc")
    assert s3_layout.run_prefix(run_id) == f"runs/{run_id}/"
    assert s3_layout.validation_report_key(run_id) == f"runs/{run_id}/validation/report.json"
    assert s3_layout.checkpoint_uri("art", run_id) == f"s3://art/checkpoints/{run_id}/"
    assert s3_layout.training_output_uri("art", run_id) == f"s3://art/runs/{run_id}/training/"
    assert s3_layout.evaluation_report_uri("art", run_id) == f"s3://art/runs/{run_id}/evaluation/evaluation.json"
    # every run URI parses back to the bucket and a key under the run's prefix
    for uri in (s3_layout.training_output_uri("art", run_id), s3_layout.evaluation_report_uri("art", run_id)):
        bucket, key = s3_layout.parse_s3_uri(uri)
        assert bucket == "art" and key.startswith(s3_layout.run_prefix(run_id))


# How SageMaker (and its stand-ins) answer a Describe of a job that does not exist.
MISSING_ANSWERS = [("ValidationException", "Requested resource not found"),  # SageMaker, training
                   ("ValidationException", "Could not find requested job with name x-eval"),  # processing
                   ("ValidationException", "Could not find training job 'arn:aws:sagemaker:...'."),  # moto
                   ("ResourceNotFound", "Resource x does not exist")]
OTHER_ANSWERS = [("ThrottlingException", "Rate exceeded"), ("AccessDeniedException", "not authorized"),
                 ("ValidationException", "1 validation error detected: Value 'a_b' at 'trainingJobName' failed to "
                                         "satisfy constraint")]


@pytest.mark.parametrize(("code", "message"), MISSING_ANSWERS + OTHER_ANSWERS)
def test_describe_job_is_none_only_for_a_job_that_does_not_exist(code: str, message: str) -> None:
    """Throttling, access and other validation errors propagate: a job that could not be described is not
    a job that does not exist (the status API answers 503 for throttling, the release function retries)."""
    import boto3
    from botocore.exceptions import ClientError
    from botocore.stub import Stubber

    sagemaker = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(sagemaker) as stub:
        stub.add_client_error("describe_training_job", code, message, 400, expected_params={"TrainingJobName": "x"})
        stub.add_client_error("describe_processing_job", code, message, 400,
                              expected_params={"ProcessingJobName": "x"})
        for kind in ("training", "processing"):
            if (code, message) in MISSING_ANSWERS:
                assert sagemaker_jobs.describe_job(sagemaker, kind, "x") is None
            else:
                with pytest.raises(ClientError, match=code) as raised:
                    sagemaker_jobs.describe_job(sagemaker, kind, "x")
                assert not sagemaker_jobs.is_missing_job(raised.value)
        stub.assert_no_pending_responses()
    assert not sagemaker_jobs.is_missing_job(ValueError("not found"))  # not a client error at all


def test_describe_job_answers_from_moto(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sagemaker = boto3.client("sagemaker", aws_access_key_id="x", aws_secret_access_key="x")
        assert sagemaker_jobs.describe_job(sagemaker, "training", "never-made-train") is None
        assert sagemaker_jobs.describe_job(sagemaker, "processing", "never-made-eval") is None
        sagemaker.create_processing_job(
            ProcessingJobName="made-eval", RoleArn="arn:aws:iam::123456789012:role/r",
            AppSpecification={"ImageUri": "img"}, StoppingCondition={"MaxRuntimeInSeconds": 60},
            ProcessingResources={"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                   "VolumeSizeInGB": 1}},
            ProcessingOutputConfig={"Outputs": [{"OutputName": "o", "S3Output": {
                "S3Uri": s3_layout.evaluation_output_uri("art", "r"), "LocalPath": "/opt/ml/processing/output",
                "S3UploadMode": "EndOfJob"}}]})
        described = sagemaker_jobs.describe_job(sagemaker, "processing", "made-eval")
        assert described is not None and described["ProcessingJobName"] == "made-eval"
        assert sagemaker_jobs.described_job_output(described) == s3_layout.evaluation_output_uri("art", "r")
