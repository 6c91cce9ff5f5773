"""The status API: routes through the real Powertools resolver against moto (S3, Step Functions,
SageMaker); run details from executions of the real definition in the ASL interpreter."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from pydantic import BaseModel

from d2ops_core import run_ids
from d2ops_core.champion import CHAMPION_KEY
from tests.fixtures.pipeline import support

support.function_path("status_api")
support.function_path("start_pipeline")
from start_pipeline import handler as start_handler  # noqa: E402
from status_api import handler as api  # noqa: E402
from status_api import service  # noqa: E402
from status_api.models import ModelsResponse, RunDetail, RunList, StartRunResponse  # noqa: E402

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
    ({"dataset_uri": "https://example.com/x"}, 400, "dataset_uri"),  # 400 as documented, never 422
    ({"uri": "s3://x/datasets/a/b/"}, 400, "dataset_uri"),
    ("{not json", 400, "request body"),
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
    assert status == 400 and name in body["message"] and set(body) == {"statusCode", "message"}


@pytest.mark.parametrize("path", ["/runs", "/models"])
def test_a_foreign_page_token_is_a_400(aws: dict[str, Any], path: str) -> None:
    status, body = call("GET", path, {"nextToken": "not-a-token"})
    assert status == 400 and "nextToken is not a page token" in body["message"]


def test_an_unknown_or_impossible_run_id_is_a_404(aws: dict[str, Any]) -> None:
    status, body = call("GET", "/runs/shapes_v1_0000000000000000")
    assert status == 404 and "no run" in body["message"]
    status, body = call("GET", "/runs/bad%20id")  # cannot be a run id: no such run either
    assert status == 404 and "no run" in body["message"]


@pytest.mark.parametrize("path", ["/runs", "/models"])
def test_an_over_long_or_garbage_page_token_is_a_400(aws: dict[str, Any], path: str) -> None:
    for token in ["x" * 1025, "x" * 100_000, "%00", "eyJub3QiOiAiYSB0b2tlbiJ9"]:
        status, body = call("GET", path, {"nextToken": token})
        assert status == 400 and "nextToken" in body["message"], (token[:20], body)
        assert len(body["message"]) <= 500


class Throttled:
    """A boto3 client whose every call is throttled, as S3 (SlowDown, 503) or an API (400 ThrottlingException)."""

    exceptions = boto3.client("stepfunctions", region_name=support.REGION).exceptions  # the modelled classes

    def __init__(self, code: str, http_status: int) -> None:
        from botocore.exceptions import ClientError

        self.error = ClientError({"Error": {"Code": code, "Message": "Rate exceeded"},
                                  "ResponseMetadata": {"HTTPStatusCode": http_status}}, "Call")

    def __getattr__(self, name: str) -> Any:
        def call(**kwargs: Any) -> Any:
            raise self.error
        return call


@pytest.mark.parametrize(("code", "http_status"), [("SlowDown", 503), ("ThrottlingException", 400),
                                                   ("TooManyRequestsException", 429)])
def test_a_throttled_aws_service_is_a_503_with_retry_after(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                           code: str, http_status: int) -> None:
    monkeypatch.setattr(api.clients, "client", lambda service: Throttled(code, http_status))
    for path in ["/runs", "/runs/shapes_v1_0000000000000000", "/models"]:
        event = copy.deepcopy(support.load_event("status_api", "list_runs"))
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
        response = api.handler(event, support.FakeLambdaContext())
        assert response["statusCode"] == 503, (path, response)
        assert int(response["headers"]["Retry-After"]) > 0
        assert json.loads(response["body"])["statusCode"] == 503


def test_other_aws_errors_stay_server_errors(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.clients, "client", lambda service: Throttled("AccessDeniedException", 400))
    with pytest.raises(Exception, match="AccessDenied"):  # Lambda reports it; API Gateway answers 500
        call("GET", "/runs")


def test_a_throttled_job_describe_is_not_a_missing_job() -> None:
    """GET /runs/{id} used to show a throttled DescribeTrainingJob as "no job yet" (and price the run without
    it); it now propagates, so the handler answers 503 with Retry-After (test above)."""
    from botocore.exceptions import ClientError

    doc = {"plan": support.plan_document({"training_job": "r-train", "evaluation_job": "r-eval"})}
    for kind in ("training", "processing"):
        with pytest.raises(ClientError) as raised:
            service._describe_job(Throttled("ThrottlingException", 400), doc, kind)
        assert service.is_throttling(raised.value)
    # No plan (the run failed before preparing), or one that does not read: no job to describe.
    assert service._describe_job(Throttled("ThrottlingException", 400), {"plan": {"names": {}}}, "training") is None
    assert service._describe_job(Throttled("ThrottlingException", 400), {}, "processing") is None


def test_boto3_clients_are_made_once_per_environment_not_per_request(aws: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = api.clients.boto3.session.Session.client

    def counting(self: Any, service_name: str, *args: Any, **kwargs: Any) -> Any:
        made.append(service_name)
        return real(self, service_name, *args, **kwargs)

    api.clients.clear()
    monkeypatch.setattr(api.clients.boto3.session.Session, "client", counting)
    for _ in range(3):
        assert call("GET", "/runs")[0] == 200
        assert call("GET", "/runs/shapes_v1_0000000000000000")[0] == 404
    assert sorted(made) == ["sagemaker", "stepfunctions"]  # no CloudWatch client: no run here started training
    assert api.clients.Lazy("cloudwatch").meta.service_model.service_name == "cloudwatch"  # made when used
    assert sorted(made) == ["cloudwatch", "sagemaker", "stepfunctions"]
    # Another endpoint (the offline runtime's next moto server) gets its own client, never the old one.
    first = api.clients.client("s3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    moved = api.clients.client("s3")
    assert moved is not first and moved.meta.endpoint_url == "http://127.0.0.1:1"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert api.clients.client("s3") is first


def test_get_run_reads_a_started_run_from_moto(aws: dict[str, Any]) -> None:
    started = start_handler.handler(upload_manifest(aws["s3"], "shapes", "v1"), support.FakeLambdaContext())
    status, body = call("GET", f"/runs/{started['run_id']}")
    assert status == 200 and body["run_id"] == started["run_id"]
    assert body["dataset"]["name"] == "shapes" and body["status"] == "RUNNING"


InterpreterStepFunctions = support.InterpreterStepFunctions


def run_detail(case: str, sagemaker: Any) -> Any:
    execution = support.run_case(case)
    fake = InterpreterStepFunctions(execution)
    return service.get_run(fake, sagemaker, execution.state_machine.arn, support.RUN_ID)


def test_run_detail_of_a_successful_run(aws: dict[str, Any]) -> None:
    detail = run_detail("FirstDeployment", aws["sagemaker"])
    assert detail.status == "SUCCEEDED" and detail.current_state is None and detail.error is None
    names = [s.name for s in detail.timeline]
    # every state visit, the stages' frames too: the Validate stage is entered before its first state
    assert names[:2] == ["Validate", "Validate dataset"] and names[-1] == "Run succeeded"
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
    assert detail.failure["cause"] == detail.cause and "\n" not in detail.cause and "{" not in detail.cause
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


def test_run_detail_shows_the_training_jobs_progress_from_its_published_metrics(aws: dict[str, Any]) -> None:
    """Catches: get_run not passing its CloudWatch client on (no progress ever), progress read for another
    job than the run's (tests/unit/test_training_progress_series.py checks the reading itself)."""
    from d2ops_core import platform

    execution = support.run_case("TrainingFailed")
    request = json.loads(json.dumps(support.state_output(execution, "Prepare training job")["plan"]["training_job"]))
    aws["sagemaker"].create_training_job(**request)
    job = aws["sagemaker"].describe_training_job(TrainingJobName=request["TrainingJobName"])
    cloudwatch = boto3.client("cloudwatch")
    for name, value in (("train:iteration", 40.0), ("train:total_iterations", 250.0), ("train:loss", 0.8)):
        for job_name, shift in ((request["TrainingJobName"], 0.0), ("another-run-train", 5.0)):
            cloudwatch.put_metric_data(Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricData=[{
                "MetricName": name, "Value": value + shift, "Timestamp": job["TrainingStartTime"],
                "Dimensions": [{"Name": platform.TRAINING_METRICS_DIMENSION, "Value": job_name}]}])
    detail = service.get_run(InterpreterStepFunctions(execution), aws["sagemaker"], execution.state_machine.arn,
                             support.RUN_ID, cloudwatch=cloudwatch)
    progress = detail.training.progress
    assert progress is not None and (progress.iteration, progress.total_iterations) == (40, 250)
    assert [(p.iteration, p.loss) for p in progress.loss_series] == [(40, pytest.approx(0.8))]
    assert progress.seconds_left is None  # moto's job has completed
    without = service.get_run(InterpreterStepFunctions(execution), aws["sagemaker"], execution.state_machine.arn,
                              support.RUN_ID)
    assert without.training.progress is None


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
    run_id = run_ids.run_id_for("street_scenes", "2026.11", "abc")
    assert run_ids.split_run_id(run_id)[:2] == ("street-scenes", "2026-11")
    assert run_ids.dataset_slug("street_scenes") == "street-scenes"


