"""A person decides what the quality gate could not: ask them, then read what they decided.

**Asking** (:func:`request_review`, the "Wait for review" task): the run waits on a task token
(``lambda:invoke.waitForTaskToken``), so the request must carry it to whoever decides. The token goes
into the ReviewRequest at ``runs/<run>/review/request.json`` (the encrypted artifacts bucket, which the
status API's ``POST /runs/{runId}/decision`` reads); the people get one message on the stack's topic
saying what is to be decided, why, until when and how, never the token. The request is a function of
the invocation's input alone (its time is the wait's start, not the clock), so an invocation run twice
with the same token writes the same object; a Step Functions retry brings a new token, and its write
replaces the old one, whose task no longer waits.

**Reading** (:func:`read_decision`, the "Read review decision" task): whatever ended the wait becomes
``$.gate``. Only a ReviewDecision that approves deploys. A rejection, a time-out, a SendTaskFailure, a
failed request or an answer that is not a decision all refuse the model, each saying who or what
decided; the registry's ApprovalDescription is that sentence on one line within SageMaker's limit.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from d2ops_core import failures, s3_layout
from d2ops_core.bounded_text import bounded, sns_subject
from d2ops_core.documents.review import ReviewDecision, ReviewRequest
from d2ops_core.platform import APPROVAL_DESCRIPTION_MAX
from request_review.models import ReadDecisionEvent, RequestAnswer, RequestReviewEvent, ReviewedGate

# What the wait's Catch records when nobody decided in time (a callback task times out with States.Timeout
# whichever of TimeoutSeconds and HeartbeatSeconds ran out; the latter is matched too, should one be set).
TIMEOUT_ERRORS = frozenset({"States.Timeout", "States.HeartbeatTimeout"})
REVIEW_BECAUSE_WORDS = {
    "uncertain": "the interval of challenger - champion reaches below the tolerance",
    "class_dropped": "a class's AP dropped by more than MaxClassRegression",
    "too_few_images": "fewer held-out val images than MinComparedImages were compared",
    "champion_training_unknown": "the champion's training images are unknown, so held-out could not be verified",
}


# ----- asking ---------------------------------------------------------------------------------------------


def review_request(event: RequestReviewEvent) -> ReviewRequest:
    return ReviewRequest(run_id=event.run_id, execution_arn=event.execution_arn, task_token=event.task_token,
                         requested_at=event.requested_at,
                         expires_at=event.requested_at + timedelta(seconds=event.timeout_seconds),
                         model_package_arn=event.model_package_arn, gate_reason=event.gate_reason,
                         review_because=list(event.review_because))


def duration_words(seconds: int) -> str:
    """``604800`` -> ``7 days``: the largest whole unit (days, hours, minutes), else seconds."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} seconds"


def how_to_decide(run_id: str, stack_name: str) -> list[str]:
    """The ways to decide; ``stack_name`` empty: a stack addressed without one (the offline runtime's)."""
    stack = f" --stack {stack_name}" if stack_name else ""
    return [
        f"d2ops approve {run_id} [--reason TEXT]{stack}",
        f"d2ops reject {run_id} --reason TEXT{stack}",
        f"POST /runs/{run_id}/decision on the stack's status API (output StatusApiUrl), signed as a session of "
        "its ReviewerRole (output ReviewerRoleArn): {\"decision\": \"approve\"|\"reject\", \"reason\": TEXT}",
        f"d2ops console{stack}: the run's Review panel, Approve / Reject",
    ]


