"""The state machine's AWS contract, checked against botocore's service models and Step Functions' docs.

Every Task's Parameters are taken as Step Functions renders them (the real definition, substituted
with the stack's example values, run through every test case of the mock config), so paths,
intrinsics and InputPath-passed requests are what gets checked, not the template text. See
d2ops.aws_contract for where each rule comes from.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops import aws_contract as contract
from d2ops import template as sam
from d2ops.asl.substitution import placeholders
from tests.fixtures.pipeline import support

DEFINITION = json.loads(support.DEFINITION.read_text())
TASKS = dict(contract.tasks(DEFINITION))


def _resource(state: dict[str, Any]) -> str:
    return str(state["Resource"]).replace("${Partition}", "aws")


@cache
def rendered_parameters() -> dict[str, list[dict[str, Any]]]:
    """Every Task's rendered Parameters over all mock test cases (TaskScheduled events)."""
    cases = json.loads(support.MOCK_CONFIG.read_text())["StateMachines"]["training_pipeline"]["TestCases"]
    seen: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        execution = support.run_case(case)
        for state in TASKS:
            seen.setdefault(state, []).extend(support.task_parameters(execution, state))
    return seen


def test_every_task_is_an_optimised_integration_we_know_or_aws_sdk() -> None:
    for state in TASKS.values():
        integration = contract.parse_resource(_resource(state))  # raises with the reason
        contract.operation_model(integration.service, integration.operation)  # the API exists


def test_every_task_runs_in_some_mock_case() -> None:
    missing = sorted(name for name, params in rendered_parameters().items() if not params)
    assert not missing, f"no mock test case reaches these Tasks, so their rendered Parameters go unchecked: {missing}"


@pytest.mark.parametrize("state", sorted(TASKS))
def test_rendered_parameters_fit_the_service_model_and_the_integration(state: str) -> None:
    integration = contract.parse_resource(_resource(TASKS[state]))
    for parameters in rendered_parameters()[state]:
        unsupported = contract.unsupported_fields(integration, parameters)
        assert not unsupported, (f"{state}: {[contract.unsupported_field_cause(f) for f in unsupported]} on "
                                 f"{integration.key}; use aws-sdk:{integration.key} ({contract.SDK_INTEGRATIONS_DOC})")
        problems = contract.request_problems(integration.service, integration.operation,
                                             contract.as_sdk_request(integration, parameters))
        assert not problems, f"{state} ({integration.operation}): {problems}"


@pytest.fixture
def prepare_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.prepare_env(monkeypatch)
    support.function_path("prepare_training")
    from prepare_training import handler

    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        support.put_pretrained_weights(boto3.client("s3"))
        support.put_inventory(boto3.client("s3"), support.RUN_ID)
        yield handler.handler


