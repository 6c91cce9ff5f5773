"""The status API: routes through the real Powertools resolver against moto (S3, Step Functions,
SageMaker); run details from executions of the real definition in the ASL interpreter."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops import runs
from d2ops.asl.interpreter import Execution
from d2ops.champion import CHAMPION_KEY
from tests.fixtures.pipeline import support

support.function_path("status_api")
support.function_path("start_pipeline")
from start_pipeline import handler as start_handler  # noqa: E402
from status_api import handler as api  # noqa: E402
from status_api import service  # noqa: E402

OPENAPI_DOC = support.REPO / "docs" / "status-api.openapi.json"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    support.aws_env(monkeypatch)
    with mock_aws():
        s3, sfn, sm = boto3.client("s3"), boto3.client("stepfunctions"), boto3.client("sagemaker")
        for bucket in (support.DATA_BUCKET, support.ARTIFACTS_BUCKET):
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        monkeypatch.setenv("STATE_MACHINE_ARN", support.create_state_machine(sfn))
        monkeypatch.setenv("DATA_BUCKET", support.DATA_BUCKET)
        monkeypatch.setenv("ARTIFACTS_BUCKET", support.ARTIFACTS_BUCKET)
        monkeypatch.setenv("MODEL_PACKAGE_GROUP_NAME", "d2ops-models")
        yield {"s3": s3, "sfn": sfn, "sagemaker": sm}


def call(method: str, path: str, query: dict[str, str] | None = None, body: Any = None) -> tuple[int, Any]:
    case = {"GET": "list_runs", "POST": "start_run"}[method]
    event = copy.deepcopy(support.load_event("status_api", case))
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["queryStringParameters"] = query or None
    event["rawQueryString"] = "&".join(f"{k}={v}" for k, v in (query or {}).items())
    if body is not None:
        event["body"] = body if isinstance(body, str) else json.dumps(body)
    response = api.handler(event, support.FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"]) if response.get("body") else None


def upload_manifest(s3: Any, name: str, version: str, content: bytes = b'{"name": "x"}') -> dict[str, Any]:
    key = f"datasets/{name}/{version}/manifest.json"
    put = s3.put_object(Bucket=support.DATA_BUCKET, Key=key, Body=content)
    event = support.load_event("start_pipeline", "manifest_uploaded")
    event["detail"]["bucket"]["name"] = support.DATA_BUCKET
    event["detail"]["object"].update({"key": key, "version-id": put["VersionId"], "etag": put["ETag"].strip('"')})
    return event


def test_post_runs_starts_the_same_run_as_the_trigger(aws: dict[str, Any]) -> None:
    event = upload_manifest(aws["s3"], "shapes", "v1")
    triggered = start_handler.handler(event, support.FakeLambdaContext())
    status, body = call("POST", "/runs", body={"dataset_uri": f"s3://{support.DATA_BUCKET}/datasets/shapes/v1/"})
    assert status == 200 and body["already_started"] is True
    assert body["run_id"] == triggered["run_id"]
    executions = aws["sfn"].list_executions(stateMachineArn=os.environ["STATE_MACHINE_ARN"])["executions"]
    assert len(executions) == 1


def test_post_runs_is_idempotent_and_a_new_upload_is_a_new_run(aws: dict[str, Any]) -> None:
    upload_manifest(aws["s3"], "shapes", "v2")
    uri = f"s3://{support.DATA_BUCKET}/datasets/shapes/v2/manifest.json"
    answers = [call("POST", "/runs", body={"dataset_uri": uri}) for _ in range(4)]
    assert answers[0][0] == 202
    assert len({b["run_id"] for _, b in answers}) == 1
    upload_manifest(aws["s3"], "shapes", "v2", b'{"changed": true}')
    status, again = call("POST", "/runs", body={"dataset_uri": uri})
    assert status == 202 and again["run_id"] != answers[0][1]["run_id"]
    assert len(aws["sfn"].list_executions(stateMachineArn=os.environ["STATE_MACHINE_ARN"])["executions"]) == 2


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"dataset_uri": "s3://another-bucket/datasets/shapes/v1/"}, 400, "datasets live in"),
    ({"dataset_uri": f"s3://{support.DATA_BUCKET}/datasets/missing/v9/"}, 404, "does not exist"),
    ({"dataset_uri": f"s3://{support.DATA_BUCKET}/datasets/../v1/"}, 400, "relative path"),
    ({"dataset_uri": "https://example.com/x"}, 422, "dataset_uri"),
    ({"uri": "s3://x/datasets/a/b/"}, 422, "dataset_uri"),
    ("{not json", 422, ""),
])
def test_post_runs_rejects_bad_requests(aws: dict[str, Any], body: Any, status: int, message: str) -> None:
    got, answer = call("POST", "/runs", body=body)
    assert got == status, answer
    assert message in json.dumps(answer)


def test_post_runs_lists_the_manifest_before_reading_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing manifest is a 404 found by listing; a refused HEAD of a listed one is not a 404."""
    from botocore.exceptions import ClientError
    from botocore.stub import Stubber

    support.aws_env(monkeypatch)
    s3, no_sfn = boto3.client("s3"), object()  # neither answer may reach Step Functions
    uri = f"s3://{support.DATA_BUCKET}/datasets/shapes/v1/"
    listing = {"Bucket": support.DATA_BUCKET, "Prefix": "datasets/shapes/v1/manifest.json", "MaxKeys": 1}
    with Stubber(s3) as stub:
        stub.add_response("list_objects_v2", {"KeyCount": 0}, listing)
        with pytest.raises(service.DatasetNotFound, match="does not exist"):
            service.start_run_for_uri(s3, no_sfn, support.STATE_MACHINE_ARN, support.DATA_BUCKET, uri)
        stub.add_response("list_objects_v2", {"KeyCount": 1, "Contents": [{"Key": listing["Prefix"]}]}, listing)
        stub.add_client_error("head_object", service_error_code="403", http_status_code=403)
        with pytest.raises(ClientError, match="403"):
            service.start_run_for_uri(s3, no_sfn, support.STATE_MACHINE_ARN, support.DATA_BUCKET, uri)
        stub.assert_no_pending_responses()


