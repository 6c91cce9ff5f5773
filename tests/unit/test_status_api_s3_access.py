"""The status API's S3 access: every read it makes is granted, and a missing or refused report is a 404.

S3 answers a GET of a missing key with 403 AccessDenied (not 404 NoSuchKey) to a role that may not
list the bucket. The API lists the exact key first, so its role must be able to list every key it
reads (an ``s3:prefix`` condition scoped to those keys), and a report S3 refuses is a clear 404,
never a 500. The reads are recorded from the real handler's S3 calls against moto, not listed by hand.
AccessDenied comes from moto itself: its IAM authorisation (``set_initial_no_auth_action_count``)
enforcing a user's identity policy (moto evaluates actions and resources, not conditions).
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import set_initial_no_auth_action_count

from d2ops.asl.interpreter import Execution
from d2ops.template import load_template, resolve
from d2ops_core.champion import CHAMPION_KEY, history_prefix
from d2ops_core.s3_layout import monitoring_window_key, review_decision_key, review_request_key
from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import handler as api  # noqa: E402

ARTIFACTS, DATA = support.ARTIFACTS_BUCKET, support.DATA_BUCKET
REPORT_STATEMENT = "ReadRunReportsAndEndpointHistory"
REVIEW_STATEMENTS = ("ReadReviews", "RecordDecisions")
REVIEWER = "arn:aws:iam::123456789012:role/d2ops-ReviewerRole"
REVIEWER_SESSION = "arn:aws:sts::123456789012:assumed-role/d2ops-ReviewerRole/alice"
LIST_STATEMENTS = ("MissingReportsAreNoSuchKey", "MissingManifestsAreNoSuchKey")


def s3_statements() -> list[dict[str, Any]]:
    """The status API role's S3 statements, with ARNs resolved for this test's buckets."""
    policies = load_template().function("StatusApiFunction").properties["Policies"]
    statements = [st for policy in policies if isinstance(policy, dict) for st in policy.get("Statement", [])]

    def getatt(logical_id: str, attribute: str) -> str:
        return "arn:aws:s3:::" + {"DataBucket": DATA, "ArtifactsBucket": ARTIFACTS}.get(logical_id, logical_id)

    refs = {"DataBucket": DATA, "ArtifactsBucket": ARTIFACTS, "PipelineStateMachine": "sm"}
    resolved = resolve(statements, refs, getatt)
    return [st for st in resolved if any(str(a).startswith("s3:") for a in _list(st["Action"]))]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def allowed(statements: list[dict[str, Any]], action: str, arn: str, prefix: str | None = None) -> bool:
    """IAM's answer for one request: an Allow whose action and resource match and whose s3:prefix
    condition (StringLike, or StringEquals) matches the listing's prefix."""
    for st in statements:
        if st["Effect"] != "Allow" or action not in _list(st["Action"]):
            continue
        if not any(fnmatch.fnmatchcase(arn, pattern) for pattern in _list(st["Resource"])):
            continue
        condition = st.get("Condition") or {}
        assert set(condition) <= {"StringLike", "StringEquals"}, f"{st.get('Sid')}: unexpected {condition}"
        like, equals = condition.get("StringLike", {}), condition.get("StringEquals", {})
        assert set(like) | set(equals) <= {"s3:prefix"}, f"{st.get('Sid')}: unexpected condition keys"
        if not condition:
            return True
        if prefix is not None and (any(fnmatch.fnmatchcase(prefix, p) for p in _list(like.get("s3:prefix", [])))
                                   or prefix in _list(equals.get("s3:prefix", []))):
            return True
    return False


