"""The offline endpoint's data capture (issue 32): real InvokeEndpoint calls on a real HTTP model server, capture
files written into S3 (moto) in SageMaker's layout and read back by d2ops_core.capture_files.

The fixture is test_offline_traffic_routing's (cheapest offline endpoint: in-process moto, a stub server
answering JSON); the pipeline's own data capture config (prepare_training) is what the endpoint configs carry.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.offline.services.base import WireRequest
from d2ops.offline.services.sagemaker import LocalSageMaker
from d2ops.offline.services.sagemaker_capture import CaptureSettings, capture_file_key, sampled
from d2ops.offline.services.sagemaker_runtime import INFERENCE_ID, SageMakerRuntime
from d2ops_core import s3_layout
from d2ops_core.capture_files import read_capture_window
from tests.fixtures.pipeline import support

BUCKET = "d2ops-offline-capture"
ENDPOINT = "capture-detector"
ROLE = "arn:aws:iam::123456789012:role/d2ops-EndpointRole"
IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # not UTF-8: stored base64
# SageMaker's documented file name under the hour folder: MM-SS-mmm-<uuid>.jsonl
FILE_NAME = re.compile(r"^\d{2}-\d{2}-\d{3}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.jsonl$")


def capture_config(percent: int, modes: tuple[str, ...] = ("Input", "Output")) -> dict[str, Any]:
    return {"EnableCapture": percent > 0, "InitialSamplingPercentage": percent,
            "DestinationS3Uri": s3_layout.capture_destination_uri(BUCKET),
            "CaptureOptions": [{"CaptureMode": m} for m in modes],
            "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]}}


class JsonServer:
    """A real model server whose /invocations answers JSON naming the request's size."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                body = json.dumps({"detections": [], "bytes": size}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Serving:
    def start(self, model_tar: Path, work_dir: Path, name: str, environment: Any = None) -> JsonServer:
        return JsonServer()


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalSageMaker, Any]]:
    support.aws_env(monkeypatch)
    with mock_aws():
        s3, registry = boto3.client("s3"), boto3.client("sagemaker")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="model/model.tar.gz", Body=b"model")
        registry.create_model(ModelName="m", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-serving:1",
            "ModelDataUrl": f"s3://{BUCKET}/model/model.tar.gz"})
        variant: Any = {"VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.m5.large",
                        "InitialInstanceCount": 1}
        for name, capture in (("all", capture_config(100)), ("off", capture_config(0)),
                              ("some", capture_config(37)), ("input-only", capture_config(100, ("Input",)))):
            config: Any = capture  # the API's TypedDict, as prepare_training's plan carries it
            registry.create_endpoint_config(EndpointConfigName=name, DataCaptureConfig=config,
                                            ProductionVariants=[variant])
        local = LocalSageMaker(tmp_path, s3, registry, jobs=None, serving=Serving(), region="us-east-1",
                               account_id="123456789012")
        try:
            yield local, s3
        finally:
            local.shutdown()


def serve(local: LocalSageMaker, config: str) -> None:
    local.endpoint_api.create_endpoint({"EndpointName": ENDPOINT, "EndpointConfigName": config})
    deadline = time.monotonic() + 30
    while local.endpoint_api.describe_endpoint({"EndpointName": ENDPOINT})["EndpointStatus"] != "InService":
        assert time.monotonic() < deadline, "endpoint never came up"
        time.sleep(0.02)


def invoke(local: LocalSageMaker, body: bytes = IMAGE, inference_id: str | None = None) -> bytes:
    """InvokeEndpoint as the wire brings it (SageMakerRuntime), headers and all."""
    headers = {"Content-Type": "image/png", "Accept": "application/json"}
    if inference_id:
        headers[INFERENCE_ID] = inference_id
    answer = SageMakerRuntime(local).handle(WireRequest(f"/endpoints/{ENDPOINT}/invocations", headers, body),
                                            upstream=None)  # InvokeEndpoint never forwards
    assert answer.status == 200, answer.body
    return answer.body


