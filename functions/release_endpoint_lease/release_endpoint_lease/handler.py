"""EventBridge (Step Functions execution ended) -> release the endpoint lease the execution holds and,
when it ended abnormally, stop the run's SageMaker jobs still running."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from release_endpoint_lease.models import ExecutionStatusChange
from release_endpoint_lease.service import handle_status_change

logger = Logger()
tracer = Tracer()


@task_handler(ExecutionStatusChange, logger, tracer)
def handler(event: ExecutionStatusChange, context: LambdaContext) -> dict[str, Any]:
    try:
        result = handle_status_change(event, boto3.client("dynamodb"), os.environ["LEASE_TABLE_NAME"],
                                      os.environ["ENDPOINT_NAME"], boto3.client("sagemaker"),
                                      os.environ["ARTIFACTS_BUCKET"])
    except Exception:
        # EventBridge invoked us asynchronously: failing makes Lambda retry the event twice, then put it
        # on the function's dead-letter queue (template.yaml), whose alarm tells the operator.
        logger.exception("could not finish after the execution ended",
                         extra={"execution_arn": event.detail.executionArn, "status": event.detail.status})
        raise
    logger.info(f"endpoint lease {result.action}", extra=result.model_dump())
    return result.model_dump()
