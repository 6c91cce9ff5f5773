"""aws-sdk and optimised integrations fail offline with the error names Step Functions gives them.

Step Functions names an aws-sdk integration's errors ``<ServiceName>.<ErrorName>``, "both in
PascalCase" (https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html:
``aws-sdk:acmpca`` -> ``AcmPca.ResourceNotFoundException``), always with the ``Exception``
suffix; ``<Service>.<Service>Exception`` when the service does not model the error and
``<Service>.SdkClientException`` when the SDK itself failed. So ``aws-sdk:cloudwatch`` errors are
``CloudWatch.*``, never ``Cloudwatch.*``. Checked here through moto's CloudWatch and SNS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.asl import StateMachine
from d2ops.offline.task_integrations import ServiceExecutors, error_name

REGION = "us-east-1"
NO_LAMBDAS: Any = None  # these tests call no Lambda function


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_CLOUDWATCH", "AWS_ENDPOINT_URL_SNS"):
        monkeypatch.delenv(key, raising=False)
    with mock_aws():
        yield lambda service: boto3.client(service, region_name=REGION, aws_access_key_id="x",
                                           aws_secret_access_key="x")


def caught(resource: str, parameters: dict[str, Any], executors: ServiceExecutors) -> dict[str, Any]:
    """The error output a catch-all Catch receives from one Task on ``resource``."""
    definition = {"StartAt": "Call", "States": {
        "Call": {"Type": "Task", "Resource": resource, "Parameters": parameters, "End": True,
                 "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Caught"}]},
        "Caught": {"Type": "Pass", "End": True}}}
    execution = StateMachine.from_definition(definition, name="SdkErrors").run({}, executors=executors.registry())
    assert execution.status == "SUCCEEDED", execution.cause
    output: dict[str, Any] = execution.output
    return output


def test_cloudwatch_sdk_errors_are_prefixed_cloudwatch_in_pascal_case(clients: Any) -> None:
    executors = ServiceExecutors(lambdas=NO_LAMBDAS, clients=clients)
    missing = caught("arn:aws:states:::aws-sdk:cloudwatch:setAlarmState",
                     {"AlarmName": "nope", "StateValue": "ALARM", "StateReason": "test"}, executors)
    assert missing["Error"] == "CloudWatch.ResourceNotFoundException", missing
    lost = ServiceExecutors(lambdas=NO_LAMBDAS, clients=clients, lost_responses={"cloudwatch:putMetricData": 1})
    timed_out = caught("arn:aws:states:::aws-sdk:cloudwatch:putMetricData",
                       {"Namespace": "d2ops", "MetricData": [{"MetricName": "m", "Value": 1}]}, lost)
    assert timed_out["Error"] == "CloudWatch.SdkClientException"


@pytest.mark.parametrize(("service", "code", "sdk", "expected"), [
    ("cloudwatch", "ResourceNotFound", True, "CloudWatch.ResourceNotFoundException"),
    ("cloudwatch", "Throttling", True, "CloudWatch.CloudWatchException"),  # not modelled
    ("sfn", "ExecutionDoesNotExist", True, "Sfn.ExecutionDoesNotExistException"),
    ("sns", "NotFound", True, "Sns.NotFoundException"),
    ("sns", "NotFound", False, "SNS.NotFoundException"),        # the optimised integration keeps it
    ("sns", "Throttled", False, "SNS.ThrottledException"),
    ("sns", "InternalFailure", False, "SNS.AmazonSNSException"),  # not modelled
    ("cloudwatch", "ValidationError", True, "CloudWatch.ValidationException"),  # the wire code of a shape
    ("sagemaker", "ResourceNotFound", False, "SageMaker.ResourceNotFoundException"),  # modelled: kept
    ("sagemaker", "ResourceInUse", False, "SageMaker.ResourceInUseException"),
    ("sagemaker", "ThrottlingException", False, "SageMaker.AmazonSageMakerException"),  # not modelled
    ("dynamodb", "ConditionalCheckFailedException", False, "DynamoDB.ConditionalCheckFailedException"),
    ("dynamodb", "ConditionalCheckFailedException", True, "DynamoDb.ConditionalCheckFailedException"),
])
def test_error_names_per_integration(service: str, code: str, sdk: bool, expected: str) -> None:
    make_client: Any = boto3.client  # a service name from the table, not a literal boto3-stubs knows
    client = make_client({"sfn": "stepfunctions"}.get(service, service), region_name=REGION,
                         aws_access_key_id="x", aws_secret_access_key="x")
    assert error_name(client, service, code, sdk) == expected
