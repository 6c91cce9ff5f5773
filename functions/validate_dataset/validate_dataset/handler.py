"""Step Functions task: validate the dataset version named in the event (see models.ValidateDatasetEvent)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core import pipeline_metrics as pm
from d2ops_core.lambda_task import task_handler
from d2ops_core.validation.manifest import StackLimits
from validate_dataset.models import ValidateDatasetEvent, ValidationSummary
from validate_dataset.service import DEFAULT_IMAGE_CHECK_CONCURRENCY, DEFAULT_INLINE_IMAGE_LIMIT, validate_dataset

logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace=pm.NAMESPACE)


def env_int(name: str, default: int) -> int:
    """An integer setting from the environment (template.yaml sets it from a stack parameter)."""
    return int(os.environ.get(name) or default)


def record_metrics(summary: ValidationSummary) -> None:
    """Datasets validated and rejected, their images and instances, and every error code (EMF)."""
    metrics.add_metric(name=pm.DATASETS_VALIDATED, unit=MetricUnit.Count, value=1)
    metrics.add_metric(name=pm.DATASETS_REJECTED, unit=MetricUnit.Count, value=0 if summary.valid else 1)
    splits = {key.rpartition("_")[0] for key in summary.counts if key.endswith("_images")}
    metrics.add_metric(name=pm.IMAGES_VALIDATED, unit=MetricUnit.Count,
                       value=sum(summary.counts.get(f"{s}_images", 0) for s in splits))
    metrics.add_metric(name=pm.INSTANCES_VALIDATED, unit=MetricUnit.Count,
                       value=sum(summary.counts.get(f"{s}_instances", 0) for s in splits))
    for code, count in sorted(summary.error_codes.items()):
        # One EMF document per code: a dimension applies to every metric of its document.
        with single_metric(namespace=pm.NAMESPACE, name=pm.DATASET_ERRORS, unit=MetricUnit.Count,
                           value=count) as metric:
            metric.add_dimension(name=pm.ERROR_CODE, value=code)


@task_handler(ValidateDatasetEvent, logger, tracer, metrics)
def handler(event: ValidateDatasetEvent, context: LambdaContext) -> dict[str, Any]:
    logger.append_keys(run_id=event.run_id, dataset=f"s3://{event.bucket}/{event.prefix}")
    # The stack's gate and training limits (template.yaml): a manifest laxer than these is rejected here.
    summary = validate_dataset(event, boto3.client("s3"), os.environ["ARTIFACTS_BUCKET"],
                               inline_limit=env_int("INLINE_IMAGE_LIMIT", DEFAULT_INLINE_IMAGE_LIMIT),
                               concurrency=env_int("IMAGE_CHECK_CONCURRENCY", DEFAULT_IMAGE_CHECK_CONCURRENCY),
                               progress=logger.info, stack_limits=StackLimits.from_env(os.environ))
    logger.info("dataset validated", extra={"valid": summary.valid, "error_count": summary.error_count,
                                            "warning_count": summary.warning_count, "report_uri": summary.report_uri,
                                            "images_pending": summary.images_pending,
                                            "image_count": summary.image_count})
    if not summary.images_pending:  # a pending summary is counted once, by summarize_images
        record_metrics(summary)
    return summary.model_dump(mode="json")