def test_get_runs_filters_by_dataset_and_paginates(aws: dict[str, Any]) -> None:
    started = {}
    for name, version in [("shapes", "v1"), ("shapes", "v2"), ("street", "v1"), ("shapes-extra", "v1")]:
        result = start_handler.handler(upload_manifest(aws["s3"], name, version), support.FakeLambdaContext())
        started[(name, version)] = result["run_id"]
    status, body = call("GET", "/runs", {"dataset": "shapes"})
    assert status == 200
    assert {r["run_id"] for r in body["runs"]} == {started[("shapes", "v1")], started[("shapes", "v2")]}
    assert all(r["dataset_name"] == "shapes" and r["status"] == "RUNNING" for r in body["runs"])

    seen: list[str] = []
    query = {"limit": "1"}
    for _ in range(10):
        status, page = call("GET", "/runs", query)
        assert status == 200 and len(page["runs"]) <= 1
        seen += [r["run_id"] for r in page["runs"]]
        if not page["next_token"]:
            break
        query = {"limit": "1", "nextToken": page["next_token"]}
    assert sorted(seen) == sorted(started.values())
    status, none = call("GET", "/runs", {"status": "SUCCEEDED"})
    assert status == 200 and none["runs"] == []


@pytest.mark.parametrize(("query", "name"), [({"limit": "0"}, "limit"), ({"limit": "abc"}, "limit"),
                                             ({"status": "DONE"}, "status")])
def test_get_runs_validates_the_query(aws: dict[str, Any], query: dict[str, str], name: str) -> None:
    status, body = call("GET", "/runs", query)
    assert status == 422 and name in json.dumps(body)


