"""Offline SageMaker's UpdateEndpoint traffic routing, fast: real HTTP model servers, moto records.

ALL_AT_ONCE (what a one-instance endpoint gets, prepare_training.service.traffic_routing) must
behave as SageMaker's "all at once traffic shifting" guide says: the new fleet takes 100 % of the
traffic during the baking period, the old fleet stays provisioned until the bake ends, and an
alarm during the bake shifts all traffic back to it. A CANARY SageMaker refuses is refused.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.offline.errors import ApiError
from d2ops.offline.services.sagemaker import LocalSageMaker
from tests.fixtures.offline.endpoints import baking
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
from prepare_training.service import traffic_routing  # noqa: E402

BUCKET = "d2ops-offline-routing"
ENDPOINT = "routing-detector"
ALARM = "routing-smoke-alarm"
ROLE = "arn:aws:iam::123456789012:role/d2ops-EndpointRole"


class ModelServer:
    """A real HTTP server whose /invocations answers with its model archive's bytes (which model)."""

    def __init__(self, answer: bytes) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(outer.answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.answer = answer
        self.stopped = False
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self._server.shutdown()
            self._server.server_close()


class Serving:
    def __init__(self) -> None:
        self.started: dict[bytes, ModelServer] = {}
        self.environments: dict[bytes, dict[str, str]] = {}

    def start(self, model_tar: Path, work_dir: Path, name: str,
              environment: dict[str, str] | None = None) -> ModelServer:
        server = ModelServer(model_tar.read_bytes())
        self.started[server.answer] = server
        self.environments[server.answer] = dict(environment or {})
        return server


@pytest.fixture
def sagemaker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalSageMaker, Serving, Any]]:
    support.aws_env(monkeypatch)
    with mock_aws():
        s3, registry, cloudwatch = boto3.client("s3"), boto3.client("sagemaker"), boto3.client("cloudwatch")
        s3.create_bucket(Bucket=BUCKET)
        for model, instances in (("blue", 1), ("green", 1), ("wide", 4)):
            s3.put_object(Bucket=BUCKET, Key=f"{model}/model.tar.gz", Body=model.encode())
            registry.create_model(ModelName=f"{model}-model", ExecutionRoleArn=ROLE, PrimaryContainer={
                "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/d2ops-serving:1",
                "ModelDataUrl": f"s3://{BUCKET}/{model}/model.tar.gz",
                **({"Environment": {"MAX_IMAGE_PIXELS": "50000000"}} if model == "green" else {})})
            registry.create_endpoint_config(EndpointConfigName=f"{model}-config", ProductionVariants=[{
                "VariantName": "AllTraffic", "ModelName": f"{model}-model", "InstanceType": "ml.m5.large",
                "InitialInstanceCount": instances}])
        cloudwatch.put_metric_alarm(AlarmName=ALARM, Namespace="d2ops/Deployment", MetricName="SmokeTestFailures",
                                    Statistic="Sum", Period=60, EvaluationPeriods=1, Threshold=1,
                                    ComparisonOperator="GreaterThanOrEqualToThreshold")
        serving = Serving()
        local = LocalSageMaker(tmp_path, s3, registry, jobs=None, serving=serving,
                               region="us-east-1", account_id="123456789012", cloudwatch=cloudwatch,
                               max_bake_seconds=30)
        local.endpoint_api.create_endpoint({"EndpointName": ENDPOINT, "EndpointConfigName": "blue-config"})
        wait_until(local, lambda d: d["EndpointStatus"] == "InService")
        try:
            yield local, serving, cloudwatch
        finally:
            local.shutdown()


