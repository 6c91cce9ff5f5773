"""Step Functions task: build the run's training/evaluation job requests (``$.plan``)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from prepare_training.models import PrepareEvent, PrepareSettings
from prepare_training.service import build_plan, current_champion, require_pretrained_weights

logger = Logger()
tracer = Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@event_parser(model=PrepareEvent)
def handler(event: PrepareEvent, context: LambdaContext) -> dict[str, Any]:
    settings = PrepareSettings.from_env(os.environ)
    s3 = boto3.client("s3")
    require_pretrained_weights(s3, settings)
    champion = current_champion(s3, settings.artifacts_bucket)
    plan = build_plan(settings, event, champion)
    logger.info("prepared training job", extra={"run_id": event.run_id, "names": plan.names.model_dump(),
                                                "champion": champion.run_id if champion else None})
    return plan.model_dump(mode="json")
