"""Step Functions task: the failed run's state document -> the same with a one-line ``failure.cause``.

Lambda errors reach a Catch with the function's stack trace in their Cause; people get the
message alone (the notification, ``GET /runs/{id}``); the trace stays in the function's logs.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from describe_failure.models import FailedRunDocument
from describe_failure.service import describe_failure

logger = Logger()
tracer = Tracer()


@task_handler(FailedRunDocument, logger, tracer)
def handler(event: FailedRunDocument, context: LambdaContext) -> dict[str, Any]:
    # The raw Cause (with any stack trace) is logged here, next to the run id, for whoever debugs it.
    logger.info("run failed", extra={"failure": event.failure.model_dump(),
                                     "error": event.error.model_dump() if event.error else None})
    document = describe_failure(event)
    logger.info("failure described", extra={"cause": document["failure"]["cause"]})
    return document