def capture_keys(s3: Any) -> list[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=s3_layout.capture_prefix(ENDPOINT)).get("Contents") or []
    return sorted(o["Key"] for o in listed)


def window(s3: Any, start: datetime) -> list[Any]:
    skipped: list[Any] = []
    records = list(read_capture_window(s3, BUCKET, ENDPOINT, start - timedelta(hours=1), start + timedelta(hours=1),
                                       skipped=skipped))
    assert skipped == []
    return records


def test_answered_requests_are_captured_in_sagemakers_layout_and_read_back_whole(
        offline: tuple[LocalSageMaker, Any]) -> None:
    """Mutations caught: another folder layout or file name (the monitor and SageMaker's tools would not find
    them), the image stored as text or cut, the JSON answer base64-encoded, the InferenceId dropped, records
    left in the buffer when the endpoint is deleted."""
    local, s3 = offline
    serve(local, "all")
    before = datetime.now(UTC)
    answers = [invoke(local, IMAGE + bytes([i]), inference_id=f"req-{i}") for i in range(3)]
    local.endpoint_api.delete_endpoint({"EndpointName": ENDPOINT})  # flushes what it buffered
    (key,) = capture_keys(s3)
    folder, name = key.rsplit("/", 1)
    hours = {s3_layout.capture_hour_prefix(ENDPOINT, "AllTraffic", t.year, t.month, t.day, t.hour).rstrip("/")
             for t in (before, datetime.now(UTC))}
    assert folder in hours and FILE_NAME.match(name), key
    records = window(s3, before)
    assert [r.eventMetadata.inferenceId for r in records] == ["req-0", "req-1", "req-2"]
    for i, (record, answer) in enumerate(zip(records, answers, strict=True)):
        sent, got = record.captureData.endpointInput, record.captureData.endpointOutput
        assert sent is not None and got is not None
        assert (sent.encoding, sent.observedContentType, sent.raw()) == ("BASE64", "image/png", IMAGE + bytes([i]))
        assert (got.encoding, got.data) == ("JSON", answer.decode())
        assert abs(record.eventMetadata.inferenceTime - before) < timedelta(minutes=5)
    assert len({r.eventMetadata.eventId for r in records}) == 3


def test_a_config_with_capture_off_writes_nothing(offline: tuple[LocalSageMaker, Any]) -> None:
    """CaptureSamplingPercentage 0 (EnableCapture false). Mutation caught: EnableCapture ignored."""
    local, s3 = offline
    serve(local, "off")
    for _ in range(5):
        invoke(local)
    local.shutdown()
    assert capture_keys(s3) == []


def test_records_are_written_every_max_records_and_none_lost_at_stop(offline: tuple[LocalSageMaker, Any]) -> None:
    """Mutations caught: the buffer never written before stop (a long-running endpoint captures nothing), or the
    remainder dropped at stop."""
    local, s3 = offline
    local.endpoint_api.capture.max_records = 2
    serve(local, "all")
    for _ in range(5):
        invoke(local)
    assert len(capture_keys(s3)) == 2 and local.endpoint_api.capture.pending() == 1  # 2 + 2 written, 1 waiting
    local.shutdown()  # the runtime stopping: the last record too
    assert len(capture_keys(s3)) == 3
    assert len(window(s3, datetime.now(UTC))) == 5


def test_a_buffer_is_written_once_its_first_record_is_flush_seconds_old(offline: tuple[LocalSageMaker, Any]) -> None:
    """Mutation caught: no timer (records of a quiet endpoint would wait for the next stop)."""
    local, s3 = offline
    local.endpoint_api.capture.flush_seconds = 0.2
    serve(local, "all")
    invoke(local)
    deadline = time.monotonic() + 10
    while not capture_keys(s3):
        assert time.monotonic() < deadline, "the timer never wrote the buffered record"
        time.sleep(0.05)
    assert local.endpoint_api.capture.pending() == 0


