"""EventBridge (S3 Object Created) -> Step Functions StartExecution, idempotently."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core import pipeline_metrics as pm
from d2ops_core.lambda_task import task_handler
from start_pipeline.models import ObjectCreatedEvent
from start_pipeline.service import handle_object_created

logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace=pm.NAMESPACE)


@task_handler(ObjectCreatedEvent, logger, tracer, metrics)
def handler(event: ObjectCreatedEvent, context: LambdaContext) -> dict[str, Any]:
    result = handle_object_created(event, boto3.client("stepfunctions"), os.environ["STATE_MACHINE_ARN"])
    if result.action == "ignored":
        logger.info("ignoring object: not a dataset manifest", extra={"key": result.key, "reason": result.reason})
    else:
        logger.info(f"run {result.action}", extra=result.model_dump())
    # Zeros too: a dashboard sums them, and S3's at-least-once delivery shows as duplicates.
    metrics.add_metric(name=pm.RUNS_STARTED, unit=MetricUnit.Count, value=int(result.action == "started"))
    metrics.add_metric(name=pm.DUPLICATE_DELIVERIES, unit=MetricUnit.Count,
                       value=int(result.action == "already-started"))
    return result.model_dump()
