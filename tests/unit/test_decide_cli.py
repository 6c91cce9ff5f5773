"""``d2ops approve`` / ``d2ops reject``: the exit codes and lines for each answer of the status API, and how
``--stack`` becomes a reviewer (CloudFormation and STS stubbed; the offline end to end is
tests/integration/test_offline_review_decision.py)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from d2ops import cli
from d2ops.commands import decide
from d2ops.commands.errors import UsageError
from d2ops.sigv4 import StatusApiError

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/d2ops-ReviewerRole-ABC"
URL = "https://abc123.execute-api.us-east-1.amazonaws.com"
ANSWER = {"run_id": "shapes_v2_abc", "decision": "approved", "decided_by": f"arn:aws:sts::{ACCOUNT}:assumed-role/"
          "d2ops-ReviewerRole-ABC/alice", "reason": "approved", "decided_at": "2026-11-22T09:00:00Z",
          "already_decided": False}


class FakeApi:
    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, []

    def call(self, method: str, path: str, document: Any = None) -> Any:
        self.calls.append((method, path, document))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi(ANSWER)
    monkeypatch.setattr(decide, "_offline_api", lambda work_dir: fake)
    return fake


def test_approve_posts_the_decision_and_prints_who_decided(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["approve", "shapes_v2_abc"]) == 0
    assert api.calls == [("POST", "/runs/shapes_v2_abc/decision", {"decision": "approve"})]
    assert capsys.readouterr().out == (f"run shapes_v2_abc approved by {ANSWER['decided_by']} at "
                                       "2026-11-22T09:00:00Z: approved\n")
    assert cli.main(["reject", "shapes_v2_abc", "--reason", "  drops a class  "]) == 0
    assert api.calls[-1][2] == {"decision": "reject", "reason": "drops a class"}


@pytest.mark.parametrize(("answer", "code", "says"), [
    (StatusApiError(403, "only the stack's reviewer role may decide"), 1, "only the stack's reviewer role"),
    (StatusApiError(404, "run 'x' is not waiting for a review"), 1, "not waiting"),
    (StatusApiError(409, "run 'x' was already decided: approved by bob"), 1, "approved by bob"),
    (StatusApiError(503, "busy; retry later"), 1, "HTTP 503"),
    (ConnectionRefusedError(111, "Connection refused"), 1, "cannot be reached"),
    (StatusApiError(400, "request body 'reason': too long"), 2, "refused the request"),
])
def test_each_refusal_is_one_line_with_its_exit_code(api: FakeApi, capsys: pytest.CaptureFixture[str],
                                                     answer: BaseException, code: int, says: str) -> None:
    api.answer = answer
    if code == 2:  # usage: the parser's exit
        with pytest.raises(SystemExit) as exited:
            cli.main(["approve", "shapes_v2_abc"])
        assert exited.value.code == 2
    else:
        assert cli.main(["approve", "shapes_v2_abc"]) == code
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_repeated_decision_says_it_was_recorded_before(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = {**ANSWER, "already_decided": True}
    assert cli.main(["approve", "shapes_v2_abc"]) == 0
    assert "recorded before" in capsys.readouterr().out


# ---------------------------------------------------------------- --stack: becoming a reviewer

def session(monkeypatch: pytest.MonkeyPatch, caller: str, outputs: dict[str, str],
            assumed: dict[str, Any] | Exception | None = None) -> tuple[Any, list[Stubber]]:
    for key, value in {"AWS_ACCESS_KEY_ID": "AKIAME", "AWS_SECRET_ACCESS_KEY": "secret"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    real = boto3.session.Session(region_name="us-east-1")
    cfn, sts = real.client("cloudformation"), real.client("sts")
    stubs = [Stubber(cfn), Stubber(sts)]
    stubs[0].add_response("describe_stacks", {"Stacks": [{
        "StackName": "d2ops", "CreationTime": "2026-01-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]}]}, {"StackName": "d2ops"})
    if outputs.get("ReviewerRoleArn"):
        stubs[1].add_response("get_caller_identity", {"Arn": caller, "Account": ACCOUNT, "UserId": "AIDA"})
    if isinstance(assumed, Exception):
        stubs[1].add_client_error("assume_role", "AccessDenied", str(assumed), 403)
    elif assumed is not None:
        stubs[1].add_response("assume_role", {"Credentials": assumed}, {
            "RoleArn": ROLE, "RoleSessionName": "alice", "DurationSeconds": 900})
    for stub in stubs:
        stub.activate()
    monkeypatch.setattr(real, "client", lambda name, **kw: {"cloudformation": cfn, "sts": sts}[name])
    return real, stubs


CREDENTIALS = {"AccessKeyId": "ASIAREVIEWEREXAMPLE", "SecretAccessKey": "s" * 40, "SessionToken": "token",
               "Expiration": "2026-11-22T10:00:00Z"}
OUTPUTS = {"StatusApiUrl": URL, "ReviewerRoleArn": ROLE}


def test_a_caller_outside_the_role_assumes_it_under_their_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    real, stubs = session(monkeypatch, f"arn:aws:iam::{ACCOUNT}:user/alice", OUTPUTS, CREDENTIALS)
    api = decide.reviewer_api(real, "d2ops")
    assert api.base_url == URL and api.credentials.access_key == "ASIAREVIEWEREXAMPLE" and api.region == "us-east-1"
    for stub in stubs:
        stub.assert_no_pending_responses()


def test_a_caller_already_in_the_role_signs_as_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    real, stubs = session(monkeypatch, f"arn:aws:sts::{ACCOUNT}:assumed-role/d2ops-ReviewerRole-ABC/alice", OUTPUTS)
    api = decide.reviewer_api(real, "d2ops")
    assert api.credentials.access_key == "AKIAME"  # no AssumeRole (the stub would have had to answer it)
    for stub in stubs:
        stub.assert_no_pending_responses()


def test_a_caller_who_may_not_assume_the_role_is_told_who_decides_who_may(monkeypatch: pytest.MonkeyPatch) -> None:
    real, _ = session(monkeypatch, f"arn:aws:iam::{ACCOUNT}:user/alice", OUTPUTS, RuntimeError("not authorized"))
    with pytest.raises(decide.DecisionRefused) as refused:
        decide.reviewer_api(real, "d2ops")
    message = str(refused.value)
    assert f"user/alice may not assume the reviewer role {ROLE}" in message and "ReviewerPrincipals" in message


def test_a_stack_without_a_reviewer_role_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real, _ = session(monkeypatch, f"arn:aws:iam::{ACCOUNT}:user/alice", {"StatusApiUrl": URL})
    with pytest.raises(UsageError, match="no StatusApiUrl and ReviewerRoleArn outputs"):
        decide.reviewer_api(real, "d2ops")


def test_d2ops_status_says_how_to_decide_a_waiting_run_and_who_decided() -> None:
    from d2ops.commands.status import format_run

    def lines(review: dict[str, Any]) -> list[str]:
        return [line for line in format_run({"run_id": "shapes_v2_abc", "status": "RUNNING", "timeline": [],
                                             "review": review}) if "review" in line or "decide" in line]

    waiting = lines({"status": "waiting", "requested_at": "2026-11-22T08:00:00Z", "expires_at": "2026-11-29T08:00:00Z"})
    assert waiting == ["  review    waiting since 2026-11-22T08:00:00Z; refused unless decided by 2026-11-29T08:00:00Z",
                       "    decide: d2ops approve shapes_v2_abc [--reason TEXT]  |  d2ops reject shapes_v2_abc "
                       "--reason TEXT"]
    decided = lines({"status": "rejected", "decided_by": "arn:aws:sts::1:assumed-role/R/alice", "reason": "drops disc",
                     "decided_at": "2026-11-22T09:00:00Z"})
    assert decided == ["  review    rejected by arn:aws:sts::1:assumed-role/R/alice at 2026-11-22T09:00:00Z: "
                       "drops disc"]
    assert "not decided" in lines({"status": "not decided"})[0]
    assert lines({}) == []