@pytest.mark.parametrize("path", ["/runs", "/models"])
def test_a_foreign_page_token_is_a_400(aws: dict[str, Any], path: str) -> None:
    status, body = call("GET", path, {"nextToken": "not-a-token"})
    assert status == 400 and "nextToken is not a page token" in body["message"]


def test_get_run_answers_404_and_422(aws: dict[str, Any]) -> None:
    status, body = call("GET", "/runs/shapes_v1_0000000000000000")
    assert status == 404 and "no run" in body["message"]
    status, _ = call("GET", "/runs/bad%20id")
    assert status == 422


def test_get_run_reads_a_started_run_from_moto(aws: dict[str, Any]) -> None:
    started = start_handler.handler(upload_manifest(aws["s3"], "shapes", "v1"), support.FakeLambdaContext())
    status, body = call("GET", f"/runs/{started['run_id']}")
    assert status == 200 and body["run_id"] == started["run_id"]
    assert body["dataset"]["name"] == "shapes" and body["status"] == "RUNNING"


class InterpreterStepFunctions:
    """DescribeExecution and GetExecutionHistory answered from an interpreter execution (moto cannot
    run this definition: it fails SageMaker .sync tasks)."""

    exceptions = boto3.client("stepfunctions", region_name=support.REGION).exceptions

    def __init__(self, execution: Execution, page_size: int = 25) -> None:
        self.execution, self.page_size = execution, page_size

    def describe_execution(self, executionArn: str) -> dict[str, Any]:
        if executionArn != self.execution.arn:
            raise self.exceptions.ExecutionDoesNotExist({"Error": {"Code": "ExecutionDoesNotExist"}}, "Describe")
        return self.execution.describe()

    def get_execution_history(self, executionArn: str, maxResults: int, includeExecutionData: bool,
                              nextToken: str | None = None) -> dict[str, Any]:
        start = int(nextToken or 0)
        events = self.execution.history[start:start + self.page_size]
        more = start + self.page_size < len(self.execution.history)
        return {"events": events, **({"nextToken": str(start + self.page_size)} if more else {})}


def run_detail(case: str, sagemaker: Any) -> Any:
    execution = support.run_case(case)
    fake = InterpreterStepFunctions(execution)
    return service.get_run(fake, sagemaker, execution.state_machine.arn, support.RUN_ID)


def test_run_detail_of_a_successful_run(aws: dict[str, Any]) -> None:
    detail = run_detail("FirstDeployment", aws["sagemaker"])
    assert detail.status == "SUCCEEDED" and detail.current_state is None and detail.error is None
    names = [s.name for s in detail.timeline]
    assert names[0] == "Validate dataset" and names[-1] == "Run succeeded"
    assert names.count("Check endpoint status") == 3
    assert all(s.exited_at and s.duration_seconds is not None for s in detail.timeline[:-1])
    # The only failed step is the expected, caught "no endpoint yet" answer of the lookup.
    assert [(s.name, s.error) for s in detail.timeline if s.status != "succeeded"] == [
        ("Find current endpoint", "SageMaker.SageMakerException")]
    assert detail.validation["valid"] is True and detail.validation["counts"]["val_images"] == 12
    assert detail.evaluation["challenger_value"] == 0.71 and detail.gate["decision"] == "approved"
    assert detail.model_package_arn.endswith("/2")
    assert detail.endpoint.name == support.ENDPOINT_NAME and detail.endpoint.mode == "create"
    assert detail.endpoint.status == "InService"
    assert detail.training.job_name == support.RUN_ID.replace("_", "-") + "-train"
    assert detail.training.model_data.endswith("/output/model.tar.gz")
    assert detail.dataset == support.DATASET


