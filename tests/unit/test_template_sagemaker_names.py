"""Names the stack gives SageMaker resources, and the IAM that must match them.

SageMaker lower-cases resource names in its ARNs, so an IAM resource built from a stack name
with capitals never matches (AccessDenied). CloudFormation cannot constrain the stack name, so
the SageMaker names come from the SageMakerNamePrefix parameter, whose constraint fails the
deployment up front. The retained model package group carries the stack id, so re-creating a
deleted stack makes a new group instead of failing on the retained one's name.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from d2ops import aws_contract as contract
from d2ops import template as sam

TEMPLATE = sam.load_template()
PREFIX = TEMPLATE.document["Parameters"]["SageMakerNamePrefix"]
STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/My-Stack/0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f"


def resolved(value: Any, prefix: str = "d2ops", stack_id: str = STACK_ID) -> Any:
    refs = {"AWS::StackName": "My-Stack", "AWS::StackId": stack_id, "SageMakerNamePrefix": prefix}
    return TEMPLATE.resolve(value, refs, getatt=lambda logical_id, attribute: f"{logical_id}.{attribute}")


def _allowed(prefix: str) -> bool:
    return (PREFIX["MinLength"] <= len(prefix) <= PREFIX["MaxLength"]
            and re.fullmatch(PREFIX["AllowedPattern"], prefix) is not None)


@pytest.mark.parametrize("prefix", ["d2ops", "team-a", "x", "a" * 40])
def test_names_from_any_allowed_prefix_are_valid_sagemaker_names(prefix: str) -> None:
    assert _allowed(prefix)
    subs = TEMPLATE.state_machine("PipelineStateMachine").definition_substitutions
    endpoint = resolved(subs["EndpointName"], prefix)
    group = resolved(subs["ModelPackageGroupName"], prefix)
    assert contract.request_problems("sagemaker", "CreateEndpoint",
                                     {"EndpointName": endpoint, "EndpointConfigName": "c"}) == []
    assert contract.request_problems("sagemaker", "CreateModelPackageGroup", {"ModelPackageGroupName": group}) == []
    assert endpoint == endpoint.lower() and group == group.lower()  # what SageMaker puts in the ARN


@pytest.mark.parametrize("prefix", ["D2ops", "my_stack", "-d2ops", "d2ops-", "", "a" * 41])
def test_prefixes_sagemaker_or_iam_cannot_take_fail_the_deployment(prefix: str) -> None:
    assert not _allowed(prefix)


def test_a_recreated_stack_gets_a_new_model_package_group() -> None:
    """The group is retained on delete (it holds every model version); a fixed name would make
    the next stack of the same name fail to create it."""
    name = TEMPLATE.resource("ModelPackageGroup")["Properties"]["ModelPackageGroupName"]
    other = STACK_ID.replace("0f9e8d7c-6b5a", "11223344-6b5a")
    assert resolved(name) == "d2ops-models-0f9e8d7c"
    assert resolved(name, stack_id=other) != resolved(name)


def _statement(sid: str) -> dict[str, Any]:
    policies = TEMPLATE.resource("PipelineStateMachine")["Properties"]["Policies"]
    (statement,) = [s for p in policies if isinstance(p, dict) for s in p.get("Statement", []) if s.get("Sid") == sid]
    return statement


def test_iam_resources_are_the_lower_case_names_sagemaker_puts_in_arns() -> None:
    group = resolved(TEMPLATE.resource("ModelPackageGroup")["Properties"]["ModelPackageGroupName"])
    register = [resolved(r) for r in _statement("RegisterModelVersions")["Resource"]]
    assert register == [f"arn:aws:sagemaker:us-east-1:123456789012:model-package-group/{group}",
                        f"arn:aws:sagemaker:us-east-1:123456789012:model-package/{group}/*"]
    for sid in ("RegisterModelVersions", "DeployModels", "ManageTheEndpoint"):
        for resource in _statement(sid)["Resource"]:
            arn = str(resolved(resource))
            assert arn.split(":", 5)[5] == arn.split(":", 5)[5].lower(), (sid, arn)


def test_sync_jobs_may_list_their_tags_as_step_functions_generated_policies_do() -> None:
    statement = _statement("TrainAndEvaluate")
    assert "sagemaker:ListTags" in statement["Action"]
    assert all(":training-job/" in str(r) or ":processing-job/" in str(r) for r in statement["Resource"])