@pytest.mark.parametrize("case", ["defaults", "manifest_overrides"])
def test_the_prepared_job_requests_fit_the_optimised_sync_integrations(prepare_handler: Any, case: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The training and evaluation requests reach createTrainingJob.sync/createProcessingJob.sync through
    InputPath: Step Functions checks them only at run time, as an uncatchable States.Runtime."""
    if case == "manifest_overrides":  # instance segmentation: the stack names Mask R-CNN's checkpoint
        monkeypatch.setenv("PRETRAINED_WEIGHTS_KEY", support.MASK_WEIGHTS_KEY)
        support.put_pretrained_weights(boto3.client("s3"), support.MASK_WEIGHTS_KEY)
    plan = prepare_handler(support.load_event("prepare_training", case), support.FakeLambdaContext())
    for state, key in (("Train model", "training_job"), ("Evaluate challenger and champion", "evaluation_job")):
        assert TASKS[state]["InputPath"] == f"$.plan.{key}"
        integration = contract.parse_resource(_resource(TASKS[state]))
        assert contract.unsupported_fields(integration, plan[key]) == [], state
        assert contract.request_problems(integration.service, integration.operation, plan[key]) == [], state


def test_the_checks_catch_what_the_service_would_refuse() -> None:
    good = {"EndpointName": "d2ops-detector", "EndpointConfigName": "shapes-v1-config"}
    assert contract.request_problems("sagemaker", "CreateEndpoint", good) == []
    bad_cases = {
        "unknown": {**good, "DeploymentConfg": {}},
        "required": {"EndpointName": "d2ops-detector"},
        "type": {**good, "Tags": {"Key": "a"}},
        "pattern": {**good, "EndpointName": "d2ops_detector"},
        "length": {**good, "EndpointName": "e" * 64},
    }
    for what, request in bad_cases.items():
        assert contract.request_problems("sagemaker", "CreateEndpoint", request), what
    enum = {"ModelPackageGroupName": "g", "ModelApprovalStatus": "approved"}
    assert any("not one of" in p for p in contract.request_problems("sagemaker", "CreateModelPackage", enum))
    update = contract.parse_resource("arn:aws:states:::sagemaker:updateEndpoint")
    assert contract.unsupported_fields(update, {**good, "DeploymentConfig": {}}) == ["DeploymentConfig"]
    assert contract.unsupported_field_cause("DeploymentConfig") == \
        'The field "DeploymentConfig" is not supported by Step Functions'
    with pytest.raises(contract.ContractError, match="aws-sdk"):
        contract.parse_resource("arn:aws:states:::sagemaker:createModelPackage")
    with pytest.raises(contract.ContractError, match=r"\.sync"):
        contract.parse_resource("arn:aws:states:::aws-sdk:sagemaker:createTrainingJob.sync")


def _function_errors(state: dict[str, Any]) -> set[str]:
    """Names of the exception classes a Lambda's modules raise or import (a Lambda task's error name
    is the class name of the exception its handler raised)."""
    placeholder = placeholders(state["Parameters"]["FunctionName"])[0]
    tpl = sam.load_template()
    value = tpl.state_machine("PipelineStateMachine").definition_substitutions[placeholder]
    getatt = value["Fn::GetAtt"]
    code_dir = tpl.function(getatt[0] if isinstance(getatt, list) else getatt.split(".")[0]).code_dir
    support.function_path(code_dir.name)
    names: set[str] = set()
    for path in code_dir.glob("*/*.py"):
        module = importlib.import_module(f"{path.parent.name}.{path.stem}")
        names |= {obj.__name__ for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, Exception)}
    return names


@pytest.mark.parametrize("state", sorted(TASKS))
def test_every_retry_and_catch_error_name_can_occur(state: str) -> None:
    """Error names per the Step Functions error handling page (``States.*``), the service's modelled
    errors with Step Functions' naming, or a Lambda's own exception classes."""
    task = TASKS[state]
    integration = contract.parse_resource(_resource(task))
    possible = contract.STATES_ERRORS | contract.possible_errors(integration)
    if integration.key == "lambda:invoke":
        possible |= _function_errors(task)
    never = sorted(set(contract.error_names(task)) - possible)
    assert not never, f"{state} ({integration.key}) handles errors it can never get: {never}"


def test_sagemaker_error_names_are_the_ones_step_functions_reports() -> None:
    optimised = contract.possible_errors(contract.parse_resource("arn:aws:states:::sagemaker:createModel"))
    # Modelled errors keep their names (CreateModel models only ResourceLimitExceeded); the rest is the catch-all.
    assert optimised == {"SageMaker.AmazonSageMakerException", "SageMaker.SdkClientException",
                         "SageMaker.ResourceLimitExceededException"}
    sync = contract.possible_errors(contract.parse_resource("arn:aws:states:::sagemaker:createTrainingJob.sync"))
    assert {"SageMaker.ResourceInUseException", "SageMaker.ResourceNotFoundException"} <= sync
    describe = contract.possible_errors(contract.parse_resource("arn:aws:states:::aws-sdk:sagemaker:describeEndpoint"))
    # SageMaker models no ThrottlingException or ResourceNotFoundException for DescribeEndpoint: a
    # missing endpoint is a ValidationException, which Step Functions reports as SageMakerException.
    assert "SageMaker.SageMakerException" in describe
    assert "SageMaker.ResourceNotFoundException" not in describe and "SageMaker.ThrottlingException" not in describe
    register = contract.parse_resource("arn:aws:states:::aws-sdk:sagemaker:createModelPackage")
    names = contract.possible_errors(register)
    assert "SageMaker.ResourceLimitExceededException" in names and "SageMaker.ResourceLimitExceeded" not in names


def _run_with_endpoint_lookup_error(error: str, cause: str) -> Any:
    """The FirstDeployment mock case, but DescribeEndpoint fails with ``error``/``cause``."""
    from d2ops.asl.mock import MockConfig

    data = json.loads(support.MOCK_CONFIG.read_text())
    cases = data["StateMachines"]["training_pipeline"]["TestCases"]
    cases["LookupFails"] = {**cases["FirstDeployment"], "Find current endpoint": "LookupFails"}
    data["MockedResponses"]["LookupFails"] = {"0-9": {"Throw": {"Error": error, "Cause": cause}}}
    sm = support.machine()
    mock = MockConfig(data).test_case(sm.name, "LookupFails")
    return sm.run(support.INPUT, executors={"arn:aws:states:::lambda:invoke": support._describe_failure,
                                             "arn:aws:*": support._unexpected},
                  mock=mock, execution_name=support.RUN_ID)


def test_only_a_missing_endpoint_creates_one() -> None:
    """SageMaker models no not-found error for DescribeEndpoint: a missing endpoint is a
    ValidationException ("Could not find endpoint ..."), reported by the aws-sdk integration as
    SageMaker.SageMakerException, like throttling and AccessDenied, which must not create one."""
    missing = _run_with_endpoint_lookup_error(
        "SageMaker.SageMakerException",
        'Could not find endpoint "arn:aws:sagemaker:us-east-1:123456789012:endpoint/d2ops-detector". '
        "(Service: SageMaker, Status Code: 400, Request ID: 0f1e)")
    assert missing.status == "SUCCEEDED" and "Create endpoint" in support.entered_states(missing)
    denied = _run_with_endpoint_lookup_error(
        "SageMaker.SageMakerException",
        "User: arn:aws:sts::123456789012:assumed-role/d2ops-PipelineRole/x is not authorized to perform: "
        "sagemaker:DescribeEndpoint (Service: SageMaker, Status Code: 400, Error Code: AccessDeniedException)")
    assert denied.status == "FAILED" and denied.error == "DeploymentFailed", (denied.error, denied.cause)
    assert "Create endpoint" not in support.entered_states(denied)
    # The failure line names the role and what it lacks (d2ops_core.failures.refusal).
    assert "role d2ops-PipelineRole lacks sagemaker:DescribeEndpoint" in str(denied.cause)


def test_boto3_calls_in_the_suite_are_held_to_the_whole_contract() -> None:
    """tests/fixtures/aws_contract_plugin.py: botocore alone would send this request (it checks no
    patterns); the service would refuse it, and so does every in-process call during the tests."""
    from botocore.exceptions import ParamValidationError

    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s",
                          endpoint_url="http://127.0.0.1:9")  # never reached: validation comes first
    with pytest.raises(ParamValidationError, match="EndpointName: 'd2ops_detector' does not match the pattern"):
        client.describe_endpoint(EndpointName="d2ops_detector")


def test_both_traffic_routings_the_plan_makes_are_rendered_and_checked() -> None:
    """prepare_training picks ALL_AT_ONCE for a one-instance endpoint and a CANARY for more; the mock
    cases render both through "Update endpoint (blue/green)", so the model check above covers both."""
    kinds = {p["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["Type"]
             for p in rendered_parameters()["Update endpoint (blue/green)"]}
    assert kinds == {"ALL_AT_ONCE", "CANARY"}
    bad = {"EndpointName": "d2ops-detector", "EndpointConfigName": "c", "DeploymentConfig": {"BlueGreenUpdatePolicy": {
        "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600, "CanarySize": None}}}}
    assert contract.request_problems("sagemaker", "UpdateEndpoint", bad)  # a null member would be refused