def problems(statements: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    found = []
    for operation, params in calls:
        bucket = f"arn:aws:s3:::{params['Bucket']}"
        if operation in ("GetObject", "HeadObject"):
            key = params["Key"]
            if not allowed(statements, "s3:GetObject", f"{bucket}/{key}"):
                found.append(f"{operation} s3://{params['Bucket']}/{key}: no s3:GetObject")
            if not allowed(statements, "s3:ListBucket", bucket, prefix=key):
                found.append(f"{operation} s3://{params['Bucket']}/{key}: no s3:ListBucket for the prefix {key!r} "
                             "(S3 would answer 403 for it missing)")
        elif operation == "PutObject":
            if not allowed(statements, "s3:PutObject", f"{bucket}/{params['Key']}"):
                found.append(f"PutObject s3://{params['Bucket']}/{params['Key']}: no s3:PutObject")
        elif operation == "ListObjectsV2":
            if not allowed(statements, "s3:ListBucket", bucket, prefix=params.get("Prefix", "")):
                found.append(f"ListObjectsV2 s3://{params['Bucket']} prefix {params.get('Prefix')!r}: not granted")
        else:
            found.append(f"{operation}: an S3 call this test does not know how to check")
    return found


@cache
def finished_run() -> Execution:
    """A run of the real definition that validated, evaluated and deployed (its reports' URIs recorded)."""
    return support.run_case("FirstDeployment")


InterpreterStepFunctions = support.InterpreterStepFunctions  # S3, the service under test here, is moto's


def report_uris(execution: Execution) -> dict[str, str]:
    from d2ops_core.documents.run_state import RunState

    doc = RunState.read(json.loads(execution.describe()["output"]))
    assert doc.validation and doc.validation.summary and doc.evaluation
    return {"validation": str(doc.validation.summary.report_uri), "evaluation": str(doc.evaluation.report_uri)}


def key_of(uri: str) -> str:
    return uri.removeprefix(f"s3://{ARTIFACTS}/")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    execution = finished_run()  # before moto starts: the run's own Lambdas start and stop moto
    support.aws_env(monkeypatch)
    monkeypatch.setenv("ARTIFACTS_BUCKET", ARTIFACTS)
    monkeypatch.setenv("DATA_BUCKET", DATA)
    monkeypatch.setenv("STATE_MACHINE_ARN", execution.state_machine.arn)
    monkeypatch.setenv("MODEL_PACKAGE_GROUP_NAME", "d2ops-models")
    with mock_aws():
        s3 = boto3.client("s3")
        for bucket in (ARTIFACTS, DATA):
            s3.create_bucket(Bucket=bucket)
        yield {"s3": s3, "execution": execution, "sfn": InterpreterStepFunctions(execution)}


def use_clients(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any], s3: Any) -> list[tuple[str, dict[str, Any]]]:
    """Route the handler's S3 calls to ``s3`` (recording each) and its Step Functions calls to the run."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        calls.append((model.name, dict(params)))

    s3.meta.events.register("provide-client-params.s3.*", record)
    clients: dict[str, Any] = {"s3": s3, "stepfunctions": aws["sfn"], "sagemaker": boto3.client("sagemaker")}
    monkeypatch.setattr(api.clients, "client", lambda service: clients[service])
    return calls


def get(path: str) -> tuple[int, dict[str, Any]]:
    event = copy.deepcopy(support.load_event("status_api", "list_runs"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    response = api.handler(event, support.FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"])


ROUTES = [f"/runs/{support.RUN_ID}/validation", f"/runs/{support.RUN_ID}/evaluation",
          f"/endpoints/{support.ENDPOINT_NAME}/history", f"/endpoints/{support.ENDPOINT_NAME}/monitoring", "/models"]
WINDOW_KEY = monitoring_window_key(support.ENDPOINT_NAME, "2026-11-22T07:00Z")


def put_everything(s3: Any, execution: Execution) -> None:
    """Every object the API reads, present (contents need not parse: the reads are what is checked)."""
    for uri in report_uris(execution).values():
        s3.put_object(Bucket=ARTIFACTS, Key=key_of(uri), Body=b"{}")
    report_dir = key_of(report_uris(execution)["evaluation"]).rsplit("/", 1)[0] + "/report/"
    for name in ("pr_curves.json", "errors.json"):
        s3.put_object(Bucket=ARTIFACTS, Key=report_dir + name, Body=b"{}")
    s3.put_object(Bucket=ARTIFACTS, Key=f"{history_prefix(support.ENDPOINT_NAME)}promoted-{support.RUN_ID}.json",
                  Body=b"{}")
    s3.put_object(Bucket=ARTIFACTS, Key=CHAMPION_KEY, Body=b"{}")
    s3.put_object(Bucket=ARTIFACTS, Key=WINDOW_KEY, Body=b"{}")
    s3.put_object(Bucket=DATA, Key="datasets/shapes/v1/manifest.json", Body=b"{}")
    from tests.unit.test_status_api_decision import review_request

    s3.put_object(Bucket=ARTIFACTS, Key=review_request_key(support.RUN_ID),
                  Body=review_request(support.RUN_ID).model_dump_json().encode())


class AcceptingStepFunctions:
    """SendTaskSuccess accepting the token (Step Functions is not what this test checks)."""

    def send_task_success(self, **kwargs: Any) -> dict[str, Any]:
        return {}


def all_reads(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    put_everything(aws["s3"], aws["execution"])
    calls = use_clients(monkeypatch, aws, aws["s3"])
    for path in ROUTES:
        with contextlib.suppress(Exception):  # "{}" is no report: only which keys were read matters here
            get(path)
    # POST /runs reads the dataset version's manifest.json.
    from status_api import service
    with contextlib.suppress(Exception):  # the interpreter stand-in cannot start runs; the manifest was read
        service.start_run_for_uri(aws["s3"], aws["sfn"], aws["execution"].state_machine.arn, DATA,
                                  f"s3://{DATA}/datasets/shapes/v1/")
    # POST /runs/{runId}/decision reads the review request and any recorded decision, then records one;
    # GET /runs/{runId} of a run the gate sent to review reads both.
    from status_api import review
    from status_api.models import DecisionRequest

    review.decide(AcceptingStepFunctions(), aws["s3"], ARTIFACTS, REVIEWER, support.RUN_ID,
                  DecisionRequest(decision="approve"), REVIEWER_SESSION)
    review.review_view(aws["s3"], ARTIFACTS, support.RUN_ID, {"evaluation": {"decision": "review"}}, "RUNNING")
    return calls


def test_every_s3_read_of_the_status_api_is_granted_and_listable(monkeypatch: pytest.MonkeyPatch,
                                                                 aws: dict[str, Any]) -> None:
    calls = all_reads(monkeypatch, aws)
    read = {(op, p["Bucket"], str(p.get("Key", p.get("Prefix")))) for op, p in calls}
    uris = report_uris(aws["execution"])
    for key in (key_of(uris["validation"]), key_of(uris["evaluation"]), CHAMPION_KEY,
                f"{history_prefix(support.ENDPOINT_NAME)}promoted-{support.RUN_ID}.json", WINDOW_KEY):
        assert ("GetObject", ARTIFACTS, key) in read, f"the API never read {key}: {sorted(read)}"
    assert any(op == "GetObject" and k.endswith("/report/pr_curves.json") for op, _, k in read)
    assert any(op == "GetObject" and k.endswith("/report/errors.json") for op, _, k in read)
    assert ("HeadObject", DATA, "datasets/shapes/v1/manifest.json") in read
    for key in (review_request_key(support.RUN_ID), review_decision_key(support.RUN_ID)):
        assert ("GetObject", ARTIFACTS, key) in read, f"the API never read {key}"
    assert ("PutObject", ARTIFACTS, review_decision_key(support.RUN_ID)) in read
    statements = s3_statements()
    assert problems(statements, calls) == []
    # Mutation: without the listing grants, every read of a possibly missing key is a 403 in waiting.
    for sid in LIST_STATEMENTS:
        fewer = [st for st in statements if st.get("Sid") != sid]
        assert problems(fewer, calls), f"dropping {sid} went unnoticed"
    fewer = [st for st in statements if st.get("Sid") != REPORT_STATEMENT]
    assert any("no s3:GetObject" in p for p in problems(fewer, calls))
    for sid in REVIEW_STATEMENTS:
        fewer = [st for st in statements if st.get("Sid") != sid]
        assert any("/review/" in p for p in problems(fewer, calls)), f"dropping {sid} went unnoticed"
    fewer = [st for st in statements if st.get("Sid") != "ReadMonitoringWindows"]
    assert any("monitoring/" in p for p in problems(fewer, calls)), "dropping ReadMonitoringWindows went unnoticed"
    assert ("ListObjectsV2", ARTIFACTS, monitoring_window_key(support.ENDPOINT_NAME, "").removesuffix(".json")) in read


@pytest.mark.parametrize("route", ["validation", "evaluation"])
def test_a_missing_report_is_a_404(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any], route: str) -> None:
    use_clients(monkeypatch, aws, aws["s3"])
    status, body = get(f"/runs/{support.RUN_ID}/{route}")
    assert status == 404 and body["message"].endswith("is gone"), body
    assert f"{route} report s3://{ARTIFACTS}/runs/{support.RUN_ID}/" in body["message"]


def iam_s3_client(statements: list[dict[str, Any]]) -> Any:
    """An S3 client signed as an IAM user whose only policy is ``statements`` (made before auth is on)."""
    iam = boto3.client("iam")
    iam.create_user(UserName="status-api")
    iam.put_user_policy(UserName="status-api", PolicyName="s3",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}))
    key = iam.create_access_key(UserName="status-api")["AccessKey"]
    return boto3.client("s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])


def with_auth(call: Callable[[], Any]) -> Any:
    """``call`` with moto's IAM authorisation on (from its first request)."""
    return set_initial_no_auth_action_count(0)(call)()


