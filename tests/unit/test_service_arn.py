"""d2ops.asl.service_arn: the one reading of a Task's service-integration ARN (interpreter, offline runtime,
AWS contract)."""

from __future__ import annotations

import pytest

from d2ops.asl.service_arn import ServiceArn, parse_service_arn


@pytest.mark.parametrize(("resource", "expected", "resource_type", "resource_name"), [
    ("arn:aws:states:::lambda:invoke", ServiceArn("aws", "lambda", "invoke", False, ""), "lambda", "invoke"),
    ("arn:aws-cn:states:::sagemaker:createTrainingJob.sync",
     ServiceArn("aws-cn", "sagemaker", "createTrainingJob", False, ".sync"), "sagemaker", "createTrainingJob.sync"),
    ("arn:aws:states:::aws-sdk:sagemaker:describeEndpoint",
     ServiceArn("aws", "sagemaker", "describeEndpoint", True, ""), "aws-sdk:sagemaker", "describeEndpoint"),
    # the history events name .sync:2 whole in `resource`, the service alone in `resourceType`
    ("arn:aws:states:::states:startExecution.sync:2",
     ServiceArn("aws", "states", "startExecution", False, ".sync:2"), "states", "startExecution.sync:2"),
    ("arn:aws:states:::lambda:invoke.waitForTaskToken",
     ServiceArn("aws", "lambda", "invoke", False, ".waitForTaskToken"), "lambda", "invoke.waitForTaskToken"),
])
def test_service_integration_arns_are_read_into_their_parts(resource: str, expected: ServiceArn, resource_type: str,
                                                             resource_name: str) -> None:
    arn = parse_service_arn(resource)
    assert arn == expected
    assert (arn.resource_type, arn.resource) == (resource_type, resource_name)
    assert arn.operation == arn.action[0].upper() + arn.action[1:]


@pytest.mark.parametrize("resource", [
    "arn:aws:lambda:us-east-1:123456789012:function:f",  # a function ARN: the Lambda task, not an integration
    "arn:aws:states:us-east-1:123456789012:activity:a",
    "arn:aws:states:::sagemaker:createTrainingJob.async",
    "arn:aws:states:::sagemaker",
])
def test_other_resources_are_not_service_integrations(resource: str) -> None:
    assert parse_service_arn(resource) is None