def announcement(event: RequestReviewEvent, request: ReviewRequest, stack_name: str) -> tuple[str, dict[str, Any]]:
    """The SNS subject and message: what is to be decided, why, until when, and how."""
    dataset = f"{event.dataset.name} {event.dataset.version}"
    days = duration_words(event.timeout_seconds)
    until = request.expires_at.isoformat().replace("+00:00", "Z")
    subject = sns_subject(f"d2ops: review needed: {dataset} (until {request.expires_at:%Y-%m-%d %H:%M} UTC)")
    summary = (f"The quality gate cannot settle whether the model of {dataset} (run {event.run_id}) may replace "
               f"the champion: {event.gate_reason}. Approve or reject it by {until} ({days} after it asked); "
               "without a decision by then the model is refused.")
    message = {
        "event": "review requested",
        "summary": summary,
        "run_id": event.run_id,
        "dataset": {"name": event.dataset.name, "version": event.dataset.version},
        "model_package_arn": event.model_package_arn,
        "gate_reason": event.gate_reason,
        "review_because": list(event.review_because),
        "review_because_words": [REVIEW_BECAUSE_WORDS.get(r, r) for r in event.review_because],
        "images_compared": event.images_compared,
        "requested_at": request.requested_at.isoformat().replace("+00:00", "Z"),
        "expires_at": until,
        "if_nobody_decides": f"refused at expires_at (no decision within {days}: ReviewTimeoutSeconds)",
        "how_to_decide": how_to_decide(event.run_id, stack_name),
    }
    return subject, message


def request_review(event: RequestReviewEvent, s3: Any, sns: Any, bucket: str, topic_arn: str,
                   stack_name: str) -> RequestAnswer:
    """Write the ReviewRequest (with the token), then tell people; the request first, so anyone who acts on
    the message finds the run waiting."""
    request = review_request(event)
    key = s3_layout.review_request_key(event.run_id)
    s3.put_object(Bucket=bucket, Key=key, Body=request.model_dump_json().encode(), ContentType="application/json")
    subject, message = announcement(event, request, stack_name)
    published = sns.publish(TopicArn=topic_arn, Subject=subject, Message=json.dumps(message, ensure_ascii=False))
    return RequestAnswer(request_uri=s3_layout.s3_uri(bucket, key), expires_at=request.expires_at,
                         message_id=str(published["MessageId"]))


# ----- reading --------------------------------------------------------------------------------------------


class CaughtError(BaseModel):
    """What the wait's Catch recorded: the error and its cause (a callback time-out has none)."""

    model_config = ConfigDict(extra="forbid")

    Error: str | None = None
    Cause: str | None = None


def _refused(description: str, reason: str, gate_reason: str) -> ReviewedGate:
    return ReviewedGate(decision="rejected", approval_status="Rejected",
                        reason=f"{reason}: refused; the gate asked for a review: {gate_reason}",
                        approval_description=_registry_text(description))


def _registry_text(text: str) -> str:
    """One line (no line terminator: the API's pattern is Java's .*) within ApprovalDescription's limit."""
    return bounded(failures.one_line(text, limit=len(text) + 1), APPROVAL_DESCRIPTION_MAX)


def read_decision(event: ReadDecisionEvent) -> ReviewedGate:
    """``$.gate`` from how the wait ended."""
    review = event.review
    if isinstance(review, dict) and "Error" in review:
        try:
            caught = CaughtError.model_validate(review)
        except ValidationError:
            caught = CaughtError(Error=str(review.get("Error")))
        if caught.Error in TIMEOUT_ERRORS:
            within = f"no decision within {duration_words(event.timeout_seconds)}"
            return _refused(f"rejected: {within}", within, event.gate_reason)
        why = failures.reason(caught.Cause)
        error = caught.Error or "an error without a name"
        ended = f"the review ended without a decision ({error}{': ' + why if why else ''})"
        return _refused(f"rejected: {ended}", ended, event.gate_reason)
    try:
        decision = ReviewDecision.model_validate(review)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        ended = f"the review's answer is not a decision ({where}: {first['msg']})"
        return _refused(f"rejected: {ended}", ended, event.gate_reason)
    words = failures.one_line(decision.reason, limit=len(decision.reason) + 1)
    said = f"{decision.decision} by {decision.decided_by}: {words}"
    return ReviewedGate(
        decision=decision.decision, approval_status="Approved" if decision.decision == "approved" else "Rejected",
        reason=f"{said}; the gate asked for a review: {event.gate_reason}",
        decided_by=decision.decided_by, decided_at=decision.decided_at.isoformat().replace("+00:00", "Z"),
        review_reason=decision.reason, approval_description=_registry_text(said))
