"""Offline SageMaker endpoints through boto3: real servers, InvokeEndpoint proxy, blue/green, rollback.

Run once per serving backend (TorchServe, Ray Serve), named by the model's container Environment
(D2OPS_SERVING_BACKEND) as the state machine's CreateModel sets it. One endpoint lives through every
kind of update, so each run starts four servers:
an update to a broken archive rolls back; a blue/green update switches traffic; a canary that
loads and warms up but fails on real images gets its share of the traffic during the bake, fails
the pipeline's smoke test there, and the smoke-test alarm (as the state machine trips it) rolls it
back, after which the old model answers every request exactly as before. (The slow
tests/integration/test_offline_canary.py and tests/e2e/test_offline_canary_pipeline.py add the
promoted canary and the state machine's own path.)
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from d2ops.offline.runtime import OfflineRuntime
from model_code.serving.backends import BACKEND_ENV, BACKENDS
from tests.fixtures.offline.endpoints import baking, deployment_config, endpoint_config, in_service, wait_for
from tests.fixtures.pipeline import support
from tests.fixtures.serving.failing_model import failing_artifact, relabelled
from tests.fixtures.serving.support import CATEGORY_IDS, CLASS_NAMES, cached_artifact, png_bytes

support.function_path("smoke_test_endpoint")
from smoke_test_endpoint.models import SmokeTestEvent  # noqa: E402
from smoke_test_endpoint.service import SmokeTestFailed, smoke_test  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ENDPOINT = "test-detector"
# A canary fleet of four instances: the pipeline's plan for it is a 25 % canary (prepare_training).
CANARY_INSTANCES = 4
SMOKE_PREFIX = "datasets/canary/v1/"


# What each server runs besides Python: TorchServe's Java frontend, Ray's raylet.
SERVER_PROGRAM = {"torchserve": "java", "ray-serve": "raylet"}


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp(f"endpoints-{backend}") / "work") as rt:
        yield rt


def _programs(rt: OfflineRuntime) -> set[str]:
    found: set[str] = set()
    for p in rt.warden.descendants():
        try:
            found.update(name for name in SERVER_PROGRAM.values() if p.name() == name)  # raylet's cmdline names java
        except psutil.Error:
            continue
    return found


def _settle(rt: OfflineRuntime, timeout: float = 400) -> dict[str, Any]:
    sm = rt.client("sagemaker")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described: dict[str, Any] = sm.describe_endpoint(EndpointName=ENDPOINT)
        if described["EndpointStatus"] not in ("Creating", "Updating"):
            return described
        time.sleep(1)
    raise AssertionError(f"{ENDPOINT} still {described['EndpointStatus']} after {timeout} s")


def _invoke(rt: OfflineRuntime, image: bytes | None = None, **options: str) -> dict[str, Any]:
    response = rt.client("sagemaker-runtime").invoke_endpoint(EndpointName=ENDPOINT, Body=image or png_bytes(),
                                                              ContentType="image/png", **options)
    assert response["ContentType"].startswith("application/json")
    answer: dict[str, Any] = json.loads(response["Body"].read())
    return answer


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def test_endpoint_lifecycle_blue_green_and_rollback(runtime: OfflineRuntime, backend: str, tmp_path: Path) -> None:
    env = {BACKEND_ENV: backend}
    sm = runtime.client("sagemaker")
    smr = runtime.client("sagemaker-runtime")
    model = cached_artifact(pack=True).read_bytes()
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint"):
        sm.describe_endpoint(EndpointName=ENDPOINT)

    # Names per backend: moto's state is one per process, and both backends' runtimes run in this one.
    blue = endpoint_config(runtime, f"blue-{backend}", model, environment=env)
    sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName=blue)
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "Creating"
    with pytest.raises(smr.exceptions.ValidationError):  # nothing serves before InService
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=png_bytes(), ContentType="image/png")
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", blue)
    # The model's Environment chose the server (catches a runtime that ignores it and always starts TorchServe).
    assert _programs(runtime) == {SERVER_PROGRAM[backend]}
    answer = _invoke(runtime)
    # An untrained detector: what matters here is the served JSON shape for this very image.
    assert answer["image"] == {"width": 160, "height": 120} and isinstance(answer["detections"], list)
    with pytest.raises(smr.exceptions.ModelError) as bad:
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=b"not an image", ContentType="image/png")
    assert 400 <= bad.value.response["OriginalStatusCode"] < 500
    blue_url = runtime.sagemaker.endpoint_url(ENDPOINT)
    assert blue_url is not None

    broken = endpoint_config(runtime, f"broken-{backend}", b"this is not a model archive", environment=env)
    sm.update_endpoint(EndpointName=ENDPOINT, EndpointConfigName=broken)
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "Updating"
    _invoke(runtime)  # blue keeps serving during the update
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", blue)
    assert described["FailureReason"]  # the update rolled back to the old config
    assert runtime.sagemaker.endpoint_url(ENDPOINT) == blue_url
    _invoke(runtime)

    green = endpoint_config(runtime, f"green-{backend}", model, environment=env)
    sm.update_endpoint(EndpointName=ENDPOINT, EndpointConfigName=green)
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", green)
    green_url = runtime.sagemaker.endpoint_url(ENDPOINT)
    assert green_url not in (None, blue_url)
    assert _answers(str(green_url)) and not _answers(blue_url)  # traffic switched, then blue stopped
    _invoke(runtime)

    _a_canary_failing_its_smoke_test_is_rolled_back(runtime, tmp_path, green, str(green_url), env, backend)

    sm.delete_endpoint(EndpointName=ENDPOINT)
    with pytest.raises(smr.exceptions.ValidationError):
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=png_bytes(), ContentType="image/png")
    assert not _answers(str(green_url))
    assert runtime.warden.descendants() == []  # no TorchServe, Ray or worker process left behind


def _a_canary_failing_its_smoke_test_is_rolled_back(rt: OfflineRuntime, tmp_path: Path, old_config: str,
                                                    old_url: str, environment: dict[str, str], backend: str) -> None:
    """The canary's rollback with the old model serving (what the pipeline's bake does, minus the state machine).

    The canary is the serving model relabelled (ids 101/102/107, ``canary-*`` names) and wrapped to
    fail on images narrower than 200 px: the smoke test's 160 px image gets its 500, and a 320 px
    image it would answer, with labels the old model never gives.
    """
    sm, s3 = rt.client("sagemaker"), rt.client("s3")
    rt.sagemaker.max_bake_seconds = 120  # the alarm ends the bake; this only outlasts the smoke test
    wide = png_bytes(320, 240, seed=1)
    # An untrained detector: threshold 0 so that the answer has detections (and labels) to compare.
    old_answer = _invoke(rt, wide, CustomAttributes="score_threshold=0")
    assert old_answer["detections"]
    labels = set(zip(CATEGORY_IDS, CLASS_NAMES, strict=True))
    assert {(d["class_id"], d["class_name"]) for d in old_answer["detections"]} <= labels

    canary_model = relabelled(cached_artifact(), tmp_path / "canary", [100 + i for i in CATEGORY_IDS],
                              [f"canary-{n}" for n in CLASS_NAMES])
    bad = endpoint_config(rt, f"bad-{backend}", failing_artifact(canary_model, tmp_path / "bad"),
                          instances=CANARY_INSTANCES, environment=environment)
    routing = deployment_config(rt, CANARY_INSTANCES)
    assert routing["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["Type"] == "CANARY"
    sm.update_endpoint(EndpointName=ENDPOINT, EndpointConfigName=bad, DeploymentConfig=routing)
    wait_for(rt, baking, endpoint=ENDPOINT)

    s3.put_object(Bucket=rt.stack.data_bucket, Key=SMOKE_PREFIX + "images/a.png", Body=png_bytes())
    smoke = SmokeTestEvent(endpoint_name=ENDPOINT, bucket=rt.stack.data_bucket, prefix=SMOKE_PREFIX, requests=8)
    clients = (s3, rt.client("sagemaker-runtime"))
    with pytest.raises(SmokeTestFailed, match=r"request \d of 8: .* answered 500"):
        smoke_test(smoke, *clients)
    assert baking(sm.describe_endpoint(EndpointName=ENDPOINT)), "the bake ended before the smoke test judged the canary"
    # What the state machine's "Trip smoke test alarm" state does; SageMaker then rolls back.
    rt.client("cloudwatch").set_alarm_state(AlarmName=rt.stack.substitutions["SmokeTestAlarmName"],
                                            StateValue="ALARM", StateReason="smoke test failed")
    described = wait_for(rt, in_service, timeout=60, endpoint=ENDPOINT)
    assert described["EndpointConfigName"] == old_config and "SmokeTestAlarm" in described["FailureReason"]
    assert "PendingDeploymentSummary" not in described
    assert rt.sagemaker.endpoint_url(ENDPOINT) == old_url  # the old server, never stopped

    # The old model answers every request: the smoke image the canary fails on, and the wide image
    # with the old model's own detections (the canary's quarter of the traffic would get canary-*).
    before = rt.sagemaker.served(ENDPOINT)
    for attempt in range(CANARY_INSTANCES):
        answer = _invoke(rt, wide, CustomAttributes="score_threshold=0")
        assert answer == old_answer, f"answer {attempt + 1} after the rollback is not the old model's"
    assert smoke_test(smoke, *clients).requests == 8
    after = rt.sagemaker.served(ENDPOINT)
    assert (after[old_config] - before[old_config], after.get(bad, 0)) == (8 + CANARY_INSTANCES, before.get(bad, 0))
