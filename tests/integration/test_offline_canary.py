"""The offline endpoint's canary, for real: two servers, the traffic split, the smoke test in the
bake, and the auto-rollback alarm, once per serving backend (the model's D2OPS_SERVING_BACKEND).
The DeploymentConfig is the state machine's own.

A good model is promoted after its bake; a model that loads and warms up but fails on real
images is caught by the smoke test during the bake, the smoke test alarm is tripped as the
state machine trips it, and the old model serves again (and the bad server is gone).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.runtime import OfflineRuntime
from model_code.serving.backends import BACKEND_ENV, BACKENDS
from tests.fixtures.offline import endpoints
from tests.fixtures.offline.endpoints import baking, endpoint_config, in_service, wait_for
from tests.fixtures.pipeline import support
from tests.fixtures.serving.failing_model import failing_artifact
from tests.fixtures.serving.support import cached_artifact, png_bytes

support.function_path("smoke_test_endpoint")
from smoke_test_endpoint.models import SmokeTestEvent  # noqa: E402
from smoke_test_endpoint.service import SmokeTestFailed, smoke_test  # noqa: E402

# Three server starts and a bake per backend: minutes, so with the slow checks (`make test-all`).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]
PREFIX = "datasets/canary/v1/"
# Four instances: the plan's routing is then a 25 % canary (one instance takes ALL_AT_ONCE).
INSTANCES = 4


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp(f"canary-{backend}") / "work") as rt:
        # Long enough for the smoke test on a loaded 2-core machine (each answer can take seconds).
        rt.sagemaker.max_bake_seconds = 90
        rt.client("s3").put_object(Bucket=rt.stack.data_bucket, Key=PREFIX + "images/a.png", Body=png_bytes())
        yield rt


def deployment_config(rt: OfflineRuntime) -> dict[str, Any]:
    config = endpoints.deployment_config(rt, INSTANCES)
    assert config["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["Type"] == "CANARY"
    return config


def test_a_good_canary_is_promoted_and_a_bad_one_rolled_back_by_its_smoke_test(runtime: OfflineRuntime,
                                                                             backend: str, tmp_path: Path) -> None:
    env = {BACKEND_ENV: backend}
    sm, name = runtime.client("sagemaker"), runtime.stack.endpoint_name
    smoke = SmokeTestEvent(endpoint_name=name, bucket=runtime.stack.data_bucket, prefix=PREFIX, requests=8)
    clients = (runtime.client("s3"), runtime.client("sagemaker-runtime"))
    good = cached_artifact(pack=True)
    blue = endpoint_config(runtime, "blue", good, environment=env)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=blue)
    assert wait_for(runtime, in_service)["EndpointConfigName"] == blue
    assert smoke_test(smoke, *clients).requests == 8

    # A good model: during the bake a quarter of the requests reach it, then it takes everything.
    green = endpoint_config(runtime, "green", good, instances=INSTANCES, environment=env)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=green, DeploymentConfig=deployment_config(runtime))
    wait_for(runtime, baking)
    before = runtime.sagemaker.served(name)
    smoke_test(smoke, *clients)
    after = runtime.sagemaker.served(name)
    assert baking(sm.describe_endpoint(EndpointName=name)), "the bake ended before the smoke test did"
    assert after.get(green, 0) - before.get(green, 0) == 2 and after[blue] - before[blue] == 6  # 25 % of 8
    described = wait_for(runtime, in_service)
    assert described["EndpointConfigName"] == green and "PendingDeploymentSummary" not in described
    green_url = runtime.sagemaker.endpoint_url(name)

    # A model that fails on real images: the smoke test in the bake sees the canary's 5xx.
    bad = endpoint_config(runtime, "bad", failing_artifact(cached_artifact(), tmp_path), instances=INSTANCES,
                          environment=env)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=bad, DeploymentConfig=deployment_config(runtime))
    wait_for(runtime, baking)
    with pytest.raises(SmokeTestFailed, match=r"request \d of 8: .* answered 500"):
        smoke_test(smoke, *clients)
    assert runtime.client("sagemaker").describe_endpoint(EndpointName=name)["EndpointStatus"] == "Updating"
    # What the state machine's "Trip smoke test alarm" state does; SageMaker then rolls back.
    runtime.client("cloudwatch").set_alarm_state(AlarmName=runtime.stack.substitutions["SmokeTestAlarmName"],
                                                 StateValue="ALARM", StateReason="smoke test failed")
    described = wait_for(runtime, in_service, timeout=60)
    assert described["EndpointConfigName"] == green and "SmokeTestAlarm" in described["FailureReason"]
    assert runtime.sagemaker.endpoint_url(name) == green_url
    served = runtime.sagemaker.served(name)
    result = smoke_test(smoke, *clients)  # the old model answers every request again
    assert result.requests == 8 and runtime.sagemaker.served(name)[green] - served[green] == 8
    assert runtime.sagemaker.served(name).get(bad, 0) == served.get(bad, 0)
