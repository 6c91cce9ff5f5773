"""Step Functions task ("Wait for review", ``lambda:invoke.waitForTaskToken``): write the run's review request
with its task token and tell people what to decide; the run waits until someone does (or the wait times out)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from request_review.models import RequestReviewEvent
from request_review.service import request_review

logger = Logger()
tracer = Tracer()


@task_handler(RequestReviewEvent, logger, tracer)
def handler(event: RequestReviewEvent, context: LambdaContext) -> dict[str, Any]:
    answer = request_review(event, boto3.client("s3"), boto3.client("sns"), os.environ["ARTIFACTS_BUCKET"],
                            os.environ["NOTIFICATION_TOPIC_ARN"], os.environ["STACK_NAME"])
    # Never the token: it completes the task, and logs are read more widely than the artifacts bucket.
    logger.info("review requested", extra={"run_id": event.run_id, "request_uri": answer.request_uri,
                                           "expires_at": answer.expires_at.isoformat(),
                                           "review_because": event.review_because})
    return answer.model_dump(mode="json")
