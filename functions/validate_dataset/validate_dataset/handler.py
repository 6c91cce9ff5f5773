"""Step Functions task: validate the dataset version named in the event (see models.ValidateDatasetEvent)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops.validation import DEFAULT_IMAGE_SAMPLE
from d2ops.validation.manifest import StackLimits
from validate_dataset.models import ValidateDatasetEvent
from validate_dataset.service import validate_dataset

logger = Logger()
tracer = Tracer()


def _image_sample() -> int:
    return max(0, int(os.environ.get("IMAGE_SAMPLE_SIZE", DEFAULT_IMAGE_SAMPLE)))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@event_parser(model=ValidateDatasetEvent)
def handler(event: ValidateDatasetEvent, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(run_id=event.run_id, dataset=f"s3://{event.bucket}/{event.prefix}")
    # The stack's gate and training limits (template.yaml): a manifest laxer than these is rejected here.
    summary = validate_dataset(event, boto3.client("s3"), os.environ["ARTIFACTS_BUCKET"],
                               image_sample=_image_sample(), progress=logger.info,
                               stack_limits=StackLimits.from_env(os.environ))
    logger.info("dataset validated", extra={"valid": summary.valid, "error_count": summary.error_count,
                                            "warning_count": summary.warning_count, "report_uri": summary.report_uri})
    return summary.model_dump(mode="json")
