"""The callback pattern (``.waitForTaskToken``) through the interpreter: a tiny state machine whose "Ask" task
calls a service with its token and waits for SendTaskSuccess / SendTaskFailure / SendTaskHeartbeat
(`d2ops.asl.callbacks.TaskTokens`), on a virtual clock (the test moves time) and on the real one."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import Clock, Execution, MockConfig, StateMachine, TaskContext, TaskTokens, TokenRefused, VirtualClock
from d2ops.asl.callbacks import new_token, token_execution
from d2ops.asl.errors import INVALID_TOKEN, TASK_TIMED_OUT

RESOURCE = "arn:aws:states:::lambda:invoke.waitForTaskToken"
START = datetime(2024, 1, 1, tzinfo=UTC)


def definition(**ask: Any) -> dict[str, Any]:
    """Ask (a callback task, its decision in $.decision) -> Done; a catcher may route to Refused."""
    ask.setdefault("Catch", [{"ErrorEquals": ["NeverRaised"], "Next": "Refused"}])  # keeps Refused reachable
    return {"StartAt": "Ask", "States": {
        "Ask": {"Type": "Task", "Resource": RESOURCE, "ResultPath": "$.decision", "Next": "Done",
                "Parameters": {"FunctionName": "review", "Payload": {"token.$": "$$.Task.Token", "run.$": "$.run"}},
                **ask},
        "Done": {"Type": "Pass", "End": True},
        "Refused": {"Type": "Pass", "End": True}}}


class Inbox:
    """The service a callback task calls: records each call (its token) and answers like Lambda's Invoke."""

    def __init__(self, callback: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.callback = callback  # called with the token inside the call (a receiver that answers at once)

    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        self.calls.append(parameters)
        if self.callback is not None:
            self.callback(parameters["Payload"]["token"])
        return {"StatusCode": 202, "Payload": None}


def start(clock: Clock, inbox: Inbox | None = None, **ask: Any) -> tuple[Execution, TaskTokens, Inbox]:
    tokens, inbox = TaskTokens(), inbox or Inbox()
    machine = StateMachine.from_definition(definition(**ask), name="Review")
    execution = machine.start({"run": "r-1"}, executors={RESOURCE: inbox}, clock=clock, callbacks=tokens,
                              execution_name="e-1", rng=random.Random(7))
    return execution, tokens, inbox


def waiting_token(tokens: TaskTokens) -> str:
    """The token of the task now waiting, once its wait has begun (its TaskContext exists: deadlines count)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        waiting = tokens.waiting()
        if waiting:
            return waiting[0]
        time.sleep(0.005)
    raise AssertionError("no task is waiting for its token")


def done(execution: Execution) -> Execution:
    assert execution.wait(10), "the execution did not end"
    return execution


def types(execution: Execution) -> list[str]:
    return [event["type"] for event in execution.history]


def event(execution: Execution, kind: str) -> dict[str, Any]:
    return next(e for e in execution.history if e["type"] == kind)


def refusal(action: Any) -> str:
    with pytest.raises(TokenRefused) as info:
        action()
    return info.value.code


def test_success_output_becomes_the_task_result_and_the_call_is_task_submitted() -> None:
    """Mutations caught: the service's answer taken as the result; the token missing from the call."""
    execution, tokens, inbox = start(VirtualClock(START))
    token = waiting_token(tokens)
    deadline = time.monotonic() + 10
    while "TaskSubmitted" not in types(execution):  # the token is open from before the call goes out
        assert time.monotonic() < deadline, "the call never returned"
        time.sleep(0.005)
    assert inbox.calls == [{"FunctionName": "review", "Payload": {"token": token, "run": "r-1"}}]
    assert execution.status == "RUNNING"
    tokens.succeed(token, {"verdict": "approved", "by": "alice"})
    done(execution)
    assert execution.status == "SUCCEEDED"
    assert execution.output == {"run": "r-1", "decision": {"verdict": "approved", "by": "alice"}}
    assert types(execution)[1:7] == ["TaskStateEntered", "TaskScheduled", "TaskStarted", "TaskSubmitted",
                                     "TaskSucceeded", "TaskStateExited"]
    submitted = event(execution, "TaskSubmitted")["taskSubmittedEventDetails"]
    assert (submitted["resourceType"], submitted["resource"]) == ("lambda", "invoke.waitForTaskToken")
    assert submitted["output"] == '{"StatusCode":202,"Payload":null}'
    assert event(execution, "TaskSucceeded")["taskSucceededEventDetails"]["output"] == \
        '{"verdict":"approved","by":"alice"}'
    assert token_execution(token) == execution.arn


def test_a_token_is_single_use_and_a_reused_one_changes_nothing() -> None:
    """Mutation caught: a reused token accepted (a second SendTaskSuccess/Failure/Heartbeat after the first)."""
    execution, tokens, _ = start(VirtualClock(START))
    token = waiting_token(tokens)
    tokens.succeed(token, {"verdict": "approved"})
    assert refusal(lambda: tokens.succeed(token, {"verdict": "rejected"})) == TASK_TIMED_OUT
    assert refusal(lambda: tokens.fail(token, "Rejected", "too late")) == TASK_TIMED_OUT
    assert refusal(lambda: tokens.heartbeat(token)) == TASK_TIMED_OUT
    done(execution)
    assert execution.output["decision"] == {"verdict": "approved"}
    assert refusal(lambda: tokens.succeed(token, {"verdict": "rejected"})) == TASK_TIMED_OUT  # and after the end
    assert execution.output["decision"] == {"verdict": "approved"} and types(execution).count("TaskSucceeded") == 1


def test_unknown_and_garbled_tokens_are_invalid() -> None:
    """Mutation caught: any token accepted, or a garbled one answered as if its task had closed."""
    execution, tokens, _ = start(VirtualClock(START))
    token = waiting_token(tokens)
    for garbage in ("garbage", token[:-2], token + "x", "", "=" * 8):
        assert refusal(lambda g=garbage: tokens.succeed(g, {})) == INVALID_TOKEN
    stranger = new_token("arn:aws:states:us-east-1:123456789012:execution:Review:other", random.Random(1))
    with pytest.raises(TokenRefused) as info:
        tokens.heartbeat(stranger)
    assert info.value.code == INVALID_TOKEN and info.value.execution_arn.endswith(":Review:other")
    assert execution.status == "RUNNING" and tokens.waiting() == [token]  # nothing reached the task
    tokens.succeed(token, 1)
    assert done(execution).output["decision"] == 1


def test_failure_fails_the_task_with_its_error_and_catch_routes_on_it() -> None:
    """Mutations caught: SendTaskFailure treated as success; its error name or cause lost on the way to Catch."""
    catch = [{"ErrorEquals": ["Rejected"], "ResultPath": "$.error", "Next": "Refused"}]
    execution, tokens, _ = start(VirtualClock(START), Catch=catch)
    tokens.fail(waiting_token(tokens), "Rejected", "arn:aws:iam::1:user/alice: labels are wrong")
    done(execution)
    assert execution.status == "SUCCEEDED"
    assert execution.output["error"] == {"Error": "Rejected", "Cause": "arn:aws:iam::1:user/alice: labels are wrong"}
    assert "decision" not in execution.output
    failed = event(execution, "TaskFailed")["taskFailedEventDetails"]
    assert (failed["error"], failed["cause"]) == ("Rejected", "arn:aws:iam::1:user/alice: labels are wrong")
    assert [e["stateEnteredEventDetails"]["name"] for e in execution.history if e["type"] == "PassStateEntered"] \
        == ["Refused"]

    uncaught, tokens, _ = start(VirtualClock(START))
    tokens.fail(waiting_token(tokens), "Rejected", "no")
    assert (done(uncaught).status, uncaught.error, uncaught.cause) == ("FAILED", "Rejected", "no")


def test_failure_without_error_or_cause_is_recorded_as_the_service_does() -> None:
    """AWS (LocalStack's recorded test_sqs_failure_in_wait_for_task_tok_no_error_field): TaskFailed without
    error or cause, caught by States.ALL with {"Error": null, "Cause": null}."""
    catch = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Refused"}]
    execution, tokens, _ = start(VirtualClock(START), Catch=catch)
    tokens.fail(waiting_token(tokens))
    done(execution)
    assert execution.output["error"] == {"Error": None, "Cause": None}
    assert event(execution, "TaskFailed")["taskFailedEventDetails"] == {"resourceType": "lambda",
                                                                        "resource": "invoke.waitForTaskToken"}


def test_a_retried_callback_task_gets_a_new_token_and_the_old_one_is_closed() -> None:
    """Mutation caught: a retry waiting on (or still accepting) the first attempt's token."""
    retry = [{"ErrorEquals": ["Busy"], "IntervalSeconds": 5, "MaxAttempts": 1}]
    execution, tokens, inbox = start(VirtualClock(START), Retry=retry)
    first = waiting_token(tokens)
    tokens.fail(first, "Busy", "try later")
    deadline = time.monotonic() + 10
    while len(inbox.calls) < 2 or not tokens.waiting():
        assert time.monotonic() < deadline, "the retry never started waiting"
        time.sleep(0.005)
    second = tokens.waiting()[0]
    assert second != first and inbox.calls[1]["Payload"]["token"] == second
    assert refusal(lambda: tokens.succeed(first, "stale")) == TASK_TIMED_OUT
    tokens.succeed(second, "fresh")
    assert done(execution).output["decision"] == "fresh"


def test_timeout_on_a_virtual_clock_is_recorded_as_aws_does_and_closes_the_token() -> None:
    """Mutations caught: the deadline ignored while waiting on a virtual clock (the run hangs), a timeout
    too early, a timed-out token still accepted. AWS records TaskTimedOut with States.Timeout and no cause
    (LocalStack's recorded test_sqs_wait_for_task_token_timeout)."""
    clock = VirtualClock(START)
    execution, tokens, _ = start(clock, TimeoutSeconds=300)
    token = waiting_token(tokens)
    clock.advance(299)
    time.sleep(0.2)  # the waiter polls every 10 ms of real time: it would have noticed a wrong deadline
    assert execution.status == "RUNNING" and tokens.waiting() == [token]
    clock.advance(2)
    done(execution)
    assert (execution.status, execution.error, execution.cause) == ("FAILED", "States.Timeout", None)
    timed_out = event(execution, "TaskTimedOut")
    assert timed_out["taskTimedOutEventDetails"] == {"resourceType": "lambda", "resource": "invoke.waitForTaskToken",
                                                     "error": "States.Timeout"}
    assert (timed_out["timestamp"] - event(execution, "TaskStarted")["timestamp"]).total_seconds() >= 300
    assert refusal(lambda: tokens.succeed(token, "late")) == TASK_TIMED_OUT
    assert tokens.waiting() == []


def test_heartbeat_timeout_is_states_timeout_in_the_history_and_matches_heartbeat_catchers() -> None:
    """AWS records a callback's heartbeat timeout as States.Timeout (LocalStack's recorded test_heartbeats);
    States.HeartbeatTimeout is "only available inside Catch and Retry". Mutations caught: HeartbeatSeconds
    ignored; a HeartbeatTimeout catcher missing the heartbeat timeout or catching a TimeoutSeconds one."""
    clock = VirtualClock(START)
    uncaught, tokens, _ = start(clock, HeartbeatSeconds=60, TimeoutSeconds=3600)
    waiting_token(tokens)
    clock.advance(61)
    assert (done(uncaught).error, event(uncaught, "TaskTimedOut")["taskTimedOutEventDetails"]["error"]) == \
        ("States.Timeout", "States.Timeout")

    catch = [{"ErrorEquals": ["States.HeartbeatTimeout"], "ResultPath": "$.error", "Next": "Refused"}]
    clock = VirtualClock(START)
    caught, tokens, _ = start(clock, HeartbeatSeconds=60, TimeoutSeconds=3600, Catch=catch)
    waiting_token(tokens)
    clock.advance(61)
    assert done(caught).status == "SUCCEEDED" and caught.output["error"] == {"Error": "States.Timeout", "Cause": ""}

    clock = VirtualClock(START)
    plain, tokens, _ = start(clock, TimeoutSeconds=30, Catch=catch)  # no heartbeat: not a heartbeat timeout
    waiting_token(tokens)
    clock.advance(31)
    assert (done(plain).status, plain.error) == ("FAILED", "States.Timeout")


def test_heartbeats_extend_the_wait() -> None:
    """Mutation caught: SendTaskHeartbeat not restarting the HeartbeatSeconds window."""
    clock = VirtualClock(START)
    execution, tokens, _ = start(clock, HeartbeatSeconds=60)
    token = waiting_token(tokens)
    for _ in range(4):
        clock.advance(50)
        tokens.heartbeat(token)
    tokens.succeed(token, {"verdict": "approved"})
    assert done(execution).status == "SUCCEEDED"
    started, succeeded = event(execution, "TaskStarted"), event(execution, "TaskSucceeded")
    assert (succeeded["timestamp"] - started["timestamp"]).total_seconds() == 200  # well past one window
    assert event(execution, "TaskScheduled")["taskScheduledEventDetails"]["heartbeatInSeconds"] == 60


def test_abort_while_waiting_stops_the_wait_at_once_and_closes_the_token() -> None:
    """Mutations caught: the waiter ignoring StopExecution (its token still open), a token of an aborted
    execution accepted."""
    before = set(threading.enumerate())
    execution, tokens, _ = start(Clock())
    token = waiting_token(tokens)
    workers = [t for t in threading.enumerate() if t.name == "asl-task-Ask" and t not in before]
    assert len(workers) == 1  # the thread that made the call and now waits on the token
    began = time.monotonic()
    execution.abort("Stopped", "by the test")
    assert execution.wait(5) and time.monotonic() - began < 2
    assert (execution.status, execution.error) == ("ABORTED", "Stopped")
    assert types(execution)[-2:] == ["TaskStateAborted", "ExecutionAborted"]
    workers[0].join(2)
    assert not workers[0].is_alive(), "the task still waits for its token after the abort"
    assert tokens.waiting() == []
    assert refusal(lambda: tokens.succeed(token, "late")) == TASK_TIMED_OUT


def test_timeouts_on_the_real_clock() -> None:
    """The same deadlines in wall-clock time (HeartbeatSeconds 1: the smallest the language allows)."""
    began = time.monotonic()
    execution, tokens, _ = start(Clock(), HeartbeatSeconds=1)
    token = waiting_token(tokens)
    assert (done(execution).status, execution.error) == ("FAILED", "States.Timeout")
    assert 1 <= time.monotonic() - began < 5
    assert refusal(lambda: tokens.heartbeat(token)) == TASK_TIMED_OUT


def race(tokens: TaskTokens, token: str, senders: int) -> dict[int, str]:
    """``senders`` threads released together, each sending SendTaskSuccess -> {sender: "ok" or the refusal}."""
    gate = threading.Barrier(senders)
    results: dict[int, str] = {}

    def send(i: int) -> None:
        gate.wait()
        try:
            tokens.succeed(token, {"winner": i})
            results[i] = "ok"
        except TokenRefused as refused:
            results[i] = refused.code

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def test_two_concurrent_successes_exactly_one_wins() -> None:
    """Mutation caught: a check-then-complete race letting two SendTaskSuccess calls both succeed. (Which
    sender wins is up to the threads; that exactly one does is not.)"""
    for round_ in range(5):
        execution, tokens, _ = start(Clock())
        results = race(tokens, waiting_token(tokens), 8)
        winners = [i for i, result in results.items() if result == "ok"]
        assert len(winners) == 1, f"round {round_}: {results}"
        assert sorted(results.values()) == ["TaskTimedOut"] * 7 + ["ok"]
        assert done(execution).output["decision"] == {"winner": winners[0]}


def test_a_receiver_may_call_back_before_the_call_returns() -> None:
    """A Lambda that sends SendTaskSuccess itself, inside its invocation: the token is open before the call."""
    holder: dict[str, TaskTokens] = {}
    inbox = Inbox(callback=lambda token: holder["tokens"].succeed(token, "at once"))
    tokens = holder["tokens"] = TaskTokens()
    machine = StateMachine.from_definition(definition(), name="Review")
    execution = machine.run({"run": "r"}, executors={RESOURCE: inbox}, callbacks=tokens)
    assert execution.status == "SUCCEEDED" and execution.output["decision"] == "at once"
    assert types(execution).index("TaskSubmitted") < types(execution).index("TaskSucceeded")


def test_a_mocked_callback_task_returns_its_mocked_response_without_waiting() -> None:
    """Step Functions Local's mocks: the mocked Return is the callback's result (no token to wait for)."""
    mock = MockConfig({"StateMachines": {"Review": {"TestCases": {"Approved": {"Ask": "A"}}}},
                       "MockedResponses": {"A": {"0": {"Return": {"verdict": "approved"}}}}})
    machine = StateMachine.from_definition(definition(), name="Review")
    execution = machine.run({"run": "r"}, mock=mock.test_case("Review", "Approved"))
    assert execution.status == "SUCCEEDED" and execution.output["decision"] == {"verdict": "approved"}
