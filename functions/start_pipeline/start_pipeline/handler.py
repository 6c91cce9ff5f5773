"""EventBridge (S3 Object Created) -> Step Functions StartExecution, idempotently."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from start_pipeline.models import ObjectCreatedEvent
from start_pipeline.service import handle_object_created

logger = Logger()
tracer = Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@event_parser(model=ObjectCreatedEvent)
def handler(event: ObjectCreatedEvent, context: LambdaContext) -> dict[str, Any]:
    result = handle_object_created(event, boto3.client("stepfunctions"), os.environ["STATE_MACHINE_ARN"])
    if result.action == "ignored":
        logger.info("ignoring object: not a dataset manifest", extra={"key": result.key, "reason": result.reason})
    else:
        logger.info(f"run {result.action}", extra=result.model_dump())
    return result.model_dump()
