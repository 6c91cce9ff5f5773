"""Offline SageMaker endpoints through boto3: real TorchServe, InvokeEndpoint proxy, blue/green, rollback."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from d2ops.offline.runtime import OfflineRuntime
from tests.fixtures.offline.endpoints import endpoint_config
from tests.fixtures.serving.support import cached_artifact, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ENDPOINT = "test-detector"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("endpoints") / "work") as rt:
        yield rt


def _settle(rt: OfflineRuntime, timeout: float = 400) -> dict[str, Any]:
    sm = rt.client("sagemaker")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described: dict[str, Any] = sm.describe_endpoint(EndpointName=ENDPOINT)
        if described["EndpointStatus"] not in ("Creating", "Updating"):
            return described
        time.sleep(1)
    raise AssertionError(f"{ENDPOINT} still {described['EndpointStatus']} after {timeout} s")


def _invoke(rt: OfflineRuntime) -> dict[str, Any]:
    response = rt.client("sagemaker-runtime").invoke_endpoint(EndpointName=ENDPOINT, Body=png_bytes(),
                                                              ContentType="image/png")
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


def test_endpoint_lifecycle_blue_green_and_rollback(runtime: OfflineRuntime) -> None:
    sm = runtime.client("sagemaker")
    smr = runtime.client("sagemaker-runtime")
    model = cached_artifact(pack=True).read_bytes()
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint"):
        sm.describe_endpoint(EndpointName=ENDPOINT)

    blue = endpoint_config(runtime, "blue", model)
    sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName=blue)
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "Creating"
    with pytest.raises(smr.exceptions.ValidationError):  # nothing serves before InService
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=png_bytes(), ContentType="image/png")
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", blue)
    answer = _invoke(runtime)
    # An untrained detector: what matters here is the served JSON shape for this very image.
    assert answer["image"] == {"width": 160, "height": 120} and isinstance(answer["detections"], list)
    with pytest.raises(smr.exceptions.ModelError) as bad:
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=b"not an image", ContentType="image/png")
    assert 400 <= bad.value.response["OriginalStatusCode"] < 500
    blue_url = runtime.sagemaker.endpoint_url(ENDPOINT)
    assert blue_url is not None

    broken = endpoint_config(runtime, "broken", b"this is not a model archive")
    sm.update_endpoint(EndpointName=ENDPOINT, EndpointConfigName=broken)
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "Updating"
    _invoke(runtime)  # blue keeps serving during the update
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", blue)
    assert described["FailureReason"]  # the update rolled back to the old config
    assert runtime.sagemaker.endpoint_url(ENDPOINT) == blue_url
    _invoke(runtime)

    green = endpoint_config(runtime, "green", model)
    sm.update_endpoint(EndpointName=ENDPOINT, EndpointConfigName=green)
    described = _settle(runtime)
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", green)
    green_url = runtime.sagemaker.endpoint_url(ENDPOINT)
    assert green_url not in (None, blue_url)
    assert _answers(str(green_url)) and not _answers(blue_url)  # traffic switched, then blue stopped
    _invoke(runtime)

    sm.delete_endpoint(EndpointName=ENDPOINT)
    with pytest.raises(smr.exceptions.ValidationError):
        smr.invoke_endpoint(EndpointName=ENDPOINT, Body=png_bytes(), ContentType="image/png")
    assert not _answers(str(green_url))
    assert runtime.warden.descendants() == []  # no TorchServe or worker left behind
