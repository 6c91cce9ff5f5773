"""A Task's service-integration ``Resource``, read in one place: the interpreter's history events, the offline
runtime's integrations and the AWS contract checks all parse it here.

``arn:<partition>:states:::[aws-sdk:]<service>:<action>[.sync | .sync:2 | .waitForTaskToken]``
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SERVICE_ARN = re.compile(r"^arn:(?P<partition>[^:]+):states:::(?:(?P<sdk>aws-sdk):)?(?P<service>[a-z0-9-]+):"
                         r"(?P<action>[A-Za-z0-9]+)(?P<pattern>\.sync(?::2)?|\.waitForTaskToken)?$")


@dataclass(frozen=True)
class ServiceArn:
    partition: str
    service: str  # as Step Functions names it: sagemaker, lambda, sfn, states, s3...
    action: str  # camelCase, as in the ARN: createTrainingJob
    sdk: bool  # an aws-sdk integration (not an optimised one)
    pattern: str  # "", ".sync", ".sync:2" or ".waitForTaskToken"

    @property
    def resource_type(self) -> str:
        """The history events' ``resourceType``: ``sagemaker``, ``aws-sdk:sagemaker``."""
        return f"aws-sdk:{self.service}" if self.sdk else self.service

    @property
    def resource(self) -> str:
        """The history events' ``resource``: ``createTrainingJob.sync``."""
        return self.action + self.pattern

    @property
    def operation(self) -> str:
        """The API operation: ``CreateTrainingJob``."""
        return self.action[:1].upper() + self.action[1:]


def parse_service_arn(resource: str) -> ServiceArn | None:
    """The parts of a service-integration ARN; None for anything else (a Lambda function or activity ARN)."""
    match = SERVICE_ARN.match(resource)
    if match is None:
        return None
    return ServiceArn(partition=match["partition"], service=match["service"], action=match["action"],
                      sdk=bool(match["sdk"]), pattern=match["pattern"] or "")
