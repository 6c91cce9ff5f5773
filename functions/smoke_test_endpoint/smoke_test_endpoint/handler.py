"""Step Functions task: InvokeEndpoint with a validation image; raises SmokeTestFailed on a bad answer."""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from smoke_test_endpoint.models import SmokeTestEvent
from smoke_test_endpoint.service import smoke_test

logger = Logger()
tracer = Tracer()


@task_handler(SmokeTestEvent, logger, tracer)
def handler(event: SmokeTestEvent, context: LambdaContext) -> dict[str, Any]:
    result = smoke_test(event, boto3.client("s3"), boto3.client("sagemaker-runtime"))
    logger.info("smoke test passed", extra=result.model_dump())
    return result.model_dump(mode="json")
