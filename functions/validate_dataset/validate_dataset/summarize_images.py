"""Step Functions task after the Distributed Map: the image checks merged into the report (SummarizeImagesEvent)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core import pipeline_metrics as pm
from d2ops_core.lambda_task import task_handler
from validate_dataset.handler import env_int, record_metrics
from validate_dataset.models import SummarizeImagesEvent
from validate_dataset.service import DEFAULT_IMAGE_CHECK_CONCURRENCY, summarize_images

logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace=pm.NAMESPACE)


@task_handler(SummarizeImagesEvent, logger, tracer, metrics)
def handler(event: SummarizeImagesEvent, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(run_id=event.run_id, dataset=f"s3://{event.bucket}/{event.prefix}")
    summary = summarize_images(event, boto3.client("s3"), os.environ["ARTIFACTS_BUCKET"],
                               concurrency=env_int("IMAGE_CHECK_CONCURRENCY", DEFAULT_IMAGE_CHECK_CONCURRENCY))
    logger.info("image checks merged", extra={"valid": summary.valid, "error_count": summary.error_count,
                                              "image_count": summary.image_count,
                                              "inventory_digest": summary.inventory_digest})
    record_metrics(summary)
    return summary.model_dump(mode="json")
