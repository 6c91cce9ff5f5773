"""The callback pattern offline, through boto3 and real HTTP: a Task ``sqs:sendMessage.waitForTaskToken`` puts its
token in an SQS message (moto), the test reads it back and answers with the Step Functions client's
SendTaskSuccess / SendTaskFailure / SendTaskHeartbeat against the runtime's gateway."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from d2ops.asl import StateMachine
from d2ops.offline.errors import ApiError
from d2ops.offline.runtime import OfflineRuntime

pytestmark = pytest.mark.integration

DEFINITION = {"StartAt": "Ask", "States": {
    "Ask": {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {"QueueUrl.$": "$.queue", "MessageBody": {"run.$": "$.run", "token.$": "$$.Task.Token"}},
            "ResultPath": "$.decision", "Next": "Done",
            "Catch": [{"ErrorEquals": ["Rejected"], "ResultPath": "$.error", "Next": "Refused"}]},
    "Done": {"Type": "Pass", "End": True},
    "Refused": {"Type": "Pass", "End": True}}}


def _add_machine(rt: OfflineRuntime) -> str:
    machine = StateMachine.from_definition(DEFINITION, name="review")
    rt.sfn.add_state_machine(machine)
    return machine.arn


@pytest.fixture()
def runtime(tmp_path: Path) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path / "work") as rt:
        _add_machine(rt)
        yield rt


def _start(rt: OfflineRuntime, run: str) -> tuple[str, str]:
    """Start a run that asks for a decision -> (its execution ARN, the task token it sent)."""
    sqs = rt.client("sqs")
    queue = sqs.create_queue(QueueName=f"decisions-{run}")["QueueUrl"]
    machine = next(arn for arn in rt.sfn.machines if arn.endswith(":review"))
    arn = rt.client("stepfunctions").start_execution(stateMachineArn=machine, name=run,
                                                     input=json.dumps({"queue": queue, "run": run}))["executionArn"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1).get("Messages", [])
        if messages:
            body = json.loads(messages[0]["Body"])  # the MessageBody object, sent as JSON text
            assert body["run"] == run
            return arn, body["token"]
    raise AssertionError(f"run {run} sent no message with its task token")


def _done(sfn: Any, arn: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        described = sfn.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return dict(described)
        time.sleep(0.05)
    raise AssertionError(f"{arn} still running")


def _code(call: Any) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


def test_send_task_success_completes_the_task_once(runtime: OfflineRuntime) -> None:
    """Mutation caught: a reused token accepted (SendTaskSuccess twice)."""
    sfn = runtime.client("stepfunctions")
    arn, token = _start(runtime, "approve-1")
    sfn.send_task_heartbeat(taskToken=token)
    assert sfn.send_task_success(taskToken=token, output=json.dumps({"decision": "approved"}))["ResponseMetadata"]
    with pytest.raises(sfn.exceptions.TaskTimedOut, match="Provided task does not exist anymore"):
        sfn.send_task_success(taskToken=token, output=json.dumps({"decision": "rejected"}))
    with pytest.raises(sfn.exceptions.TaskTimedOut):
        sfn.send_task_failure(taskToken=token, error="Rejected", cause="second thoughts")
    described = _done(sfn, arn)
    assert described["status"] == "SUCCEEDED"
    assert json.loads(described["output"])["decision"] == {"decision": "approved"}
    with pytest.raises(sfn.exceptions.TaskTimedOut):  # the run is over: still the same answer
        sfn.send_task_heartbeat(taskToken=token)
    events = sfn.get_execution_history(executionArn=arn)["events"]
    kinds = [e["type"] for e in events]
    assert kinds[2:6] == ["TaskScheduled", "TaskStarted", "TaskSubmitted", "TaskSucceeded"]
    assert "MessageId" in json.loads(events[4]["taskSubmittedEventDetails"]["output"])  # SQS's answer
    assert json.loads(sfn.describe_execution(executionArn=arn)["output"])["decision"] == {"decision": "approved"}


def test_garbage_tokens_and_bad_requests_are_refused_without_using_the_token(runtime: OfflineRuntime) -> None:
    """Mutations caught: a garbage token accepted or answered TaskTimedOut; invalid output or an oversized
    member consuming the token (the task must still take the real answer afterwards)."""
    sfn = runtime.client("stepfunctions")
    arn, token = _start(runtime, "bad-requests")
    with pytest.raises(sfn.exceptions.InvalidToken, match="Invalid Token"):
        sfn.send_task_success(taskToken="garbage", output="{}")
    with pytest.raises(sfn.exceptions.InvalidToken):
        sfn.send_task_heartbeat(taskToken=token[:-4])
    with pytest.raises(sfn.exceptions.InvalidOutput):
        sfn.send_task_success(taskToken=token, output="{not json")
    with pytest.raises(sfn.exceptions.InvalidOutput):
        sfn.send_task_success(taskToken=token, output="NaN")
    # The model's maximums (the test suite's boto3 refuses them before sending; the API's own check answers
    # callers that skip that, in AWS's words).
    for operation, request in (("SendTaskFailure", {"taskToken": token, "error": "E" * 257}),
                               ("SendTaskFailure", {"taskToken": token, "cause": "c" * 32_769}),
                               ("SendTaskSuccess", {"taskToken": "t" * 2049, "output": "{}"}),
                               ("SendTaskSuccess", {"taskToken": token}),
                               ("SendTaskHeartbeat", {"taskToken": ""})):
        with pytest.raises(ApiError) as refused:
            runtime.sfn.call(operation, request)
        assert refused.value.code == "ValidationException", (operation, refused.value)
        assert "validation error detected" in refused.value.message
    # 140,000 characters, 280,000 bytes of UTF-8: over the 256 KiB the API reference counts in bytes
    wide = json.dumps("é" * 140_000, ensure_ascii=False)
    assert _code(lambda: sfn.send_task_success(taskToken=token, output=wide)) == "ValidationException"
    assert sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"
    sfn.send_task_success(taskToken=token, output='"finally"')
    assert json.loads(_done(sfn, arn)["output"])["decision"] == "finally"


def test_send_task_failure_fails_the_task_and_catch_routes_on_its_error(runtime: OfflineRuntime) -> None:
    """Mutation caught: SendTaskFailure's error name not reaching the state's Catch."""
    sfn = runtime.client("stepfunctions")
    arn, token = _start(runtime, "reject-1")
    sfn.send_task_failure(taskToken=token, error="Rejected", cause="arn:aws:iam::123456789012:user/alice: mislabelled")
    described = _done(sfn, arn)
    assert described["status"] == "SUCCEEDED"
    assert json.loads(described["output"])["error"] == {"Error": "Rejected",
                                                        "Cause": "arn:aws:iam::123456789012:user/alice: mislabelled"}
    failed = next(e for e in sfn.get_execution_history(executionArn=arn)["events"] if e["type"] == "TaskFailed")
    assert failed["taskFailedEventDetails"]["error"] == "Rejected"
    with pytest.raises(sfn.exceptions.TaskTimedOut):
        sfn.send_task_success(taskToken=token, output="{}")


def test_concurrent_successes_over_http_exactly_one_wins(runtime: OfflineRuntime) -> None:
    """Mutation caught: two SendTaskSuccess calls for one token both answered 200."""
    arn, token = _start(runtime, "race-1")
    clients = [runtime.client("stepfunctions") for _ in range(4)]
    gate = threading.Barrier(len(clients))
    answers: dict[int, str] = {}

    def send(i: int) -> None:
        gate.wait()
        try:
            clients[i].send_task_success(taskToken=token, output=json.dumps({"winner": i}))
            answers[i] = "ok"
        except ClientError as exc:
            answers[i] = exc.response["Error"]["Code"]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(answers.values()) == ["TaskTimedOut"] * (len(clients) - 1) + ["ok"], answers
    winner = next(i for i, answer in answers.items() if answer == "ok")
    assert json.loads(_done(clients[0], arn)["output"])["decision"] == {"winner": winner}


def test_a_token_from_before_a_restart_is_timed_out_not_invalid(tmp_path: Path) -> None:
    """The registry survives nothing: the run that held the token was aborted with its runtime, so its token
    is a closed task's (TaskTimedOut), not an unknown one (InvalidToken)."""
    work = tmp_path / "work"
    with OfflineRuntime(work) as rt:
        _add_machine(rt)
        arn, token = _start(rt, "restart-1")
    with OfflineRuntime(work) as rt:
        _add_machine(rt)
        sfn = rt.client("stepfunctions")
        assert sfn.describe_execution(executionArn=arn)["status"] == "ABORTED"
        with pytest.raises(sfn.exceptions.TaskTimedOut):
            sfn.send_task_success(taskToken=token, output="{}")
        with pytest.raises(sfn.exceptions.InvalidToken):
            sfn.send_task_success(taskToken="garbage", output="{}")
