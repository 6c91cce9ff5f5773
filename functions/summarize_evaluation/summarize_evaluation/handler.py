"""Step Functions task: evaluation.json -> the named numbers the quality gate compares."""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from summarize_evaluation.models import SummarizeEvent
from summarize_evaluation.service import read_report, summarize

logger = Logger()
tracer = Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@event_parser(model=SummarizeEvent)
def handler(event: SummarizeEvent, context: LambdaContext) -> dict[str, Any]:
    summary = summarize(read_report(boto3.client("s3"), event.report_uri), event)
    logger.info("evaluation summary", extra=summary.model_dump(exclude={"challenger_metrics"}))
    return summary.model_dump(mode="json")
