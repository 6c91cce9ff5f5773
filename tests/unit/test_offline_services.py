"""The offline runtime's registry of emulated AWS services (d2ops.offline.services.SERVICES).

What each service declares must be what boto3 does: the AWS_ENDPOINT_URL_* variable it reads for the
client, the X-Amz-Target prefix and JSON version it sends, the operations it has. And a service
added to the endpoint is reached by boto3 with no other change (one module, one line).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import boto3
import botocore.session
import pytest

from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.errors import ApiError
from d2ops.offline.services import SERVICES, LocalSageMaker, LocalStepFunctions, OfflineServiceQuotas
from d2ops.offline.services.base import AwsJsonService, RuntimeParts
from d2ops.offline.services.sagemaker_endpoints import LocalEndpoints
from d2ops.offline.services.sagemaker_jobs import LocalJobs

_SESSION = botocore.session.get_session()


def _model(client: str) -> Any:
    return _SESSION.get_service_model(client)


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.CLIENT)
def test_each_service_declares_the_variable_and_protocol_boto3_uses(service: Any) -> None:
    metadata = _model(service.CLIENT).metadata
    # boto3's service-specific endpoint variable: the service id, upper case, spaces as underscores.
    assert "AWS_ENDPOINT_URL_" + metadata["serviceId"].upper().replace(" ", "_") == service.ENDPOINT_VARIABLE
    if issubclass(service, AwsJsonService):
        assert metadata["protocol"] == "json"
        assert (metadata["targetPrefix"], metadata["jsonVersion"]) == (service.TARGET_PREFIX, service.JSON_VERSION)
    else:
        assert metadata["protocol"] == "rest-json"  # SageMaker Runtime: routed by its path


def test_the_services_are_distinct_and_their_operations_exist() -> None:
    assert len({s.ENDPOINT_VARIABLE for s in SERVICES}) == len(SERVICES)
    assert len({s.CLIENT for s in SERVICES}) == len(SERVICES)
    for service, operations in ((LocalSageMaker, LocalSageMaker.OWNED),
                                (LocalStepFunctions, frozenset(LocalStepFunctions.OPERATIONS)),
                                (OfflineServiceQuotas, OfflineServiceQuotas.OWNED)):
        assert operations <= set(_model(service.CLIENT).operation_names), service
    # SageMaker's owned operations are the jobs' and the endpoints', each served by one of them.
    assert LocalSageMaker.OWNED == LocalJobs.OPERATIONS | LocalEndpoints.OPERATIONS
    assert not LocalJobs.OPERATIONS & LocalEndpoints.OPERATIONS


class _Logs(AwsJsonService):
    """An emulated API as a new module would add it: CloudWatch Logs' DescribeLogGroups."""

    CLIENT = "logs"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"
    TARGET_PREFIX = "Logs_20140328"
    JSON_VERSION = "1.1"
    seen: ClassVar[list[str]] = []

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> _Logs:
        return cls()

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(operation)
        if operation != "DescribeLogGroups":
            raise ApiError("ResourceNotFoundException", f"{operation} is not here")
        return {"logGroups": [{"logGroupName": request.get("logGroupNamePrefix", "") + "-group"}]}


@pytest.fixture
def endpoint() -> Iterator[AwsEndpoint]:
    served = AwsEndpoint("http://127.0.0.1:9")  # nothing here is forwarded to moto
    served.add(_Logs())
    served.start()
    try:
        yield served
    finally:
        served.stop()


def test_a_service_added_to_the_endpoint_answers_boto3_with_its_errors(endpoint: AwsEndpoint) -> None:
    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=endpoint.url, aws_access_key_id="offline",
                        aws_secret_access_key="offline")
    assert logs.describe_log_groups(logGroupNamePrefix="d2ops")["logGroups"] == [{"logGroupName": "d2ops-group"}]
    with pytest.raises(logs.exceptions.ResourceNotFoundException, match="DeleteLogGroup is not here"):
        logs.delete_log_group(logGroupName="x")
    assert _Logs.seen[-2:] == ["DescribeLogGroups", "DeleteLogGroup"]


def test_a_request_no_service_accepts_is_refused_by_name(endpoint: AwsEndpoint) -> None:
    sfn = boto3.client("stepfunctions", region_name="us-east-1", endpoint_url=endpoint.url,
                       aws_access_key_id="offline", aws_secret_access_key="offline")
    with pytest.raises(sfn.exceptions.ClientError, match=r"no offline service for AWSStepFunctions\.ListStateMachines"):
        sfn.list_state_machines()
