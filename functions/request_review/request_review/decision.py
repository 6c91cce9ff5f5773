"""Step Functions task ("Read review decision"): how the review's wait ended -> ``$.gate``, Approved only when
a person approved, with who decided and why (the registry's ApprovalDescription, the champion record)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core.lambda_task import task_handler
from request_review.models import ReadDecisionEvent
from request_review.service import read_decision

logger = Logger()
tracer = Tracer()


@task_handler(ReadDecisionEvent, logger, tracer)
def handler(event: ReadDecisionEvent, context: LambdaContext) -> dict[str, Any]:
    gate = read_decision(event)
    logger.info("review ended", extra={"run_id": event.run_id, "decision": gate.decision,
                                       "decided_by": gate.decided_by, "reason": gate.reason})
    return gate.model_dump(mode="json")
