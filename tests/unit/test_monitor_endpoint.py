"""monitor_endpoint's handler against a moto server (real HTTP): one window of capture with real JPEGs and the
endpoint's JSON answers compared with the serving model's baseline; the window document, the metrics, ONE
message for a drifted window (a second invocation answers the same document and sends nothing), unreadable
records reported, a window without a baseline or with too few records not judged."""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from PIL import Image

from d2ops_core import s3_layout
from d2ops_core.champion import CHAMPION_KEY
from d2ops_core.documents.capture import CaptureData, CaptureRecord, EventMetadata, encode_payload
from d2ops_core.documents.detections import InvocationResponse
from d2ops_core.documents.monitoring import MonitoringWindow
from d2ops_core.monitoring_features import build_baseline, image_features
from tests.fixtures.moto_server import moto_server
from tests.fixtures.pipeline import support

support.function_path("monitor_endpoint")
from monitor_endpoint import handler as monitor_handler  # noqa: E402
from monitor_endpoint.models import MonitorEvent  # noqa: E402
from monitor_endpoint.service import NAMESPACE, SETTLE, Settings, WindowNotBegun, window_of  # noqa: E402
from monitor_endpoint.statistics import Thresholds  # noqa: E402

ENDPOINT = support.ENDPOINT_NAME
RUN = "shapes_v1_abc"
CLASSES = ("square", "circle")
# A day before the tests were written: the monitor refuses a window that has not begun by the real clock.
START = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def aws(server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    support.aws_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server)
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name=f"t-{uuid.uuid4().hex[:8]}")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    settings = {"ARTIFACTS_BUCKET": bucket, "ENDPOINT_NAME": ENDPOINT, "TOPIC_ARN": topic,
                "DRIFT_KS_THRESHOLD": "0.2", "DRIFT_PSI_THRESHOLD": "0.25", "MONITOR_MIN_RECORDS": "20"}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return {"s3": s3, "bucket": bucket, "sqs": sqs, "queue": queue, "cloudwatch": boto3.client("cloudwatch")}