def wait_until(local: LocalSageMaker, done: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = local.endpoint_api.describe_endpoint({"EndpointName": ENDPOINT})
        if done(described):
            return described
        time.sleep(0.05)
    raise AssertionError(f"endpoint still {described['EndpointStatus']} after {timeout} s: {described}")


def answers(local: LocalSageMaker, n: int) -> list[bytes]:
    return [local.invoke(ENDPOINT, b"image", "image/png", None)[1] for _ in range(n)]


def update(local: LocalSageMaker, config: str, routing: dict[str, Any]) -> None:
    local.endpoint_api.update_endpoint({"EndpointName": ENDPOINT, "EndpointConfigName": config, "DeploymentConfig": {
        "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing, "TerminationWaitInSeconds": 120,
                                  "MaximumExecutionTimeoutInSeconds": 3600},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": ALARM}]}}})


def test_all_at_once_sends_everything_to_the_new_fleet_and_an_alarm_in_the_bake_restores_the_old(
        sagemaker: tuple[LocalSageMaker, Serving, Any]) -> None:
    local, serving, cloudwatch = sagemaker
    update(local, "green-config", traffic_routing(1).model_dump())
    wait_until(local, baking)
    assert answers(local, 6) == [b"green"] * 6  # 100 % on the new fleet during the bake
    assert not serving.started[b"blue"].stopped  # the old fleet is still provisioned
    cloudwatch.set_alarm_state(AlarmName=ALARM, StateValue="ALARM", StateReason="smoke test failed")
    described = wait_until(local, lambda d: d["EndpointStatus"] == "InService")
    assert described["EndpointConfigName"] == "blue-config" and ALARM in described["FailureReason"]
    assert answers(local, 3) == [b"blue"] * 3 and serving.started[b"green"].stopped


def test_each_fleet_runs_with_its_models_container_environment(sagemaker: tuple[LocalSageMaker, Serving, Any]) -> None:
    """As SageMaker does: the server gets CreateModel's PrimaryContainer.Environment (the pipeline's
    MAX_IMAGE_PIXELS), per model; a model without one gets none."""
    local, serving, _ = sagemaker
    update(local, "green-config", traffic_routing(1).model_dump())
    wait_until(local, baking)
    assert serving.environments == {b"blue": {}, b"green": {"MAX_IMAGE_PIXELS": "50000000"}}


def test_all_at_once_keeps_the_old_fleet_until_the_bake_ends(sagemaker: tuple[LocalSageMaker, Serving, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    local, serving, _ = sagemaker
    local.max_bake_seconds = 1.0
    # The endpoint as the bake begins and as it ends, seen from inside the bake: a test polling from
    # outside can miss a one-second bake on a busy machine (or see it end between two of its lines).
    seen: list[tuple[bool, bool]] = []
    endpoints = local.endpoint_api
    bake = endpoints._watch_alarms

    def watched(*args: Any) -> str | None:
        seen.append((baking(endpoints.describe_endpoint({"EndpointName": ENDPOINT})), serving.started[b"blue"].stopped))
        tripped = bake(*args)
        seen.append((baking(endpoints.describe_endpoint({"EndpointName": ENDPOINT})), serving.started[b"blue"].stopped))
        return tripped

    monkeypatch.setattr(endpoints, "_watch_alarms", watched)
    update(local, "green-config", traffic_routing(1).model_dump())
    described = wait_until(local, lambda d: d["EndpointStatus"] == "InService")
    assert seen == [(True, False), (True, False)]  # baking, with the old fleet up, from start to end
    assert described["EndpointConfigName"] == "green-config" and "FailureReason" not in described
    assert serving.started[b"blue"].stopped and answers(local, 2) == [b"green"] * 2


def test_a_canary_over_half_the_instances_is_refused_and_changes_nothing(
        sagemaker: tuple[LocalSageMaker, Serving, Any]) -> None:
    local, serving, _ = sagemaker
    one_instance_canary = {"Type": "CANARY", "WaitIntervalInSeconds": 600,
                           "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}}
    with pytest.raises(ApiError, match="less than or equal to 50% of the variant's total instance count") as err:
        update(local, "green-config", one_instance_canary)
    assert err.value.code == "ValidationException"
    described = local.endpoint_api.describe_endpoint({"EndpointName": ENDPOINT})
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "blue-config")
    assert b"green" not in serving.started
    # The same canary on the four-instance config is what prepare_training plans for it.
    assert traffic_routing(4).model_dump() == one_instance_canary
    local.max_bake_seconds = 60.0  # the split is read during the bake, which never ends first (shutdown ends it)
    update(local, "wide-config", one_instance_canary)
    wait_until(local, baking)
    split = answers(local, 8)
    assert split.count(b"wide") == 2 and split.count(b"blue") == 6  # 25 % of every prefix
