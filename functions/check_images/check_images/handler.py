"""Step Functions task (Distributed Map child): check one batch of image files (models.ImageBatchEvent)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from check_images.models import ImageBatchEvent
from check_images.service import check_batch
from d2ops_core.lambda_task import task_handler

logger = Logger()
tracer = Tracer()


@task_handler(ImageBatchEvent, logger, tracer)
def handler(event: ImageBatchEvent, context: LambdaContext) -> dict[str, Any]:
    batch = event.BatchInput
    logger.append_keys(run_id=batch.run_id, dataset=f"s3://{batch.bucket}/{batch.prefix}")
    result = check_batch(event, boto3.client("s3"), os.environ["ARTIFACTS_BUCKET"])
    logger.info("image batch checked", extra={"images": len(result.images), "issues": len(result.issues),
                                              "first": event.Items[0].key})
    return result.model_dump(mode="json")
