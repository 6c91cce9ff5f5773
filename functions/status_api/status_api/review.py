"""A person's decision on a run the quality gate sent to review, and the run's view of it.

``POST /runs/{runId}/decision`` (:func:`decide`):

1. Only the stack's reviewer role may decide (``REVIEWER_ROLE_ARN``): the caller API Gateway's IAM
   authorizer saw must be a session of that role (:func:`may_decide`), else 403.
2. The run must be waiting: its ReviewRequest (``runs/<run>/review/request.json``, written by the
   "Wait for review" task with its task token) exists, else 404.
3. A decision already recorded (``runs/<run>/review/decision.json``) answers the request: the same
   caller's same decision again is that decision, 200 (a retry after a lost answer); anything else is
   a 409 naming who decided.
4. ``SendTaskSuccess(taskToken, output=ReviewDecision)``. Step Functions accepts a token once, so of
   two deciders racing past step 3 exactly one wins here; the other is refused (``TaskTimedOut``,
   ``InvalidToken``, ``TaskDoesNotExist``), as is a decision after the wait timed out or the run
   ended. A refused caller learns who won from the record, or, when the winner has not written it
   yet (or failed to), from the execution's history, whose ``TaskSucceeded`` output is the accepted
   decision: 409 naming them (200 when it was this caller's own). Otherwise 409 "no longer waiting".
5. The accepted decision is recorded with ``IfNoneMatch="*"``: written once, never overwritten.

Step Functions is the arbiter, not S3: the record is written only after the token was accepted, so it
never names a decision the run did not receive. A crash between the two leaves the record missing; the
next request (anyone's) finds the decision in the history and writes it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError
from pydantic import ValidationError

from d2ops_core import s3_layout, s3_probe
from d2ops_core.documents.review import ReviewDecision, ReviewRequest, Verdict
from d2ops_core.reviewer import ROLE_ARN, is_session_of
from status_api.models import DecisionRequest, DecisionResponse, ReviewView
from status_api.service import NotFound, execution_history

logger = Logger(child=True)

VERDICTS: dict[str, Verdict] = {"approve": "approved", "reject": "rejected"}
DEFAULT_APPROVAL_REASON = "approved"
# SendTaskSuccess's refusals of a token whose task no longer waits (or never did).
TOKEN_REFUSALS = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
NO_LONGER_WAITING = "the review is no longer waiting (decided, timed out or the run ended)"


class Forbidden(Exception):
    """The caller may not do this: the handler answers 403."""


class Conflict(Exception):
    """The request contradicts what happened already (decided, or no longer waiting): 409."""


class NotWaiting(NotFound):
    """The run has no review request: it is not waiting for a person (404)."""


def caller_arn(event: dict[str, Any]) -> str:
    """The IAM caller API Gateway's AWS_IAM authorizer verified (payload 2.0: requestContext.authorizer.iam)."""
    context = event.get("requestContext")
    authorizer = context.get("authorizer") if isinstance(context, dict) else None
    iam = authorizer.get("iam") if isinstance(authorizer, dict) else None
    arn = iam.get("userArn") if isinstance(iam, dict) else None
    return arn if isinstance(arn, str) else ""


def may_decide(caller: str, reviewer_role_arn: str) -> None:
    """Forbidden unless ``caller`` is a session of the stack's reviewer role (d2ops_core.reviewer)."""
    if not ROLE_ARN.match(reviewer_role_arn):
        raise Forbidden("this stack names no reviewer role (REVIEWER_ROLE_ARN), so nobody may decide reviews")
    if not is_session_of(caller, reviewer_role_arn):
        raise Forbidden(f"only the stack's reviewer role {reviewer_role_arn} may decide reviews; the request was "
                        f"signed by {caller or 'an unknown caller'} (assume the reviewer role: d2ops approve/reject "
                        "--stack does)")


class ReviewUnreadable(NotFound):
    """A review document that is not the document (404 naming it, logged for the operator)."""


def read_request(s3: Any, bucket: str, run_id: str) -> ReviewRequest | None:
    key = s3_layout.review_request_key(run_id)
    data = s3_probe.read_listed(s3, bucket, key)
    if data is None:
        return None
    try:
        request = ReviewRequest.model_validate_json(data)
    except ValidationError as exc:
        logger.error("unreadable review request", extra={"key": key, "error": str(exc)})
        raise ReviewUnreadable(f"run {run_id!r}: its review request s3://{bucket}/{key} cannot be read "
                               f"({exc.error_count()} problem(s), first: {exc.errors()[0]['msg']})") from exc
    if request.run_id != run_id:
        raise ReviewUnreadable(f"run {run_id!r}: its review request s3://{bucket}/{key} names run "
                               f"{request.run_id!r}")
    return request


def read_decision(s3: Any, bucket: str, run_id: str) -> ReviewDecision | None:
    key = s3_layout.review_decision_key(run_id)
    data = s3_probe.read_listed(s3, bucket, key)
    if data is None:
        return None
    try:
        return ReviewDecision.model_validate_json(data)
    except ValidationError as exc:
        logger.error("unreadable review decision", extra={"key": key, "error": str(exc)})
        raise ReviewUnreadable(f"run {run_id!r}: its recorded decision s3://{bucket}/{key} cannot be read") from exc


def decision_in_history(sfn: Any, execution_arn: str) -> ReviewDecision | None:
    """The decision Step Functions accepted for the run: the output of its last ``TaskSucceeded`` event that is
    a ReviewDecision (the callback's output is the task's result). None when there is none (or no execution)."""
    try:
        events = execution_history(sfn, execution_arn)
    except sfn.exceptions.ExecutionDoesNotExist:
        return None
    for event in reversed(events):
        if event.get("type") != "TaskSucceeded":
            continue
        output = (event.get("taskSucceededEventDetails") or {}).get("output")
        if not output:
            continue
        try:
            return ReviewDecision.model_validate_json(output)
        except ValidationError:
            continue
    return None