def test_run_detail_of_a_failed_run_shows_where_and_why(aws: dict[str, Any]) -> None:
    detail = run_detail("TrainingFailed", aws["sagemaker"])
    assert detail.status == "FAILED" and detail.error == "TrainingFailed"
    assert "CUDA out of memory" in detail.cause and detail.failure["error"] == "TrainingFailed"
    train = next(s for s in detail.timeline if s.name == "Train model")
    assert train.status == "failed" and train.error == "States.TaskFailed"
    assert detail.timeline[-1].name == "Training failed"
    assert detail.gate is None and detail.endpoint is None


def test_run_detail_reports_training_metrics_from_sagemaker(aws: dict[str, Any]) -> None:
    execution = support.run_case("TrainingFailed")
    request = json.loads(json.dumps(support.state_output(execution, "Prepare training job")["plan"]["training_job"]))
    aws["sagemaker"].create_training_job(**request)
    detail = service.get_run(InterpreterStepFunctions(execution), aws["sagemaker"], execution.state_machine.arn,
                             support.RUN_ID)
    assert detail.training.job_name == request["TrainingJobName"]
    # moto finishes every job at once with one final metric, train:progress = 100.
    assert (detail.training.status, detail.training.secondary_status) == ("Completed", "Completed")
    assert detail.training.metrics == {"train:progress": 100.0}


def test_current_state_of_a_running_run() -> None:
    events = [e for e in support.run_case("FirstDeployment").history if e["type"] != "ExecutionSucceeded"]
    cut = next(i for i, e in enumerate(events) if e["type"] == "TaskStateEntered"
               and e["stateEnteredEventDetails"]["name"] == "Train model")
    steps, current = service.timeline(events[:cut + 2], "RUNNING")
    assert current == "Train model" and steps[-1].status == "running"


def test_get_models_lists_registry_versions_and_the_champion(aws: dict[str, Any]) -> None:
    sm = aws["sagemaker"]
    sm.create_model_package_group(ModelPackageGroupName="d2ops-models")
    for approval in ("Rejected", "Approved"):
        sm.create_model_package(ModelPackageGroupName="d2ops-models", ModelApprovalStatus=approval,
                                ModelPackageDescription=f"shapes v1: {approval}",
                                InferenceSpecification={"Containers": [{"Image": "123456789012.dkr.ecr.us-east-1."
                                                                                 "amazonaws.com/serving:1"}],
                                                        "SupportedContentTypes": ["image/jpeg"],
                                                        "SupportedResponseMIMETypes": ["application/json"]})
    status, body = call("GET", "/models")
    assert status == 200 and body["champion"] is None
    assert sorted(v["approval_status"] for v in body["versions"]) == ["Approved", "Rejected"]
    promote = support.state_output(support.run_case("FirstDeployment"), "Record champion")["champion"]
    aws["s3"].put_object(Bucket=support.ARTIFACTS_BUCKET, Key=CHAMPION_KEY, Body=json.dumps(promote))
    status, body = call("GET", "/models")
    assert body["champion"]["run_id"] == support.RUN_ID and body["champion"]["primary_value"] == 0.71


def test_run_ids_split_back_into_dataset_and_version() -> None:
    run_id = runs.run_id_for("street_scenes", "2026.11", "abc")
    assert runs.split_run_id(run_id)[:2] == ("street-scenes", "2026-11")
    assert runs.dataset_slug("street_scenes") == "street-scenes"


def test_the_committed_openapi_document_is_current() -> None:
    generated = json.loads(api.openapi_document())
    assert set(generated["paths"]) == {"/runs", "/runs/{runId}", "/models"}
    assert set(generated["paths"]["/runs"]) == {"get", "post"}
    committed = json.loads(OPENAPI_DOC.read_text()) if OPENAPI_DOC.exists() else None
    assert committed == generated, ("docs/status-api.openapi.json is stale: regenerate it with "
                                    "`PYTHONPATH=functions/status_api .venv/bin/python -m status_api.handler "
                                    "> docs/status-api.openapi.json`")
