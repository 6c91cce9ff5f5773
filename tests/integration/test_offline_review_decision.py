"""Deciding a review offline, end to end: ``d2ops approve`` / ``d2ops reject`` (real processes) against a running
offline runtime, its status API over HTTP (SigV4, the caller's identity built as API Gateway's IAM authorizer
reports it), the status API's decision route in-process, and the runtime's Step Functions completing a real
``.waitForTaskToken`` wait (tests/fixtures/offline/review.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from d2ops.offline.client import offline_status_api
from d2ops.offline.runtime import OfflineRuntime, new_credentials
from d2ops.offline.stack import ACCOUNT_ID, REGION
from d2ops.offline.status_api_server import reviewer_session, session_name
from d2ops.sigv4 import SignedStatusApi
from d2ops_core.documents.review import ReviewDecision
from d2ops_core.s3_layout import review_decision_key
from tests.fixtures.offline.review import finished, waiting_run

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("review") / "work") as rt:
        yield rt


def d2ops(rt: OfflineRuntime, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)  # the command finds the runtime's own credentials in its work dir
    return subprocess.run([sys.executable, "-m", "d2ops", *args, "--work-dir", str(rt.work_dir)], capture_output=True,
                          text=True, env=env, timeout=120)


def reviewer_arn(rt: OfflineRuntime) -> str:
    return reviewer_session(rt.stack, rt.credentials.access_key).user_arn


def test_the_runtime_s_user_decides_as_a_session_of_the_offline_reviewer_role(runtime: OfflineRuntime) -> None:
    role = runtime.stack.functions["StatusApiFunction"].environment["REVIEWER_ROLE_ARN"]
    assert role == f"arn:aws:iam::{ACCOUNT_ID}:role/d2ops-ReviewerRole"  # template.yaml's !GetAtt, resolved offline
    assert reviewer_arn(runtime) == f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/d2ops-ReviewerRole/{session_name()}"


def test_approve_completes_the_wait_and_a_second_decision_is_refused(runtime: OfflineRuntime) -> None:
    run = waiting_run(runtime, "shapes_v2_approve0000000001")
    approved = d2ops(runtime, "approve", run.run_id, "--reason", "the drop is within labelling noise")
    assert approved.returncode == 0, approved.stderr
    who = reviewer_arn(runtime)
    assert approved.stdout.startswith(f"run {run.run_id} approved by {who} at ")
    assert approved.stdout.rstrip().endswith(": the drop is within labelling noise")
    described = finished(runtime, run.execution_arn)
    assert described["status"] == "SUCCEEDED"
    decision = ReviewDecision.model_validate(json.loads(described["output"])["review"])  # the run received it
    assert (decision.decision, decision.decided_by) == ("approved", who)
    body = runtime.client("s3").get_object(Bucket=runtime.stack.artifacts_bucket,
                                           Key=review_decision_key(run.run_id))["Body"].read()
    assert ReviewDecision.model_validate_json(body) == decision  # and the record says the same
    # The same decision again: answered as recorded (a retry after a lost answer), exit 0.
    again = d2ops(runtime, "approve", run.run_id, "--reason", "the drop is within labelling noise", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["already_decided"] is True
    # Another decision: refused, naming who decided.
    rejected = d2ops(runtime, "reject", run.run_id, "--reason", "changed my mind")
    assert rejected.returncode == 1 and rejected.stdout == ""
    assert f"was already decided: approved by {who}" in rejected.stderr and "HTTP 409" in rejected.stderr
    assert rejected.stderr.count("\n") == 1 and "Traceback" not in rejected.stderr


def test_reject_sends_the_reason(runtime: OfflineRuntime) -> None:
    run = waiting_run(runtime, "shapes_v2_reject00000000001")
    rejected = d2ops(runtime, "reject", run.run_id, "--reason", "the rare class 'disc' is gone", "--json")
    assert rejected.returncode == 0, rejected.stderr
    answer = json.loads(rejected.stdout)
    assert (answer["decision"], answer["reason"], answer["already_decided"]) == (
        "rejected", "the rare class 'disc' is gone", False)
    output = json.loads(finished(runtime, run.execution_arn)["output"])["review"]
    assert (output["decision"], output["reason"]) == ("rejected", "the rare class 'disc' is gone")


def test_refusals_exit_1_and_usage_errors_exit_2_with_one_line(runtime: OfflineRuntime) -> None:
    not_waiting = d2ops(runtime, "approve", "shapes_v9_nothingwaits000001")
    assert not_waiting.returncode == 1 and "is not waiting for a review" in not_waiting.stderr
    assert "HTTP 404" in not_waiting.stderr
    stopped = waiting_run(runtime, "shapes_v2_stopped0000000001")
    runtime.client("stepfunctions").stop_execution(executionArn=stopped.execution_arn, cause="operator")
    assert finished(runtime, stopped.execution_arn)["status"] == "ABORTED"
    late = d2ops(runtime, "approve", stopped.run_id)
    assert late.returncode == 1 and "the review is no longer waiting" in late.stderr and "TaskTimedOut" in late.stderr
    for args, says in ((("reject", "shapes_v2_x"), "the following arguments are required: --reason"),
                       (("reject", "shapes_v2_x", "--reason", " "), "--reason is blank"),
                       (("reject", "shapes_v2_x", "--reason", "a\nb"), "one line"),
                       (("reject", "shapes_v2_x", "--reason", "x" * 1001), "at most 1000"),
                       (("approve", "bad id!"), "is not a run id")):
        usage = d2ops(runtime, *args)
        assert usage.returncode == 2 and says in usage.stderr, (args, usage.stderr)
        assert "Traceback" not in usage.stderr
    for stream in (not_waiting.stderr, late.stderr):
        assert stream.count("\n") == 1 and "Traceback" not in stream


def test_without_a_running_runtime_nothing_can_wait(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "d2ops", "approve", "shapes_v2_x", "--work-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    assert result.returncode == 1 and "no offline runtime is running on" in result.stderr
    assert not (tmp_path / "runtime.json").exists()  # no runtime was started for the occasion


def test_anyone_else_signing_is_refused_with_403_and_decides_nothing(runtime: OfflineRuntime) -> None:
    run = waiting_run(runtime, "shapes_v2_outsider000000001")
    mallory = new_credentials()
    runtime.status_api.add_caller(mallory, f"arn:aws:iam::{ACCOUNT_ID}:user/mallory")
    outsider = SignedStatusApi(runtime.status_api.url, mallory, REGION)
    # She may read (the status API's GETs are any IAM caller's) but not decide.
    assert outsider.request("GET", "/runs")[0] == 200
    status, data, _ = outsider.request("POST", f"/runs/{run.run_id}/decision",
                                       json.dumps({"decision": "approve"}).encode(),
                                       {"Content-Type": "application/json"})
    message = json.loads(data)["message"]
    assert status == 403 and "user/mallory" in message and "reviewer role" in message
    assert runtime.client("stepfunctions").describe_execution(executionArn=run.execution_arn)["status"] == "RUNNING"
    # The runtime's own user still may.
    answer = offline_status_api(runtime.status_api.url, runtime.credentials).call(
        "POST", f"/runs/{run.run_id}/decision", {"decision": "reject", "reason": "not mallory's call"})
    assert answer["decided_by"] == reviewer_arn(runtime)
    assert finished(runtime, run.execution_arn)["status"] == "SUCCEEDED"


def test_hostile_bodies_over_http_are_4xx(runtime: OfflineRuntime) -> None:
    api = offline_status_api(runtime.status_api.url, runtime.credentials)
    path = "/runs/shapes_v2_hostile0000000001/decision"
    # Over the adapter's 1 MiB, API Gateway's stand-in answers 413 before reading a byte of the body.
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(runtime.status_api.url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(2 * 1024 * 1024))
    connection.endheaders()  # and no body: the answer must not wait for one
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())) == (413, {"message": "Request Entity Too Large"})
    connection.close()
    for body, expected in ((b'{"decision": "reject", "reason": "' + b"y" * 70_000 + b'"}', 413),
                           (b"[" * 20_000, 400), (b"\xff\xfe", 400), (b"{}", 400)):
        status, data, _ = api.request("POST", path, body, {"Content-Type": "application/json"})
        assert status == expected, (status, data[:200])
        assert b"Traceback" not in data


def test_two_reviewers_at_once_through_the_real_step_functions_one_wins(runtime: OfflineRuntime) -> None:
    """Two reviewers post at the same moment; the runtime's SendTaskSuccess accepts the token once: one 200, one
    409 naming the winner, and the run received the winner's decision."""
    import threading

    run = waiting_run(runtime, "shapes_v2_race00000000000001")
    bob = new_credentials()
    bob_arn = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/d2ops-ReviewerRole/bob"
    runtime.status_api.add_caller(bob, bob_arn)
    callers = {reviewer_arn(runtime): runtime.credentials, bob_arn: bob}
    start = threading.Barrier(len(callers))
    answers: dict[str, tuple[int, dict[str, str]]] = {}

    def post(who: str) -> None:
        api = SignedStatusApi(runtime.status_api.url, callers[who], REGION)
        start.wait(timeout=10)
        status, data, _ = api.request("POST", f"/runs/{run.run_id}/decision",
                                      json.dumps({"decision": "reject", "reason": f"by {who}"}).encode(),
                                      {"Content-Type": "application/json"})
        answers[who] = (status, json.loads(data))

    threads = [threading.Thread(target=post, args=(who,)) for who in callers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(status for status, _ in answers.values()) == [200, 409], answers
    winner = next(who for who, (status, _) in answers.items() if status == 200)
    loser = next(who for who in callers if who != winner)
    assert f"already decided: rejected by {winner}" in answers[loser][1]["message"]
    output = json.loads(finished(runtime, run.execution_arn)["output"])["review"]
    assert (output["decided_by"], output["reason"]) == (winner, f"by {winner}")
