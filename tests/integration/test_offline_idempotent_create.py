"""A retried Create* after a lost response must find what the first call created, not make a second one.

The offline runtime injects the fault (``lost_responses``): CreateModelPackage reaches the service and
succeeds, then the task fails as a lost response does (``SageMaker.SdkClientException``) and the
state's Retry sends it again. The real "Register model version" state (from the substituted
definition) carries a ClientToken derived from the execution name, so the retry gets the first
package back; the same state without the token registers the model twice.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core.pipeline_stages import all_states

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("idempotent") / "work", lost_responses={}) as runtime:
        yield runtime

INPUT = {"dataset": {"name": "shapes", "version": "v1"},
         "gate": {"reason": "challenger bbox_AP 0.55 reaches the threshold", "approval_status": "Approved",
                  "description": "shapes v1: challenger bbox_AP 0.55 reaches the threshold"},
         "training": {"model_data": "s3://d2ops-artifactsbucket/runs/r1/training/output/model.tar.gz",
                      "job_name": "r1-train"},
         "evaluation": {"report_uri": "s3://d2ops-artifactsbucket/runs/r1/evaluation/evaluation.json",
                        "primary_metric": "bbox_AP", "challenger_value": 0.55,
                        "score_thresholds": "square=0.61 disc=0.55"},
         # The registry entry records what the model was trained on (prepare_training's plan).
         "plan": {"inventory_digest": "sha256:" + "ab" * 32,
                  "dataset_snapshot_uri": "s3://d2ops-artifactsbucket/runs/r1/dataset/"}}


def _register_machine(rt: OfflineRuntime, name: str, *, client_token: bool) -> StateMachine:
    """The pipeline's own "Register model version" state, alone (no Catch: a failure fails the run)."""
    state = {k: v for k, v in all_states(rt.machine.definition)["Register model version"].items()
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


def test_a_retried_create_model_package_after_a_lost_response_returns_the_first_package(
        rt: OfflineRuntime) -> None:
    before = _packages(rt)
    rt.lost_responses["sagemaker:createModelPackage"] = 1
    described, history = _run(rt, _register_machine(rt, "register", client_token=True), "with-token")
    assert described["status"] == "SUCCEEDED", described
    failures = [e["taskFailedEventDetails"] for e in history if e["type"] == "TaskFailed"]
    assert [f["error"] for f in failures] == ["SageMaker.SdkClientException"]  # lost once, then retried
    (package,) = sorted(set(_packages(rt)) - set(before))  # the retry found the package the first call created
    assert json.loads(described["output"])["registration"]["model_package_arn"] == package

    # The control: the same state without its token registers the model twice after the same fault.
    rt.lost_responses["sagemaker:createModelPackage"] = 1
    described, _ = _run(rt, _register_machine(rt, "register-no-token", client_token=False), "without-token")
    assert described["status"] == "SUCCEEDED", described
    assert len(_packages(rt)) == len(before) + 3


DEPLOY_STATES = ("Create model", "Model already created?", "Find created model", "Created model is ours?",
                 "Create endpoint config", "Endpoint config already created?", "Find created endpoint config",
                 "Created endpoint config is ours?")


def _deploy_machine(rt: OfflineRuntime) -> StateMachine:
    """The pipeline's own create states with what follows them stubbed: Succeed where the deployment goes on,
    Fail where it is recorded as failed."""
    states: dict[str, Any] = {name: copy.deepcopy(all_states(rt.machine.definition)[name]) for name in DEPLOY_STATES}
    states["Find current endpoint"] = {"Type": "Succeed"}
    states["Record deployment failure"] = {"Type": "Fail", "Error": "DeploymentFailed", "CausePath": "$.error.Cause"}
    return StateMachine.from_definition({"StartAt": "Create model", "States": states}, name="deploy")


def _deploy_input(rt: OfflineRuntime, run: str, package: str) -> dict[str, Any]:
    # The variants as prepare_training builds them for the default GPU type (with its InferenceAmiVersion).
    variant = {"VariantName": "AllTraffic", "ModelName": f"{run}-model", "InstanceType": "ml.g4dn.xlarge",
               "InitialInstanceCount": 1, "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-2"}
    capture = {"EnableCapture": False, "InitialSamplingPercentage": 0, "DestinationS3Uri": "s3://artifacts/capture",
               "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]}
    return {"plan": {"names": {"model": f"{run}-model", "endpoint_config": f"{run}-config"},
                     "endpoint": {"instance_type": "ml.g4dn.xlarge", "instance_count": 1,
                                  "production_variants": [variant], "data_capture_config": capture}},
            "registration": {"model_package_arn": package}}


def test_retried_create_model_and_endpoint_config_find_what_the_first_attempt_created(rt: OfflineRuntime) -> None:
    from d2ops.offline.task_integrations import ServiceExecutors

    sagemaker = rt.client("sagemaker")
    packages = [sagemaker.create_model_package(ModelPackageGroupName=rt.stack.model_package_group,
                                               ModelApprovalStatus="Approved")["ModelPackageArn"]
                for _ in range(2)]
    machine = _deploy_machine(rt)
    faults = {"sagemaker:createModel": 1, "sagemaker:createEndpointConfig": 1}
    registry = ServiceExecutors(rt.lambdas, rt.client, faults).registry()
    execution = machine.run(_deploy_input(rt, "r1", packages[0]), executors=registry)  # virtual clock
    assert execution.status == "SUCCEEDED", (execution.error, execution.cause)
    assert faults == {"sagemaker:createModel": 0, "sagemaker:createEndpointConfig": 0}  # both were lost once
    visited = [e["stateEnteredEventDetails"]["name"] for e in execution.history if e["type"] == "TaskStateEntered"]
    assert visited == ["Create model", "Find created model", "Create endpoint config",
                       "Find created endpoint config"]
    config = sagemaker.describe_endpoint_config(EndpointConfigName="r1-config")
    assert config["ProductionVariants"][0]["ModelName"] == "r1-model"
    # aws-sdk:sagemaker:createEndpointConfig passed the variant whole, and the offline SageMaker kept it
    assert config["ProductionVariants"][0]["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-2"

    # A name taken by something else (another package) is not ours: the deployment fails, naming it.
    other = machine.run(_deploy_input(rt, "r1", packages[1]), executors=registry)
    assert other.status == "FAILED" and other.error == "DeploymentFailed"
    assert other.cause.startswith('Cannot create already existing model "arn:aws:sagemaker:')
