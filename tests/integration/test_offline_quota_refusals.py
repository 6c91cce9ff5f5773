"""The offline SageMaker counts instances against the offline account's quotas as SageMaker does, and
refuses a request over one with ResourceLimitExceeded in SageMaker's words (d2ops.offline.quotas).

Through boto3 and the gateway, as the state machine's tasks call it. Endpoints are served by a stub
(no TorchServe: what is tested is the accounting), jobs by instant ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.services.sagemaker_jobs import JobOutcome
from d2ops_core.platform import QuotaRefusal, parse_quota_refusal
from tests.fixtures.offline.endpoints import endpoint_config, in_service, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ENDPOINT_QUOTA = "ml.m5.large for endpoint usage"  # the instance type of tests/fixtures/offline/endpoints.py
PROCESSING_QUOTA = "ml.c5.xlarge for processing job usage"


class _Served:
    url = "http://127.0.0.1:9"

    def stop(self) -> None:
        pass


class _StubServing:
    def start(self, model_tar: Path, work_dir: Path, name: str, environment: Any = None) -> _Served:
        return _Served()


class _HeldJobs:
    """Processing jobs that run until released: they hold their instances meanwhile."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        raise AssertionError("no training here")

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        self.release.wait(60)
        return JobOutcome(failure_reason="released")


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    jobs = _HeldJobs()
    with OfflineRuntime(tmp_path_factory.mktemp("quotas") / "work", serving=_StubServing(), jobs=jobs,
                        quotas={ENDPOINT_QUOTA: 3, PROCESSING_QUOTA: 1}) as runtime:
        yield runtime
        jobs.release.set()


def _refusal(call: Any, **kwargs: Any) -> QuotaRefusal:
    with pytest.raises(ClientError) as refused:
        call(**kwargs)
    error = refused.value.response["Error"]
    assert error["Code"] == "ResourceLimitExceeded"
    parsed = parse_quota_refusal(error["Message"])
    assert parsed is not None, error["Message"]
    return parsed


def test_a_blue_green_update_needs_room_for_both_fleets(rt: OfflineRuntime) -> None:
    sm, name = rt.client("sagemaker"), rt.stack.endpoint_name
    one, two, three = (endpoint_config(rt, f"q{n}", b"model", instances=n) for n in (1, 2, 3))
    assert _refusal(sm.create_endpoint, EndpointName="too-big", EndpointConfigName=endpoint_config(
        rt, "q4", b"model", instances=4)) == QuotaRefusal(ENDPOINT_QUOTA, 3, 0, 4)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=one)
    wait_for(rt, in_service)
    # 1 serving + 3 new would be 4: refused, and the endpoint stays as it was.
    assert _refusal(sm.update_endpoint, EndpointName=name, EndpointConfigName=three) == \
        QuotaRefusal(ENDPOINT_QUOTA, 3, 1, 3)
    assert sm.describe_endpoint(EndpointName=name)["EndpointConfigName"] == one
    sm.update_endpoint(EndpointName=name, EndpointConfigName=two)  # 1 + 2 = 3: fits
    assert wait_for(rt, lambda d: in_service(d) and d["EndpointConfigName"] == two)["EndpointConfigName"] == two
    # Another endpoint counts against the same quota; a deleted one no longer does.
    assert _refusal(sm.create_endpoint, EndpointName="second", EndpointConfigName=two) == \
        QuotaRefusal(ENDPOINT_QUOTA, 3, 2, 2)
    sm.delete_endpoint(EndpointName=name)
    sm.create_endpoint(EndpointName="second", EndpointConfigName=three)
    sm.delete_endpoint(EndpointName="second")


def test_a_running_job_holds_its_instances_until_it_ends(rt: OfflineRuntime) -> None:
    sm = rt.client("sagemaker")

    def job(name: str) -> dict[str, Any]:
        return {"ProcessingJobName": name, "RoleArn": "arn:aws:iam::123456789012:role/r",
                "AppSpecification": {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"},
                "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.c5.xlarge",
                                                          "VolumeSizeInGB": 1}}}

    sm.create_processing_job(**job("held"))
    assert _refusal(sm.create_processing_job, **job("second")) == QuotaRefusal(PROCESSING_QUOTA, 1, 1, 1)
    # Refused: nothing was created under that name.
    with pytest.raises(ClientError):
        sm.describe_processing_job(ProcessingJobName="second")