def test_the_committed_openapi_document_is_current() -> None:
    generated = json.loads(api.openapi_document())
    assert set(generated["paths"]) == {"/runs", "/runs/{runId}", "/models", "/runs/{runId}/graph",
                                       "/runs/{runId}/validation", "/runs/{runId}/evaluation",
                                       "/endpoints/{endpointName}/history", "/endpoints/{endpointName}/monitoring",
                                       "/endpoint/monitoring",
                                       "/runs/{runId}/decision"}
    assert set(generated["paths"]["/runs"]) == {"get", "post"}
    committed = json.loads(OPENAPI_DOC.read_text()) if OPENAPI_DOC.exists() else None
    assert committed == generated, ("docs/status-api.openapi.json is stale: regenerate it with "
                                    "`PYTHONPATH=functions/status_api .venv/bin/python -m status_api.handler "
                                    "> docs/status-api.openapi.json`")


# ---------------------------------------------------------------- property-based: never a 5xx

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)
QUERY_VALUE = st.one_of(TEXT, st.integers(-10**6, 10**6).map(str), st.sampled_from(["", "0", "101", "RUNNING", "x"]),
                        st.text(max_size=3000))
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_documented(status: int, body: Any, ok_model: type[BaseModel]) -> None:
    assert status < 500, body
    if status == 200:
        ok_model.model_validate(body)
    else:
        assert status in (400, 404), body
        assert set(body) == {"statusCode", "message"} and body["statusCode"] == status, body
        assert "\n" not in body["message"] and len(body["message"]) <= 500


