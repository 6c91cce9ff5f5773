"""The "Read review decision" Lambda (functions/request_review, request_review.decision): however the review's
wait ended, the run's $.gate says who or what decided, and only a person's approval is Approved. Its
ApprovalDescription fits UpdateModelPackage (botocore's model: 1,024 characters, one line)."""

from __future__ import annotations

import json
import re
from typing import Any

import botocore.session
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops_core import platform
from d2ops_core.bounded_text import utf16_units
from tests.fixtures.pipeline import support

support.function_path("request_review")
from request_review import decision as decision_handler  # noqa: E402
from request_review.models import ReadDecisionEvent  # noqa: E402
from request_review.service import duration_words, read_decision  # noqa: E402

APPROVED = support.load_event("request_review", "read_decision_approved")
TIMED_OUT = support.load_event("request_review", "read_decision_timed_out")
ALICE = APPROVED["review"]["decided_by"]
GATE = APPROVED["gate_reason"]


def read(review: Any, timeout_seconds: int = 604800) -> Any:
    return read_decision(ReadDecisionEvent(run_id=APPROVED["run_id"], review=review, timeout_seconds=timeout_seconds,
                                           gate_reason=GATE))


def test_the_approval_description_s_limits_are_botocore_s() -> None:
    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for("ApprovalDescription")
    assert shape.metadata["max"] == platform.APPROVAL_DESCRIPTION_MAX == 1024
    # Java's '.' matches anything but a line terminator: the pattern asks for one line.
    assert shape.metadata["pattern"] == ".*"
    assert {"\n", "\r", "\u0085", "\u2028", "\u2029"} == platform.JAVA_LINE_TERMINATORS


def test_a_person_s_approval_is_approved_and_says_who_and_why() -> None:
    gate = decision_handler.handler(APPROVED, support.FakeLambdaContext())
    said = f"approved by {ALICE}: {APPROVED['review']['reason']}"
    assert gate == {"decision": "approved", "approval_status": "Approved",
                    "reason": f"{said}; the gate asked for a review: {GATE}", "decided_by": ALICE,
                    "decided_at": "2026-11-23T10:15:00Z", "review_reason": APPROVED["review"]["reason"],
                    "approval_description": said}


def test_a_person_s_rejection_is_rejected_and_says_who_and_why() -> None:
    gate = read({**APPROVED["review"], "decision": "rejected", "reason": "disc is off"})
    assert (gate.decision, gate.approval_status, gate.decided_by) == ("rejected", "Rejected", ALICE)
    assert gate.approval_description == f"rejected by {ALICE}: disc is off"


@pytest.mark.parametrize("error", ["States.Timeout", "States.HeartbeatTimeout"])
def test_nobody_deciding_in_time_is_a_refusal_naming_the_wait(error: str) -> None:
    gate = read({"Error": error, "Cause": None})
    assert (gate.decision, gate.approval_status, gate.decided_by) == ("rejected", "Rejected", None)
    assert gate.approval_description == "rejected: no decision within 7 days"
    assert gate.reason == f"no decision within 7 days: refused; the gate asked for a review: {GATE}"
    assert decision_handler.handler(TIMED_OUT, support.FakeLambdaContext())["approval_status"] == "Rejected"


@pytest.mark.parametrize(("seconds", "words"), [
    (604800, "7 days"), (86400, "1 day"), (7200, "2 hours"), (300, "5 minutes"), (90, "90 seconds")])
def test_the_wait_is_said_in_its_largest_whole_unit(seconds: int, words: str) -> None:
    assert duration_words(seconds) == words
    assert read({"Error": "States.Timeout"}, seconds).approval_description == f"rejected: no decision within {words}"


@pytest.mark.parametrize(("caught", "ended"), [
    # SendTaskFailure, as an operator sends it
    ({"Error": "ReviewWithdrawn", "Cause": "uploaded by mistake"}, "ReviewWithdrawn: uploaded by mistake"),
    # the request Lambda failed past its retries: its message, not its stack trace
    ({"Error": "ClientError", "Cause": json.dumps({"errorMessage": "AccessDenied on PutObject",
                                                   "stackTrace": ["  File x"]})},
     "ClientError: AccessDenied on PutObject"),
    ({"Error": "Quiet"}, "Quiet"),
    ({"Error": None, "Cause": None}, "an error without a name"),  # SendTaskFailure without either
])
def test_a_failed_wait_is_a_refusal_with_its_error(caught: dict[str, Any], ended: str) -> None:
    gate = read(caught)
    assert gate.approval_status == "Rejected" and gate.decided_by is None
    assert gate.approval_description == f"rejected: the review ended without a decision ({ended})"


@pytest.mark.parametrize("answer", [
    {"decision": "approve", "decided_by": ALICE, "reason": "ok", "decided_at": "2026-11-23T10:15:00Z"},
    {"decision": "approved", "reason": "ok", "decided_at": "2026-11-23T10:15:00Z"},
    {"decision": "approved", "decided_by": ALICE, "reason": "ok", "decided_at": "2026-11-23T10:15:00Z",
     "deploy": "anyway"},
    "approved", None, [], {},
])
def test_an_answer_that_is_not_a_decision_never_approves(answer: Any) -> None:
    """SendTaskSuccess takes any JSON from whoever holds the token: only a ReviewDecision that approves deploys.
    Mutation: a lenient read that takes decision 'approve' (the API's verb) or ignores unknown fields."""
    gate = read(answer)
    assert gate.approval_status == "Rejected" and gate.decided_by is None
    assert gate.approval_description.startswith("rejected: the review's answer is not a decision (")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(reason=st.text(min_size=1, max_size=1000).filter(str.strip),
       who=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=2048))
def test_the_approval_description_always_fits_one_line_of_the_registry_s_limit(reason: str, who: str) -> None:
    """Any reason the decision may carry (1-1,000 characters: emoji, line breaks, U+2028) and any decider ARN up
    to 2,048 characters: UpdateModelPackage would refuse the text otherwise, and the run would end
    RegistrationFailed instead of with the person's decision."""
    gate = read({"decision": "rejected", "decided_by": who, "reason": reason, "decided_at": "2026-11-23T10:15:00Z"})
    text = gate.approval_description
    assert utf16_units(text) <= platform.APPROVAL_DESCRIPTION_MAX
    assert not set(text) & platform.JAVA_LINE_TERMINATORS
    assert text.startswith("rejected by ")
    if utf16_units(f"rejected by {who}: {reason}") > platform.APPROVAL_DESCRIPTION_MAX:
        assert re.search(r"\u2026 \(\d+ more characters\)$", text)
    # The whole sentence stays in the run (the failure's cause, the notification).
    assert gate.review_reason == reason and gate.decided_by == who
