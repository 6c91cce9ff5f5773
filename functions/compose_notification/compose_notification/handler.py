"""Step Functions task: the run's notification subject and cost fields (merged into the SNS message)."""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from compose_notification.models import NotificationEvent
from compose_notification.service import compose
from d2ops_core.lambda_task import task_handler

logger = Logger()
tracer = Tracer()


@task_handler(NotificationEvent, logger, tracer)
def handler(event: NotificationEvent, context: LambdaContext) -> dict[str, Any]:
    notification = compose(event, boto3.client("sagemaker"))
    if notification.fields.cost_unknown:
        logger.warning("run cost unknown", extra={"run_id": event.run_id, "why": notification.fields.cost_unknown})
    logger.info("notification composed", extra={"run_id": event.run_id, "subject": notification.subject})
    return notification.payload()
