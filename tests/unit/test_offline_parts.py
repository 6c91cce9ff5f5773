"""Pure parts of the offline runtime: template names, event patterns, API Gateway events, graph, metrics."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from d2ops.offline import events
from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.pipeline import state_durations
from d2ops.offline.services.sagemaker_jobs import final_metrics
from d2ops.offline.stack import HttpRoute, LocalFunction, OfflineStack, StackError, load_stack
from d2ops.offline.status_api_server import _route_regex, http_event
from d2ops.offline.task_integrations import error_name, json_safe
from d2ops_core import metrics
from d2ops_core.pipeline_stages import all_states
from d2ops_core.state_graph import outcomes, render_svg

REPO = Path(__file__).resolve().parents[2]
DEFINITION = json.loads((REPO / "statemachine" / "training_pipeline.asl.json").read_text())


def test_stack_names_come_from_the_template() -> None:
    stack = load_stack()
    assert stack.endpoint_name == "d2ops-detector"
    assert stack.substitutions["ArtifactsBucketName"] == stack.artifacts_bucket
    assert stack.substitutions["ModelPackageGroupName"] == stack.model_package_group
    status = stack.functions["StatusApiFunction"]
    assert status.environment["STATE_MACHINE_ARN"] == stack.state_machine_arn
    assert status.environment["DATA_BUCKET"] == stack.data_bucket
    assert {(r.method, r.path) for r in stack.routes} >= {("GET", "/runs"), ("GET", "/runs/{runId}")}
    assert stack.trigger_pattern["detail"]["bucket"]["name"] == [stack.data_bucket]
    assert stack.functions["PrepareTrainingFunction"].environment["FRAMEWORK"] == "torchvision"


def test_stack_parameters_are_checked() -> None:
    assert load_stack(parameters={"MinMap": "0.9"}).functions["PrepareTrainingFunction"].environment["MIN_MAP"] == "0.9"
    with pytest.raises(StackError, match="unknown stack parameter"):
        load_stack(parameters={"MinMapp": "0.9"})
    with pytest.raises(StackError, match="not one of"):
        load_stack(parameters={"Stage": "qa"})


def test_functions_sharing_a_process_must_agree_on_their_environment() -> None:
    stack = load_stack()

    def fn(logical_id: str, env: dict[str, str]) -> LocalFunction:
        return LocalFunction(logical_id, logical_id, f"arn:{logical_id}", REPO, "m", "h", 3, 128, env)

    clash = OfflineStack(**{**stack.__dict__, "functions": {"A": fn("A", {"X": "1"}), "B": fn("B", {"X": "2"})}})
    with pytest.raises(StackError, match="A and B set X"):
        clash.lambda_environment()


def test_the_trigger_pattern_matches_manifest_uploads_only() -> None:
    stack = load_stack()
    head = {"ContentLength": 10, "ETag": '"abc"', "VersionId": "v1"}
    upload = events.object_created_event(stack.data_bucket, "datasets/s/v1/manifest.json", head, "us-east-1",
                                         "123456789012", 1)
    assert upload["detail"]["object"]["version-id"] == "v1" and upload["detail"]["object"]["etag"] == "abc"
    assert events.matches(stack.trigger_pattern, upload)
    image = json.loads(json.dumps(upload))
    image["detail"]["object"]["key"] = "datasets/s/v1/images/a.png"
    other_bucket = json.loads(json.dumps(upload))
    other_bucket["detail"]["bucket"]["name"] = "elsewhere"
    deleted = {**upload, "detail-type": "Object Deleted"}
    assert not any(events.matches(stack.trigger_pattern, e) for e in (image, other_bucket, deleted))
    with pytest.raises(ValueError, match="not supported"):
        events.matches({"detail": {"size": [{"numeric": [">", 1]}]}}, upload)


def test_http_requests_become_payload_2_events() -> None:
    route = HttpRoute("GET", "/runs/{runId}", "StatusApiFunction")
    found = _route_regex(route.path).match("/runs/abc_v1_0")
    assert found is not None and found.groupdict() == {"runId": "abc_v1_0"}
    assert _route_regex(route.path).match("/runs/a/b") is None
    event = http_event("GET", "/runs/abc", "status=FAILED&x=1&x=2", {"Host": "127.0.0.1:9", "User-Agent": "t"},
                       b"", route, {"runId": "abc"}, "123456789012")
    assert event["routeKey"] == "GET /runs/{runId}" and event["rawQueryString"] == "status=FAILED&x=1&x=2"
    assert event["queryStringParameters"] == {"status": "FAILED", "x": "1,2"}
    assert event["pathParameters"] == {"runId": "abc"} and event["headers"]["host"] == "127.0.0.1:9"
    assert event["requestContext"]["http"]["method"] == "GET" and "body" not in event
    binary = http_event("POST", "/runs", "", {"Content-Type": "image/png"}, b"\x89PNG", route, {}, "1")
    assert binary["isBase64Encoded"] is True and binary["body"] == "iVBORw=="


def test_sdk_error_names_follow_step_functions_conventions() -> None:
    sagemaker = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    assert error_name(sagemaker, "sagemaker", "ValidationException", sdk=True) == "SageMaker.SageMakerException"
    assert error_name(sagemaker, "sagemaker", "ResourceNotFound", sdk=True) == "SageMaker.ResourceNotFoundException"
    assert error_name(sagemaker, "sagemaker", "ValidationException", sdk=False) == "SageMaker.AmazonSageMakerException"
    moment = datetime(2024, 1, 1, tzinfo=UTC)
    assert json_safe({"A": moment, "ResponseMetadata": {}, "B": [b"x"]}) == {"A": moment.isoformat(), "B": ["x"]}


def test_final_metrics_use_the_jobs_own_regexes() -> None:
    lines = ["[algo-1] " + metrics.format_metric_line("train:loss", 2.0, 1), "noise",
             "[algo-1] " + metrics.format_metric_line("train:loss", 0.5, 2),
             "[algo-1] " + metrics.format_metric_line("val:bbox_AP", 0.25)]
    found = {m["MetricName"]: m["Value"] for m in final_metrics(lines, list(metrics.METRIC_DEFINITIONS))}
    # train:iteration: the progress definition reads the iteration of the train:loss lines (no total here)
    assert found == {"train:loss": 0.5, "val:bbox_AP": 0.25, "train:iteration": 2.0}
    assert final_metrics(lines, [{"Name": "bad", "Regex": "("}]) == []


def _event(kind: str, name: str | None, at: int, **details: object) -> dict[str, object]:
    event: dict[str, object] = {"type": kind, "timestamp": datetime(2024, 1, 1, tzinfo=UTC) + timedelta(seconds=at)}
    if kind.endswith("StateEntered"):
        event["stateEnteredEventDetails"] = {"name": name}
    elif kind.endswith("StateExited"):
        event["stateExitedEventDetails"] = {"name": name}
    elif details:
        event["taskFailedEventDetails"] = details
    return event


REJECTED_HISTORY = [
    _event("TaskStateEntered", "Validate dataset", 0), _event("TaskStateExited", "Validate dataset", 3),
    _event("ChoiceStateEntered", "Dataset valid?", 3), _event("ChoiceStateExited", "Dataset valid?", 3),
    _event("PassStateEntered", "Record dataset rejection", 3), _event("PassStateExited", "Record dataset rejection", 3),
    _event("TaskStateEntered", "Notify failure", 3), _event("TaskFailed", None, 4, error="SNS.Boom"),
    _event("TaskStateExited", "Notify failure", 5),
    _event("ChoiceStateEntered", "Route failure", 5), _event("ChoiceStateExited", "Route failure", 5),
    _event("FailStateEntered", "Dataset rejected", 5), _event("ExecutionFailed", None, 5),
]


def test_state_durations_and_outcomes_from_a_history() -> None:
    durations, order = state_durations(REJECTED_HISTORY)
    assert order[:2] == ["Validate dataset", "Dataset valid?"] and durations["Validate dataset"] == 3.0
    assert durations["Notify failure"] == 2.0 and durations["Dataset rejected"] == 0.0
    status, taken = outcomes(DEFINITION, REJECTED_HISTORY, "FAILED")
    assert status["Validate dataset"] == "succeeded" and status["Notify failure"] == "caught"
    assert status["Dataset rejected"] == "failed" and "Train model" not in status
    assert ("Validate dataset", "Dataset valid?") in taken and ("Dataset valid?", "Prepare training job") not in taken
    svg = render_svg(DEFINITION, REJECTED_HISTORY, "FAILED", "run <x> & y")
    assert svg.startswith("<svg") and "run &lt;x&gt; &amp; y" in svg
    assert svg.count("<g><title>") == len(all_states(DEFINITION))
    assert "<title>Dataset rejected (Fail): failed</title>" in svg


@pytest.mark.timeout(20)
def test_a_gateway_that_never_started_stops_at_once() -> None:
    # A runtime whose start-up failed before the gateway served must still shut down (it used to hang).
    gateway = AwsEndpoint("http://127.0.0.1:1")
    gateway.stop()
    started = AwsEndpoint("http://127.0.0.1:1")
    started.start()
    started.stop()