@PROPERTY
@given(query=st.dictionaries(st.sampled_from(["dataset", "status", "nextToken", "limit", "other"]), QUERY_VALUE,
                             max_size=4))
def test_get_runs_never_answers_a_5xx(aws: dict[str, Any], query: dict[str, str]) -> None:
    status, body = call("GET", "/runs", query)  # API Gateway hands the handler decoded values
    assert_documented(status, body, RunList)


@PROPERTY
@given(query=st.dictionaries(st.sampled_from(["nextToken", "limit"]), QUERY_VALUE, max_size=2))
def test_get_models_never_answers_a_5xx(aws: dict[str, Any], query: dict[str, str]) -> None:
    status, body = call("GET", "/models", query)
    assert_documented(status, body, ModelsResponse)


@PROPERTY
@given(run_id=st.one_of(TEXT.filter(lambda t: "/" not in t), st.from_regex(r"[A-Za-z0-9_-]{1,80}", fullmatch=True),
                        st.text(alphabet="ab_-", min_size=79, max_size=200)))
def test_get_run_never_answers_a_5xx(aws: dict[str, Any], run_id: str) -> None:
    status, body = call("GET", f"/runs/{quote(run_id, safe='')}")
    assert status in (404, 400) or status == 200, body  # nothing was started: unknown ids are 404s
    assert_documented(status, body, RunDetail)


@PROPERTY
@given(body=st.one_of(TEXT, st.dictionaries(st.sampled_from(["dataset_uri", "uri"]), TEXT, max_size=2),
                      st.builds(lambda rest: {"dataset_uri": f"s3://{support.DATA_BUCKET}/datasets/{rest}"}, TEXT)))
def test_post_runs_never_answers_a_5xx(aws: dict[str, Any], body: Any) -> None:
    status, answer = call("POST", "/runs", body=body)
    if status in (200, 202):
        StartRunResponse.model_validate(answer)
    else:
        assert_documented(status, answer, StartRunResponse)


def test_an_unreadable_price_table_leaves_the_cost_out_not_the_run(monkeypatch, tmp_path) -> None:
    bad = tmp_path / "prices.json"
    bad.write_text('{"prices": "not a table"')
    monkeypatch.setenv("D2OPS_PRICE_TABLE", str(bad))
    job = {"TrainingJobName": "j", "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
           "TrainingTimeInSeconds": 600, "BillableTimeInSeconds": 600}
    assert service.run_cost({}, job, None, None) is None


def test_a_malformed_section_of_the_run_state_is_left_out_and_the_run_still_answers(aws: dict[str, Any]) -> None:
    """GET /runs/{id} reads $ section by section (d2ops_core.documents.run_state.RunState.read)."""
    execution = support.run_case("FirstDeployment")
    output = json.loads(execution.describe()["output"])
    output.update(plan={"names": "not names"}, deployment={"mode": "create", "started_at": "yesterday"},
                  gate=["not", "a", "decision"])
    execution.output = output
    detail = service.get_run(InterpreterStepFunctions(execution), aws["sagemaker"], execution.state_machine.arn,
                             support.RUN_ID)
    assert detail.status == "SUCCEEDED" and detail.training is None and detail.gate is None
    assert detail.endpoint is not None and detail.endpoint.endpoint_config is None  # $.endpoint still read
    assert detail.endpoint.status == "InService" and detail.evaluation["challenger_value"] == 0.71
    assert detail.cost is None or detail.cost.endpoint is None  # no deployment time: no endpoint billed


def test_run_detail_carries_the_dataset_diff_against_the_champion(aws: dict[str, Any]) -> None:
    detail = run_detail("GateFailedRegression", aws["sagemaker"])
    diff = detail.dataset_diff
    assert diff is not None and diff.against == "shapes/v0" and diff.champion_run_id == "shapes_v0_0123456789abcdef"
    assert (diff.added, diff.removed, diff.annotations_changed, diff.classes_new) == (4, 2, 3, ["hexagon"])
    assert diff.uri == f"s3://{support.ARTIFACTS_BUCKET}/runs/{support.RUN_ID}/dataset-diff.json"
    assert run_detail("FirstDeployment", aws["sagemaker"]).dataset_diff is None  # no champion