def jpeg(grey: int, size: tuple[int, int] = (96, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (grey, grey, grey)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def answer(i: int) -> dict[str, Any]:
    detections = [{"box": [4, 4, 40, 30], "score": 0.6 + 0.03 * (i % 10), "class_id": 1, "class_name": "square"}]
    if i % 2:
        detections.append({"box": [50, 10, 90, 60], "score": 0.7 + 0.02 * (i % 7), "class_id": 2,
                           "class_name": "circle"})
    return {"detections": detections, "image": {"width": 96, "height": 64},
            "score_thresholds": {"source": "model", "by_class": {"square": 0.5, "circle": 0.5}}}


def put_baseline(aws: dict[str, Any]) -> None:
    """The model's val answers: mid-grey images, the same answers as the unshifted traffic."""
    thresholds = {"square": 0.5, "circle": 0.5}
    features = [image_features(96, 64, (100 + i % 40) / 255, InvocationResponse.model_validate(answer(i)).detections,
                               thresholds) for i in range(400)]
    document = build_baseline(features, run_id=RUN, class_names=CLASSES, score_thresholds=thresholds)
    aws["s3"].put_object(Bucket=aws["bucket"], Key=s3_layout.monitoring_baseline_key(RUN),
                         Body=document.model_dump_json())
    aws["s3"].put_object(Bucket=aws["bucket"], Key=CHAMPION_KEY, Body=json.dumps(champion_record()))


def champion_record() -> dict[str, Any]:
    """The champion (no endpoint history yet: the monitor falls back to it)."""
    return {"run_id": RUN, "endpoint_name": ENDPOINT, "dataset": support.DATASET.model_dump(mode="json"),
            "model_package_arn": "arn:mp",
            "model_name": "m", "model_data": "s3://b/model.tar.gz", "endpoint_config_name": "c",
            "primary_metric": "bbox_AP", "primary_value": 0.5, "evaluation_uri": "s3://b/e.json",
            "gate": {"decision": "approved", "approval_status": "Approved", "reason": "better"},
            "promoted_at": "2026-11-01T00:00:00Z"}


def put_capture(aws: dict[str, Any], count: int, grey: int, *, extra_lines: tuple[bytes, ...] = ()) -> None:
    lines = []
    for i in range(count):
        record = CaptureRecord(
            captureData=CaptureData(endpointInput=encode_payload(jpeg(grey + i % 40), "image/jpeg", "INPUT"),
                                    endpointOutput=encode_payload(json.dumps(answer(i)).encode(), "application/json",
                                                                  "OUTPUT")),
            eventMetadata=EventMetadata(eventId=f"e-{i}", inferenceTime=START + timedelta(seconds=30 * i)))
        lines.append(record.model_dump_json().encode())
    key = s3_layout.capture_hour_prefix(ENDPOINT, "AllTraffic", 2026, 11, 28, 9) + "part-0.jsonl"
    aws["s3"].put_object(Bucket=aws["bucket"], Key=key, Body=b"\n".join([*lines, *extra_lines]) + b"\n")


def invoke(window_start: datetime = START) -> dict[str, Any]:
    event = MonitorEvent(window_start=window_start).model_dump(mode="json")
    return monitor_handler.handler(event, support.FakeLambdaContext())


def messages(aws: dict[str, Any]) -> list[str]:
    got = aws["sqs"].receive_message(QueueUrl=aws["queue"], MaxNumberOfMessages=10, WaitTimeSeconds=0)
    return [m["Body"] for m in got.get("Messages", [])]


def test_a_darker_window_is_drifted_written_once_measured_and_announced_once(aws: dict[str, Any]) -> None:
    # Mutations caught: the window not written where the status API reads it; no Drifted metric; a second
    # invocation of the same window sending the message again; a truncated capture line stopping the read.
    put_baseline(aws)
    put_capture(aws, 60, grey=50, extra_lines=(b'{"captureData": {"endpointInput"',))
    result = invoke()
    assert result["verdict"] == "drifted" and "brightness" in result["drifted"] and result["notified"]
    key = s3_layout.monitoring_window_key(ENDPOINT, "2026-11-28T09:00Z")
    stored = aws["s3"].get_object(Bucket=aws["bucket"], Key=key)["Body"].read()
    window = MonitoringWindow.model_validate_json(stored)
    assert window.records == 60 and window.model_run_id == RUN and window.unreadable == 1
    assert "part-0.jsonl:61: not JSON" in window.problems[0]
    (body,) = messages(aws)
    assert "brightness: KS D" in body and key in body
    again = invoke()
    assert again["already_computed"] and not again["notified"] and again["verdict"] == "drifted"
    assert aws["s3"].get_object(Bucket=aws["bucket"], Key=key)["Body"].read() == stored
    assert messages(aws) == []
    got = aws["cloudwatch"].get_metric_statistics(
        Namespace=NAMESPACE, MetricName="Drifted", Dimensions=[{"Name": "Endpoint", "Value": ENDPOINT}],
        StartTime=datetime.now(UTC) - timedelta(hours=1), EndTime=datetime.now(UTC) + timedelta(minutes=5),
        Period=3600, Statistics=["Maximum"])
    assert [p["Maximum"] for p in got["Datapoints"]] == [1.0]
    listed = aws["cloudwatch"].list_metrics(Namespace=NAMESPACE)["Metrics"]
    assert {"brightness", "class_rate:square", "low_confidence_fraction"} <= {m["MetricName"] for m in listed}


def test_the_function_s_role_allows_every_call_the_monitor_makes(aws: dict[str, Any]) -> None:
    """Every AWS call of a drifted window and of its repeat, checked against MonitorEndpointFunction's policy in
    template.yaml. Mutation caught: a statement dropped or narrowed (the baseline's key, the history prefix,
    the namespace) while the code still needs it."""
    from tests.unit.test_template_hygiene import allows

    calls: list[tuple[str, str, dict[str, Any]]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append((model.service_model.service_name, model.name, dict(params)))

    session = boto3.DEFAULT_SESSION or boto3.setup_default_session() or boto3.DEFAULT_SESSION
    put_baseline(aws)
    put_capture(aws, 40, grey=50)
    session.events.register("provide-client-params", record)
    try:
        invoke()
        invoke()
    finally:
        session.events.unregister("provide-client-params", record)
    bucket = support.ARTIFACTS_BUCKET  # the bucket name the template's policy is resolved with
    asked = set()
    for service, operation, params in calls:
        if service == "s3" and operation == "ListObjectsV2":
            asked.add(("s3:ListBucket", f"arn:aws:s3:::{bucket}", params.get("Prefix")))
        elif service == "s3":
            asked.add((f"s3:{operation}", f"arn:aws:s3:::{bucket}/{params['Key']}", None))
        elif service == "cloudwatch":
            assert params["Namespace"] == "d2ops/Monitoring"
            asked.add(("cloudwatch:PutMetricData", "*", None))
        else:
            assert (service, operation) == ("sns", "Publish"), (service, operation, params)
            assert params["TopicArn"] == os.environ["TOPIC_ARN"]
            asked.add((f"{service}:{operation}", "ref-NotificationTopic", None))  # the policy's !Ref, resolved
    actions = {action for action, _, _ in asked}
    assert {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "cloudwatch:PutMetricData", "sns:Publish"} <= actions
    refused = [call for call in sorted(asked, key=str) if not allows("MonitorEndpointFunction", *call)]
    assert refused == []


def test_an_unshifted_window_is_ok_and_sends_nothing(aws: dict[str, Any]) -> None:
    # Mutation caught: the decoded image's brightness computed differently from the baseline's rule.
    put_baseline(aws)
    put_capture(aws, 60, grey=100)
    result = invoke()
    assert result["verdict"] == "ok" and result["drifted"] == [] and not result["notified"]
    assert messages(aws) == []


def test_no_baseline_and_too_few_records_are_verdicts_not_errors(aws: dict[str, Any]) -> None:
    # Mutation caught: a corrupt baseline failing every hour with a traceback instead of saying which object.
    put_capture(aws, 30, grey=50)
    assert invoke()["verdict"] == "no_baseline"  # nothing deployed yet: no champion, no history
    put_baseline(aws)
    assert invoke(START + timedelta(hours=1))["verdict"] == "too_few_records"  # an hour without traffic
    key = s3_layout.monitoring_baseline_key(RUN)
    aws["s3"].put_object(Bucket=aws["bucket"], Key=key, Body=b'{"run_id": "cut short')
    assert invoke(START - timedelta(hours=1))["verdict"] == "no_baseline"
    window = MonitoringWindow.model_validate_json(aws["s3"].get_object(
        Bucket=aws["bucket"], Key=s3_layout.monitoring_window_key(ENDPOINT, "2026-11-28T08:00Z"))["Body"].read())
    (problem,) = window.problems
    assert problem.startswith(f"s3://{aws['bucket']}/{key}: not a monitoring baseline (document: Invalid JSON")
    assert messages(aws) == []


def test_the_default_window_is_the_last_full_one_settled() -> None:
    settings = Settings(bucket="b", endpoint="e", topic_arn=None, thresholds=Thresholds())
    now = datetime(2026, 11, 28, 10, 20, tzinfo=UTC)
    assert window_of(MonitorEvent(), settings, now) == (START, START + timedelta(hours=1))
    early = datetime(2026, 11, 28, 10, 0, tzinfo=UTC) + SETTLE - timedelta(minutes=1)  # 09:xx capture not settled
    assert window_of(MonitorEvent(), settings, early)[0] == START - timedelta(hours=1)
    given = MonitorEvent(window_start=datetime(2026, 11, 1, 3, 0), window_minutes=15)
    assert window_of(given, settings, now) == (datetime(2026, 11, 1, 3, 0, tzinfo=UTC),
                                               datetime(2026, 11, 1, 3, 15, tzinfo=UTC))


def test_a_window_that_has_not_begun_is_refused_before_anything_is_written(aws: dict[str, Any]) -> None:
    # Mutation caught: a future window judged now, its too_few_records verdict written once and kept for good
    # when its traffic came; or a start near datetime.max overflowing into a traceback.
    settings = Settings(bucket="b", endpoint="e", topic_arn=None, thresholds=Thresholds())
    now = datetime(2026, 11, 29, 10, 20, tzinfo=UTC)
    for start in (now + timedelta(minutes=1), datetime(9999, 12, 31, 23, 59, tzinfo=UTC)):
        with pytest.raises(WindowNotBegun, match=r"^the window .* has not begun \(now 2026-11-29T10:20Z\)"):
            window_of(MonitorEvent(window_start=start), settings, now)
    assert window_of(MonitorEvent(window_start=now), settings, now)[0] == now  # begun: the caller's choice
    with pytest.raises(WindowNotBegun):
        invoke(datetime.now(UTC) + timedelta(days=1))
    listed = aws["s3"].list_objects_v2(Bucket=aws["bucket"], Prefix="monitoring/")
    assert listed.get("KeyCount", 0) == 0  # nothing written