def _record(s3: Any, bucket: str, run_id: str, decision: ReviewDecision) -> ReviewDecision:
    """Write ``decision`` unless one is recorded; the recorded one either way."""
    key = s3_layout.review_decision_key(run_id)
    body = decision.model_dump_json().encode()
    for _ in range(3):
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*")
            return decision
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "ConditionalRequestConflict":  # a concurrent conditional write to the key: ask again
                continue
            if code != "PreconditionFailed":
                raise
        recorded = read_decision(s3, bucket, run_id)
        if recorded is not None:
            return recorded
    raise Conflict(f"run {run_id!r}: its decision could not be recorded (concurrent writes to "
                   f"s3://{bucket}/{key}); ask again")


def _answer(run_id: str, recorded: ReviewDecision, wanted: ReviewDecision, accepted_now: bool = False
            ) -> DecisionResponse:
    """The answer to ``wanted`` when ``recorded`` is the run's decision."""
    if accepted_now or (recorded.decided_by, recorded.decision) == (wanted.decided_by, wanted.decision):
        return DecisionResponse(run_id=run_id, already_decided=not accepted_now, **recorded.model_dump())
    raise Conflict(f"run {run_id!r} was already decided: {recorded.decision} by {recorded.decided_by} at "
                   f"{recorded.decided_at.isoformat()} ({recorded.reason})")


def decide(sfn: Any, s3: Any, bucket: str, reviewer_role_arn: str, run_id: str, request: DecisionRequest,
           caller: str, now: datetime | None = None) -> DecisionResponse:
    """``POST /runs/{runId}/decision`` (the module's docstring says how it decides and why)."""
    may_decide(caller, reviewer_role_arn)
    waiting = read_request(s3, bucket, run_id)
    if waiting is None:
        raise NotWaiting(f"run {run_id!r} is not waiting for a review (it has no review request: only a run the "
                         "quality gate sent to review waits for a person)")
    wanted = ReviewDecision(decision=VERDICTS[request.decision], decided_by=caller,
                            reason=request.reason or DEFAULT_APPROVAL_REASON, decided_at=now or datetime.now(UTC))
    recorded = read_decision(s3, bucket, run_id)
    if recorded is not None:
        return _answer(run_id, recorded, wanted)
    try:
        sfn.send_task_success(taskToken=waiting.task_token, output=wanted.model_dump_json())
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code not in TOKEN_REFUSALS:
            raise
        recorded = read_decision(s3, bucket, run_id)
        if recorded is None:  # the winner has not recorded it (yet): the run's history has what it accepted
            accepted = decision_in_history(sfn, waiting.execution_arn)
            if accepted is None:
                raise Conflict(f"run {run_id!r}: {NO_LONGER_WAITING}; Step Functions answered {code}") from exc
            recorded = _record(s3, bucket, run_id, accepted)
        return _answer(run_id, recorded, wanted)
    logger.info("review decided", extra={"run_id": run_id, "decision": wanted.decision, "decided_by": caller})
    recorded = _record(s3, bucket, run_id, wanted)
    if recorded.model_dump() != wanted.model_dump():  # cannot happen: only an accepted decision is recorded
        logger.error("the recorded decision is not the one Step Functions accepted",
                     extra={"run_id": run_id, "recorded": recorded.model_dump(mode="json")})
    return _answer(run_id, wanted, wanted, accepted_now=True)


# ----- the run's view (GET /runs/{runId}) -----------------------------------------------------------------
def _access_denied(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in {"AccessDenied", "403"}


def review_view(s3: Any, bucket: str | None, run_id: str, document: dict[str, Any], status: str) -> ReviewView | None:
    """The review of a run the gate sent to one (None for others): its request and decision from S3, the run's
    own ``$.review`` when the record is missing. S3 refusing the API its documents leaves them out (logged)."""
    found = document.get("evaluation")
    evaluation: dict[str, Any] = found if isinstance(found, dict) else {}
    if evaluation.get("decision") != "review":
        return None
    view = ReviewView(status="requested", gate_reason=evaluation.get("gate_reason"),
                      review_because=[str(r) for r in evaluation.get("review_because") or []],
                      images_compared=evaluation.get("images_compared"),
                      images_excluded=evaluation.get("images_excluded"))
    request = decision = None
    if bucket and s3 is not None:
        try:
            request = read_request(s3, bucket, run_id)
            decision = read_decision(s3, bucket, run_id)
        except ReviewUnreadable as exc:
            logger.warning("review documents left out", extra={"run_id": run_id, "reason": str(exc)})
        except ClientError as exc:
            if not _access_denied(exc):
                raise
            logger.warning("S3 refused the status API the review documents: check its policy in template.yaml",
                           extra={"run_id": run_id, "error": str(exc)})
    if decision is None and isinstance(document.get("review"), dict):
        try:
            decision = ReviewDecision.model_validate(document["review"])
        except ValidationError:
            decision = None
    if request is not None:
        view.requested_at, view.expires_at = request.requested_at, request.expires_at
        view.model_package_arn = request.model_package_arn
        view.gate_reason, view.review_because = request.gate_reason, list(request.review_because)
        view.status = "waiting" if status == "RUNNING" else "not decided"
    elif status != "RUNNING":
        view.status = "not decided"
    if decision is not None:
        view.status = decision.decision
        view.decided_by, view.reason, view.decided_at = decision.decided_by, decision.reason, decision.decided_at
    return view