def test_with_the_template_s_grants_a_missing_report_is_a_404_under_moto_s_iam(monkeypatch: pytest.MonkeyPatch,
                                                                              aws: dict[str, Any]) -> None:
    """Only the endpoint's history exists: the reports' listings are granted, so their absence is a 404."""
    s3 = aws["s3"]
    s3.put_object(Bucket=ARTIFACTS, Key=f"{history_prefix(support.ENDPOINT_NAME)}promoted-{support.RUN_ID}.json",
                  Body=b"{}")
    use_clients(monkeypatch, aws, iam_s3_client(s3_statements()))
    answers = with_auth(lambda: [get(f"/runs/{support.RUN_ID}/{route}") for route in ("validation", "evaluation")]
                        + [get(f"/endpoints/{support.ENDPOINT_NAME}/history")])
    assert [status for status, _ in answers] == [404, 404, 200], answers
    assert all(body["message"].endswith("is gone") for _, body in answers[:2])


@pytest.mark.parametrize("dropped", [REPORT_STATEMENT, "MissingReportsAreNoSuchKey"])
def test_a_report_s3_refuses_is_a_clear_404_never_a_500(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any],
                                                       dropped: str) -> None:
    """A role without the report grant (or without the listing grant) meets S3's AccessDenied: the API
    answers 404 naming the refusal, with no stack trace in the body."""
    put_everything(aws["s3"], aws["execution"])
    statements = [st for st in s3_statements() if st.get("Sid") != dropped]
    use_clients(monkeypatch, aws, iam_s3_client(statements))
    paths = [f"/runs/{support.RUN_ID}/validation", f"/runs/{support.RUN_ID}/evaluation",
             f"/endpoints/{support.ENDPOINT_NAME}/history"]
    answers = with_auth(lambda: [(path, *get(path)) for path in paths])
    assert len(answers) == 3
    for path, status, body in answers:
        assert status == 404, (path, status, body)
        assert "AccessDenied" in body["message"] and "Traceback" not in body["message"], body
        assert body["message"].count("\n") == 0