def test_sampling_keeps_exactly_the_requests_whose_event_id_hash_is_below_the_percentage(
        offline: tuple[LocalSageMaker, Any]) -> None:
    """Mutations caught: the percentage ignored (all or none kept), a random draw (not reproducible)."""
    local, s3 = offline
    ids = iter(f"event-{i}" for i in range(40))
    local.endpoint_api.capture.new_event_id = lambda: next(ids)
    serve(local, "some")
    for _ in range(40):
        invoke(local)
    local.shutdown()
    expected = [f"event-{i}" for i in range(40) if sampled(f"event-{i}", 37)]
    assert 0 < len(expected) < 40  # both outcomes occur, so the test can tell
    assert [r.eventMetadata.eventId for r in window(s3, datetime.now(UTC))] == expected


@pytest.mark.parametrize(("percent", "low", "high"), [(0, 0, 0), (100, 20_000, 20_000), (10, 1_800, 2_200)])
def test_the_sampling_rule_keeps_the_percentage_of_event_ids(percent: int, low: int, high: int) -> None:
    kept = sum(sampled(f"{i:08x}-uuid", percent) for i in range(20_000))
    assert low <= kept <= high


def test_input_only_capture_stores_no_answer(offline: tuple[LocalSageMaker, Any]) -> None:
    """CaptureOptions Input only. Mutation caught: the options ignored."""
    local, s3 = offline
    serve(local, "input-only")
    invoke(local)
    local.shutdown()
    (record,) = window(s3, datetime.now(UTC))
    assert record.captureData.endpointInput is not None and record.captureData.endpointOutput is None


def test_a_file_key_is_the_hour_folder_of_its_first_record() -> None:
    first = datetime(2026, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC)
    settings = CaptureSettings.from_config(capture_config(10))
    assert settings is not None and (settings.bucket, settings.prefix) == (BUCKET, "capture")
    key = capture_file_key(settings.prefix, "ep", "AllTraffic", first, "0f0e0d0c-0000-4000-8000-000000000000")
    assert key == s3_layout.capture_hour_prefix("ep", "AllTraffic", 2026, 3, 4, 5) + \
        "06-07-890-0f0e0d0c-0000-4000-8000-000000000000.jsonl"
    assert CaptureSettings.from_config({**capture_config(10), "EnableCapture": False}) is None
    assert CaptureSettings.from_config(None) is None


def test_a_failed_write_keeps_its_records_for_the_next_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """The destination bucket missing at first (NoSuchBucket from moto), then there. Mutations caught: the
    records dropped with the failed write, a record of the next hour written into the earlier hour's file."""
    from d2ops.offline.services.sagemaker_capture import CaptureWriter

    support.aws_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        writer = CaptureWriter(s3, max_records=2)
        settings = CaptureSettings.from_config(capture_config(100))
        assert settings is not None
        t = datetime(2026, 7, 1, 9, 59, 58, tzinfo=UTC)
        for i in range(2):  # a full buffer: its write fails
            writer.capture(settings, ENDPOINT, "AllTraffic", request=b"i", request_type="image/png", answer=b"{}",
                           answer_type="application/json", when=t + timedelta(seconds=i))
        assert writer.pending() == 2
        s3.create_bucket(Bucket=BUCKET)
        writer.capture(settings, ENDPOINT, "AllTraffic", request=b"i", request_type="image/png", answer=b"{}",
                       answer_type="application/json", when=t + timedelta(seconds=3))  # 10:00:01, another hour
        writer.close()
        keys = capture_keys(s3)
        assert [k.split("/")[-2] for k in keys] == ["09", "10"]
        bodies = [s3.get_object(Bucket=BUCKET, Key=k)["Body"].read().decode().splitlines() for k in keys]
        assert [len(b) for b in bodies] == [2, 1]
