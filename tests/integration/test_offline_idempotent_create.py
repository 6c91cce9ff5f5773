"""A retried Create* after a lost response must find what the first call created, not make a second one.

The offline runtime injects the fault (``lost_responses``): CreateModelPackage reaches the service and
succeeds, then the task fails as a lost response does (``SageMaker.SdkClientException``) and the
state's Retry sends it again. The real "Register model version" state (from the substituted
definition) carries a ClientToken derived from the execution name, so the retry gets the first
package back; the same state without the token registers the model twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.offline.runtime import OfflineRuntime

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

INPUT = {"dataset": {"name": "shapes", "version": "v1"},
         "gate": {"reason": "challenger bbox_AP 0.55 reaches the threshold", "approval_status": "Approved"},
         "training": {"model_data": "s3://d2ops-artifactsbucket/runs/r1/training/output/model.tar.gz",
                      "job_name": "r1-train"},
         "evaluation": {"report_uri": "s3://d2ops-artifactsbucket/runs/r1/evaluation/evaluation.json",
                        "primary_metric": "bbox_AP", "challenger_value": 0.55}}


def _register_machine(rt: OfflineRuntime, name: str, *, client_token: bool) -> StateMachine:
    """The pipeline's own "Register model version" state, alone (no Catch: a failure fails the run)."""
    state = {k: v for k, v in rt.machine.definition["States"]["Register model version"].items()
             if k not in ("Next", "Catch")}
    if not client_token:
        state["Parameters"] = {k: v for k, v in state["Parameters"].items() if not k.startswith("ClientToken")}
    machine = StateMachine.from_definition({"StartAt": "Register", "States": {"Register": {**state, "End": True}}},
                                           name=name)
    rt.sfn.add_state_machine(machine)
    return machine


def _run(rt: OfflineRuntime, machine: StateMachine, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    sfn = rt.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine.arn, name=name, input=json.dumps(INPUT))["executionArn"]
    deadline = time.monotonic() + 60
    while (described := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        assert time.monotonic() < deadline, f"{name} still running"
        time.sleep(0.2)
    return described, sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]


def _packages(rt: OfflineRuntime) -> list[str]:
    listed = rt.client("sagemaker").list_model_packages(ModelPackageGroupName=rt.stack.model_package_group)
    return sorted(p["ModelPackageArn"] for p in listed["ModelPackageSummaryList"])


def test_a_retried_create_model_package_after_a_lost_response_returns_the_first_package(tmp_path: Path) -> None:
    with OfflineRuntime(tmp_path / "work", lost_responses={"sagemaker:createModelPackage": 1}) as rt:
        described, history = _run(rt, _register_machine(rt, "register", client_token=True), "with-token")
        assert described["status"] == "SUCCEEDED", described
        failures = [e["taskFailedEventDetails"] for e in history if e["type"] == "TaskFailed"]
        assert [f["error"] for f in failures] == ["SageMaker.SdkClientException"]  # lost once, then retried
        (package,) = _packages(rt)  # the retry found the package the first call created
        assert json.loads(described["output"])["registration"]["model_package_arn"] == package

        # The control: the same state without its token registers the model twice after the same fault.
        rt.lost_responses["sagemaker:createModelPackage"] = 1
        described, _ = _run(rt, _register_machine(rt, "register-no-token", client_token=False), "without-token")
        assert described["status"] == "SUCCEEDED", described
        assert len(_packages(rt)) == 3