def test_the_evaluation_answer_carries_the_error_analysis(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any],
                                                         tmp_path: Any) -> None:
    """GET /runs/{id}/evaluation reads report/errors.json beside evaluation.json and answers it whole; an
    errors.json that is not the document (or none) is no error analysis, never a failed answer."""
    from d2ops_core.documents.error_analysis import ErrorAnalysis
    from tests.unit.test_error_analysis import sample_report

    analysis = ErrorAnalysis.model_validate_json((sample_report(tmp_path).parent / "errors.json").read_text())
    evaluation = key_of(report_uris(aws["execution"])["evaluation"])
    aws["s3"].put_object(Bucket=ARTIFACTS, Key=evaluation, Body=json.dumps(
        {"primary_metric": "bbox_AP", "val_images": 2, "challenger": {"metrics": {"bbox_AP": 0.5}}}).encode())
    errors_key = evaluation.rsplit("/", 1)[0] + "/report/errors.json"
    aws["s3"].put_object(Bucket=ARTIFACTS, Key=errors_key, Body=analysis.model_dump_json().encode())
    use_clients(monkeypatch, aws, aws["s3"])
    status, body = get(f"/runs/{support.RUN_ID}/evaluation")
    assert status == 200 and body["errors"] == analysis.model_dump(mode="json")
    assert body["errors"]["models"]["challenger"]["confusion"]["counts"] == [[1, 0, 1], [1, 1, 0], [1, 1, 0]]
    aws["s3"].put_object(Bucket=ARTIFACTS, Key=errors_key, Body=b'{"models": {}}')  # no challenger: not the document
    status, body = get(f"/runs/{support.RUN_ID}/evaluation")
    assert (status, body["errors"]) == (200, None)
