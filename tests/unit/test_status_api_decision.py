"""POST /runs/{runId}/decision: a person decides a run the quality gate sent to review.

Through the real handler (Powertools resolver, pydantic body, exception handlers) against moto's S3. Step
Functions' SendTaskSuccess is :class:`TaskTokens` below, for that call only (moto's SendTaskSuccess accepts
anything and records nothing): a token completes its task once, and is refused afterwards with the
service's ``TaskTimedOut``, an unknown one with ``InvalidToken``; an accepted output becomes the
execution history's ``TaskSucceeded`` event, as it does in the service.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from d2ops_core.documents.review import ReviewDecision, ReviewRequest
from d2ops_core.reviewer import is_session_of, session_name_for
from d2ops_core.s3_layout import review_decision_key, review_request_key
from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import handler as api  # noqa: E402
from status_api import service  # noqa: E402

ACCOUNT, BUCKET = support.ACCOUNT, support.ARTIFACTS_BUCKET
REVIEWER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/d2ops-ReviewerRole-ABC123"
ALICE = f"arn:aws:sts::{ACCOUNT}:assumed-role/d2ops-ReviewerRole-ABC123/alice"
BOB = f"arn:aws:sts::{ACCOUNT}:assumed-role/d2ops-ReviewerRole-ABC123/bob"
RUN = "shapes_v2_0123456789abcdef"
EXECUTION = f"arn:aws:states:{support.REGION}:{ACCOUNT}:execution:training_pipeline:{RUN}"
SFN_EXCEPTIONS = boto3.client("stepfunctions", region_name=support.REGION).exceptions


class TaskTokens:
    """SendTaskSuccess as Step Functions answers it (single-use tokens), and the history it leaves."""

    def __init__(self) -> None:
        self.exceptions = SFN_EXCEPTIONS
        self.lock = threading.Lock()
        self.waiting: dict[str, str] = {}  # token -> execution ARN
        self.closed: set[str] = set()
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.outputs: list[str] = []
        self.refuse_with: str | None = None  # the next call's refusal (a timed-out wait, an ended run)
        self.before_answer: threading.Barrier | None = None  # holds racing callers until all have arrived

    def open(self, token: str, execution_arn: str) -> None:
        self.waiting[token] = execution_arn
        self.history.setdefault(execution_arn, [])

    @staticmethod
    def _refusal(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": f"{code} (test)"},
                            "ResponseMetadata": {"HTTPStatusCode": 400}}, "SendTaskSuccess")

    def send_task_success(self, taskToken: str, output: str) -> dict[str, Any]:
        if self.before_answer is not None:
            self.before_answer.wait(timeout=10)
        with self.lock:
            if self.refuse_with:
                raise self._refusal(self.refuse_with)
            if taskToken not in self.waiting:
                raise self._refusal("TaskTimedOut" if taskToken in self.closed else "InvalidToken")
            arn = self.waiting.pop(taskToken)
            self.outputs.append(output)
            self.history[arn].append({"type": "TaskSucceeded", "id": len(self.history[arn]) + 1,
                                      "taskSucceededEventDetails": {"resourceType": "lambda",
                                                                    "resource": "invoke.waitForTaskToken",
                                                                    "output": output}})
            self.closed.add(taskToken)
            return {}

    def get_execution_history(self, executionArn: str, **kwargs: Any) -> dict[str, Any]:
        if executionArn not in self.history:
            raise self.exceptions.ExecutionDoesNotExist({"Error": {"Code": "ExecutionDoesNotExist"}}, "History")
        return {"events": list(self.history[executionArn])}


def review_request(run_id: str = RUN, token: str = "token-of-the-wait") -> ReviewRequest:
    now = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
    return ReviewRequest(run_id=run_id, execution_arn=EXECUTION, task_token=token, requested_at=now,
                         expires_at=now + timedelta(days=7),
                         model_package_arn=f"arn:aws:sagemaker:{support.REGION}:{ACCOUNT}:model-package/d2ops/3",
                         gate_reason="needs a person's review: the interval reaches below -0.03",
                         review_because=["uncertain"])


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    support.aws_env(monkeypatch)
    monkeypatch.setenv("ARTIFACTS_BUCKET", BUCKET)
    monkeypatch.setenv("REVIEWER_ROLE_ARN", REVIEWER_ROLE)
    monkeypatch.setenv("STATE_MACHINE_ARN", support.STATE_MACHINE_ARN)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        tokens = TaskTokens()
        clients = {"s3": s3, "stepfunctions": tokens}
        monkeypatch.setattr(api.clients, "client", lambda name: clients[name])
        yield {"s3": s3, "sfn": tokens}


def waiting(aws: dict[str, Any], run_id: str = RUN, token: str = "token-of-the-wait") -> ReviewRequest:
    """The run waits: its request written (as the Wait for review task's Lambda writes it), its token open."""
    request = review_request(run_id, token)
    aws["s3"].put_object(Bucket=BUCKET, Key=review_request_key(run_id), Body=request.model_dump_json().encode())
    aws["sfn"].open(token, request.execution_arn)
    return request


def post(body: Any, caller: str = ALICE, run_id: str = RUN, raw: bool = False) -> tuple[int, dict[str, Any]]:
    event = copy.deepcopy(support.load_event("status_api", "decide_review"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/runs/{run_id}/decision"
    event["pathParameters"] = {"runId": run_id}
    event["requestContext"]["authorizer"]["iam"]["userArn"] = caller
    event["body"] = body if raw else json.dumps(body)
    response = api.handler(event, support.FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"])


def recorded(aws: dict[str, Any], run_id: str = RUN) -> ReviewDecision | None:
    try:
        body = aws["s3"].get_object(Bucket=BUCKET, Key=review_decision_key(run_id))["Body"].read()
    except aws["s3"].exceptions.NoSuchKey:
        return None
    return ReviewDecision.model_validate_json(body)


# ---------------------------------------------------------------- deciding

def test_approve_completes_the_wait_with_the_decision_and_records_it(aws: dict[str, Any]) -> None:
    waiting(aws)
    status, body = post({"decision": "approve"})
    assert status == 200, body
    assert (body["decision"], body["decided_by"], body["reason"]) == ("approved", ALICE, "approved")
    assert body["run_id"] == RUN and body["already_decided"] is False
    # the callback's output is the ReviewDecision the run and the registry entry record: who, why, when
    [output] = aws["sfn"].outputs
    sent = ReviewDecision.model_validate_json(output)
    assert sent == recorded(aws) == ReviewDecision.model_validate(
        {k: body[k] for k in ("decision", "decided_by", "reason", "decided_at")})
    assert abs((sent.decided_at - datetime.now(UTC)).total_seconds()) < 60


def test_reject_sends_the_reason(aws: dict[str, Any]) -> None:
    waiting(aws)
    status, body = post({"decision": "reject", "reason": "  the rare class 'disc' is gone  "}, caller=BOB)
    assert status == 200, body
    assert (body["decision"], body["decided_by"], body["reason"]) == ("rejected", BOB, "the rare class 'disc' is gone")
    assert json.loads(aws["sfn"].outputs[0])["reason"] == "the rare class 'disc' is gone"


@pytest.mark.parametrize(("body", "says"), [
    ({"decision": "reject"}, "a rejection needs a reason"),
    ({"decision": "reject", "reason": "   "}, "blank"),
    ({"decision": "reject", "reason": "two\nlines"}, "one line"),
    ({"decision": "reject", "reason": "hidden \u202e override"}, "one line"),
    ({"decision": "reject", "reason": "x" * 1001}, "reason"),
    ({"decision": "approve", "reason": ""}, "reason"),
    ({"decision": "approved"}, "decision"),
    ({"decision": "approve", "reasn": "typo"}, "reasn"),
    ({"reason": "no decision"}, "decision"),
    ([], "request body"),
])
def test_a_bad_body_is_a_400_naming_the_problem_and_decides_nothing(aws: dict[str, Any], body: Any,
                                                                    says: str) -> None:
    waiting(aws)
    status, answer = post(body)
    assert status == 400, answer
    assert says in answer["message"] and "\n" not in answer["message"]
    assert aws["sfn"].outputs == [] and recorded(aws) is None


def test_a_reason_of_the_maximum_length_is_taken_whole(aws: dict[str, Any]) -> None:
    waiting(aws)
    status, body = post({"decision": "reject", "reason": "é" * 1000})
    assert status == 200 and body["reason"] == "é" * 1000


@pytest.mark.parametrize("caller", [
    f"arn:aws:iam::{ACCOUNT}:user/ops",  # a user, however powerful
    f"arn:aws:sts::{ACCOUNT}:assumed-role/d2ops-PipelineRole/alice",  # another role of the account
    f"arn:aws:sts::{ACCOUNT}:assumed-role/d2ops-ReviewerRole-ABC1234/alice",  # a name the reviewer's prefixes
    "arn:aws:sts::210987654321:assumed-role/d2ops-ReviewerRole-ABC123/alice",  # the same name, another account
    f"arn:aws-cn:sts::{ACCOUNT}:assumed-role/d2ops-ReviewerRole-ABC123/alice",  # another partition
    f"arn:aws:iam::{ACCOUNT}:role/d2ops-ReviewerRole-ABC123",  # the role itself signs nothing
    f"arn:aws:sts::{ACCOUNT}:federated-user/alice",
    "",
])
def test_only_a_session_of_the_reviewer_role_may_decide(aws: dict[str, Any], caller: str) -> None:
    waiting(aws)
    status, body = post({"decision": "approve"}, caller=caller)
    assert status == 403, body
    assert REVIEWER_ROLE in body["message"] and (caller or "unknown caller") in body["message"]
    assert aws["sfn"].outputs == [] and recorded(aws) is None


def test_an_outsider_learns_nothing_about_the_run(aws: dict[str, Any]) -> None:
    """403 comes before 404: whether a run waits is not answered to a caller who may not decide it."""
    status, _ = post({"decision": "approve"}, caller=f"arn:aws:iam::{ACCOUNT}:user/ops", run_id="no_such_run")
    assert status == 403


@pytest.mark.parametrize(("role", "caller", "allowed"), [
    (f"arn:aws:iam::{ACCOUNT}:role/team/reviewers/Reviewer", f"arn:aws:sts::{ACCOUNT}:assumed-role/Reviewer/a.b@c",
     True),  # a role with a path: its sessions name the role without it
    (f"arn:aws-us-gov:iam::{ACCOUNT}:role/Reviewer", f"arn:aws-us-gov:sts::{ACCOUNT}:assumed-role/Reviewer/ann",
     True),
    (f"arn:aws-us-gov:iam::{ACCOUNT}:role/Reviewer", f"arn:aws:sts::{ACCOUNT}:assumed-role/Reviewer/ann", False),
    (f"arn:aws:iam::{ACCOUNT}:role/Reviewer", f"arn:aws:sts::{ACCOUNT}:assumed-role/reviewer/ann", False),
    (f"arn:aws:iam::{ACCOUNT}:role/Reviewer", f"arn:aws:sts::{ACCOUNT}:assumed-role/Reviewer/ann/extra", False),
    ("", f"arn:aws:sts::{ACCOUNT}:assumed-role/Reviewer/ann", False),
])
def test_the_reviewer_comparison_is_partition_account_and_role_name(role: str, caller: str, allowed: bool) -> None:
    assert is_session_of(caller, role) is allowed


@pytest.mark.parametrize(("caller", "session"), [
    (f"arn:aws:iam::{ACCOUNT}:user/alice", "alice"), (f"arn:aws:iam::{ACCOUNT}:user/team/bob.b@x.org", "bob.b@x.org"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Admin_0a1b/carol@example.com", "carol@example.com"),
    (f"arn:aws:iam::{ACCOUNT}:root", "root"), (f"arn:aws:iam::{ACCOUNT}:user/x", "d2ops-reviewer"),
    (f"arn:aws:iam::{ACCOUNT}:user/déjà vu", "d-j--vu"), ("not an arn", "d2ops-reviewer"),
])
def test_the_session_name_says_who_assumed_the_role(caller: str, session: str) -> None:
    assert session_name_for(caller) == session


def test_without_a_reviewer_role_nobody_may_decide(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    waiting(aws)
    monkeypatch.delenv("REVIEWER_ROLE_ARN")
    status, body = post({"decision": "approve"})
    assert status == 403 and "names no reviewer role" in body["message"]


def test_a_run_that_is_not_waiting_is_a_404(aws: dict[str, Any]) -> None:
    status, body = post({"decision": "approve"})
    assert status == 404 and f"run {RUN!r} is not waiting for a review" in body["message"]
    assert post({"decision": "approve"}, run_id="bad id!")[0] == 404  # not even a run id
    assert aws["sfn"].outputs == []


def test_a_second_decision_is_a_409_naming_the_first_decider(aws: dict[str, Any]) -> None:
    waiting(aws)
    assert post({"decision": "approve", "reason": "looks fine"})[0] == 200
    status, body = post({"decision": "reject", "reason": "too risky"}, caller=BOB)
    assert status == 409
    assert f"already decided: approved by {ALICE}" in body["message"] and "looks fine" in body["message"]
    # the first decider changing their mind is a second decision too
    status, body = post({"decision": "reject", "reason": "on second thoughts"})
    assert status == 409 and ALICE in body["message"]
    assert len(aws["sfn"].outputs) == 1 and recorded(aws).decision == "approved"


def test_the_same_decision_again_by_the_same_caller_is_answered_as_recorded(aws: dict[str, Any]) -> None:
    """A retry after a lost answer: 200 with the decision recorded the first time, nothing sent again."""
    waiting(aws)
    status, first = post({"decision": "reject", "reason": "drops the rare class"})
    status_again, again = post({"decision": "reject", "reason": "drops the rare class"})
    assert (status, status_again) == (200, 200)
    assert again["already_decided"] is True and first["already_decided"] is False
    assert {k: again[k] for k in ("decision", "decided_by", "reason", "decided_at")} == {
        k: first[k] for k in ("decision", "decided_by", "reason", "decided_at")}
    assert len(aws["sfn"].outputs) == 1


@pytest.mark.parametrize("code", ["TaskTimedOut", "InvalidToken", "TaskDoesNotExist"])
def test_a_refused_token_is_a_409_no_longer_waiting(aws: dict[str, Any], code: str) -> None:
    """The wait timed out, or the run ended (stopped, failed elsewhere): the request is still there, the token
    no longer works, and nobody decided."""
    waiting(aws)
    aws["sfn"].refuse_with = code
    status, body = post({"decision": "approve"})
    assert status == 409
    assert body["message"] == (f"run {RUN!r}: the review is no longer waiting (decided, timed out or the run ended); "
                               f"Step Functions answered {code}")
    assert recorded(aws) is None


def test_other_step_functions_errors_are_not_a_409(aws: dict[str, Any]) -> None:
    waiting(aws)
    aws["sfn"].refuse_with = "ThrottlingException"
    status, _ = post({"decision": "approve"})
    assert status == 503 and recorded(aws) is None


def test_two_deciders_at_once_one_wins_and_the_other_is_told_who(aws: dict[str, Any]) -> None:
    """Both pass the check for a recorded decision before either sends: Step Functions accepts one token
    once, so exactly one decision reaches the run and is recorded; the other caller gets a 409 naming it."""
    waiting(aws)
    aws["sfn"].before_answer = threading.Barrier(2)
    answers: dict[str, tuple[int, dict[str, Any]]] = {}

    def decide(who: str, body: dict[str, str]) -> None:
        answers[who] = post(body, caller=who)

    threads = [threading.Thread(target=decide, args=(ALICE, {"decision": "approve"})),
               threading.Thread(target=decide, args=(BOB, {"decision": "reject", "reason": "no"}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    statuses = sorted(status for status, _ in answers.values())
    assert statuses == [200, 409], answers
    winner = next(who for who, (status, _) in answers.items() if status == 200)
    loser = next(who for who in answers if who != winner)
    [sent] = aws["sfn"].outputs
    assert ReviewDecision.model_validate_json(sent).decided_by == winner
    assert recorded(aws).decided_by == winner
    assert f"by {winner}" in answers[loser][1]["message"]


def test_a_decision_accepted_but_never_recorded_is_found_in_the_run_s_history(aws: dict[str, Any]) -> None:
    """The decider's Lambda stopped between SendTaskSuccess and the record: the run got the decision, S3 has
    none. The same caller asking again gets it (200, recorded now); anyone else a 409 naming them."""
    request = waiting(aws)
    accepted = ReviewDecision(decision="approved", decided_by=ALICE, reason="approved",
                              decided_at=datetime(2026, 11, 22, 9, 0, tzinfo=UTC))
    aws["sfn"].send_task_success(taskToken=request.task_token, output=accepted.model_dump_json())
    status, body = post({"decision": "reject", "reason": "no"}, caller=BOB)
    assert status == 409 and f"approved by {ALICE} at 2026-11-22T09:00:00+00:00" in body["message"]
    assert recorded(aws) == accepted  # repaired from the history
    status, body = post({"decision": "approve"})
    assert status == 200 and body["already_decided"] is True and body["decided_at"] == "2026-11-22T09:00:00Z"


def test_an_unreadable_review_request_is_a_404_naming_it(aws: dict[str, Any]) -> None:
    aws["s3"].put_object(Bucket=BUCKET, Key=review_request_key(RUN), Body=b'{"run_id": "x"}')
    status, body = post({"decision": "approve"})
    assert status == 404 and "review request" in body["message"] and "cannot be read" in body["message"]
    other = review_request("other_run").model_dump_json().encode()
    aws["s3"].put_object(Bucket=BUCKET, Key=review_request_key(RUN), Body=other)
    status, body = post({"decision": "approve"})
    assert status == 404 and "names run 'other_run'" in body["message"]
    assert aws["sfn"].outputs == []


# ---------------------------------------------------------------- hostile bodies

def test_a_huge_body_is_refused_before_it_is_read(aws: dict[str, Any]) -> None:
    waiting(aws)
    status, body = post('{"decision": "reject", "reason": "' + "x" * 200_000 + '"}', raw=True)
    assert status == 413 and "at most" in body["message"]
    status, body = post("[" * 20_000 + "]" * 20_000, raw=True)
    assert status == 400 and "nest too deeply" in body["message"]
    assert aws["sfn"].outputs == []


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                               max_size=4), max_leaves=12)
BODY = st.one_of(
    st.fixed_dictionaries({"decision": st.sampled_from(["approve", "reject", "Approve", "", "x"])},
                          optional={"reason": st.one_of(st.text(max_size=1100), st.integers(), st.none()),
                                    "extra": JSON}).map(json.dumps),
    JSON.map(json.dumps), st.text(max_size=200))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODY)
def test_no_body_makes_a_5xx_or_a_traceback(aws: dict[str, Any], body: str) -> None:
    status, answer = post(body, raw=True, run_id="no_such_run")  # nothing waits: no decision is ever taken
    assert status in (400, 404), (status, answer)
    assert "Traceback" not in answer["message"] and "\n" not in answer["message"]


# ---------------------------------------------------------------- the run's view

class OneExecution:
    """DescribeExecution / GetExecutionHistory of one run whose document is ``document``."""

    exceptions = SFN_EXCEPTIONS

    def __init__(self, document: dict[str, Any], status: str = "RUNNING") -> None:
        self.document, self.status = document, status

    def describe_execution(self, executionArn: str) -> dict[str, Any]:
        return {"executionArn": executionArn, "status": self.status, "input": json.dumps(self.document),
                "startDate": datetime(2026, 11, 22, 7, 0, tzinfo=UTC)}

    def get_execution_history(self, **kwargs: Any) -> dict[str, Any]:
        return {"events": []}


GATE_SAID_REVIEW = {"evaluation": {"decision": "review", "review_because": ["uncertain", "too_few_images"],
                                   "images_compared": 40, "images_excluded": 3, "gate_reason": "the gate's words"}}


def run_view(aws: dict[str, Any], document: dict[str, Any], status: str = "RUNNING") -> Any:
    return service.get_run(OneExecution(document, status), None, support.STATE_MACHINE_ARN, RUN, s3=aws["s3"],
                           artifacts_bucket=BUCKET).review


def test_the_run_shows_the_review_it_waits_for_then_who_decided(aws: dict[str, Any]) -> None:
    assert run_view(aws, {"evaluation": {"decision": "approve"}}) is None  # no review, no S3 read
    view = run_view(aws, GATE_SAID_REVIEW)
    assert view.status == "requested" and view.images_compared == 40 and view.images_excluded == 3
    assert view.review_because == ["uncertain", "too_few_images"] and view.gate_reason == "the gate's words"
    request = waiting(aws)
    view = run_view(aws, GATE_SAID_REVIEW)
    assert view.status == "waiting" and (view.requested_at, view.expires_at) == (request.requested_at,
                                                                                 request.expires_at)
    assert view.gate_reason == request.gate_reason and view.model_package_arn == request.model_package_arn
    assert "task_token" not in view.model_dump() and request.task_token not in view.model_dump_json()
    assert post({"decision": "reject", "reason": "drops disc"})[0] == 200
    view = run_view(aws, GATE_SAID_REVIEW)
    assert (view.status, view.decided_by, view.reason) == ("rejected", ALICE, "drops disc")
    assert view.decided_at is not None


def test_a_wait_that_ended_undecided_says_so(aws: dict[str, Any]) -> None:
    waiting(aws)
    assert run_view(aws, GATE_SAID_REVIEW, status="FAILED").status == "not decided"
    assert run_view(aws, GATE_SAID_REVIEW, status="ABORTED").status == "not decided"


def test_the_run_s_own_review_section_stands_in_for_a_missing_record(aws: dict[str, Any]) -> None:
    decision = ReviewDecision(decision="approved", decided_by=BOB, reason="ok", decided_at=datetime.now(UTC))
    document = {**GATE_SAID_REVIEW, "review": decision.model_dump(mode="json")}
    view = run_view(aws, document, status="SUCCEEDED")
    assert (view.status, view.decided_by) == ("approved", BOB)
