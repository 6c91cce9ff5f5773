"""Runtime semantics beyond the documented examples: retries and back-off under virtual time,
timeouts and heartbeats, predefined errors, payload limits, Parallel/Map failures, context object."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import Clock, Execution, StateMachine, TaskContext, TaskFailed, TaskTokens, VirtualClock
from d2ops.asl.callbacks import token_execution

LAMBDA = "arn:aws:states:::lambda:invoke"


def run(definition: dict[str, Any], data: Any = None, tasks: Callable[..., Any] | None = None,
        **options: Any) -> Execution:
    machine = StateMachine.from_definition(definition, name="Edge")
    return machine.run(data if data is not None else {}, executors={"arn:*": tasks} if tasks else None, **options)


def task(**fields: Any) -> dict[str, Any]:
    return {"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": LAMBDA, "End": True, **fields}}}


class Recorder:
    """A task executor that records when it was called and plays back a list of outcomes."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[Any, TaskContext]] = []
        self.times: list[Any] = []

    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        self.calls.append((parameters, context))
        self.times.append(context.clock.now())
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome(context) if callable(outcome) else outcome

    def offsets(self) -> list[float]:
        return [(t - self.times[0]).total_seconds() for t in self.times]


def test_max_attempts_zero_never_retries() -> None:
    calls = Recorder(TaskFailed("Boom", "x"))
    execution = run(task(Retry=[{"ErrorEquals": ["Boom"], "MaxAttempts": 0}]), tasks=calls)
    assert (execution.status, execution.error, execution.cause) == ("FAILED", "Boom", "x")
    assert len(calls.calls) == 1


def test_backoff_is_capped_by_max_delay_seconds() -> None:
    calls = Recorder(TaskFailed("Boom"))
    run(task(Retry=[{"ErrorEquals": ["Boom"], "IntervalSeconds": 10, "BackoffRate": 3, "MaxAttempts": 4,
                     "MaxDelaySeconds": 50}]), tasks=calls)
    assert calls.offsets() == [0, 10, 40, 90, 140]


def test_full_jitter_waits_a_random_part_of_each_delay_reproducibly() -> None:
    definition = task(Retry=[{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 4, "MaxAttempts": 3,
                              "JitterStrategy": "FULL"}])
    first, second = Recorder(TaskFailed("Boom")), Recorder(TaskFailed("Boom"))
    run(definition, tasks=first, rng=random.Random(7))
    run(definition, tasks=second, rng=random.Random(7))
    waits = [b - a for a, b in zip(first.offsets(), first.offsets()[1:], strict=False)]
    assert first.offsets() == second.offsets()
    assert all(0 <= wait <= limit for wait, limit in zip(waits, (4, 8, 16), strict=True))
    assert waits != [4, 8, 16]


def test_retry_count_reaches_the_context_object_and_the_executor() -> None:
    calls = Recorder(TaskFailed("Boom"), TaskFailed("Boom"), {"ok": True})
    execution = run(task(Parameters={"attempt.$": "$$.State.RetryCount"}, Retry=[{"ErrorEquals": ["Boom"]}]),
                    tasks=calls)
    assert execution.status == "SUCCEEDED"
    assert [params["attempt"] for params, _ in calls.calls] == [0, 1, 2]
    assert [context.retry_count for _, context in calls.calls] == [0, 1, 2]


def test_states_runtime_is_never_caught_or_retried() -> None:
    calls = Recorder({"ok": True})
    definition = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "Parameters": {"x.$": "$.missing"}, "End": True,
              "Retry": [{"ErrorEquals": ["States.ALL"]}], "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Caught"}]},
        "Caught": {"Type": "Succeed"}}}
    execution = run(definition, {"present": 1}, tasks=calls)
    assert execution.status == "FAILED"
    assert execution.error == "States.Runtime"
    # AWS's words (the field is the key as written, without its parents).
    assert "The JSONPath '$.missing' specified for the field 'x.$' could not be found in the input" \
        in (execution.cause or "")
    assert calls.calls == []


def test_task_failed_matches_everything_but_timeouts() -> None:
    definition = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": 5, "End": True,
              "Catch": [{"ErrorEquals": ["States.TaskFailed"], "Next": "Caught"}]},
        "Caught": {"Type": "Succeed"}}}
    assert run(definition, tasks=Recorder(TaskFailed("Lambda.Unknown"))).status == "SUCCEEDED"
    slow = run(definition, tasks=Recorder(lambda context: context.sleep(60)))
    assert (slow.status, slow.error) == ("FAILED", "States.Timeout")
    assert slow.cause is None  # no cause, as AWS records a task's timeout (test_asl_recorded_cases)


def test_timeout_seconds_path_reads_the_state_input() -> None:
    execution = run(task(TimeoutSecondsPath="$.limit"), {"limit": 3}, tasks=Recorder(lambda c: c.sleep(4)))
    assert execution.error == "States.Timeout"
    assert (execution.stop_date - execution.start_date).total_seconds() == 3


def test_heartbeats_keep_a_long_task_alive_and_missing_ones_time_it_out() -> None:
    def beating(context: TaskContext) -> str:
        for _ in range(10):
            context.sleep(5)
            context.heartbeat()
        return "done"

    definition = task(TimeoutSeconds=100, HeartbeatSeconds=10)
    assert run(definition, tasks=Recorder(beating)).output == "done"
    silent = run(task(TimeoutSeconds=100, HeartbeatSeconds=10,
                      Retry=[{"ErrorEquals": ["States.Timeout"], "MaxAttempts": 1}]),
                 tasks=Recorder(lambda c: c.sleep(30)))
    assert (silent.status, silent.error) == ("FAILED", "States.HeartbeatTimeout")
    assert [e["type"] for e in silent.history].count("TaskTimedOut") == 2  # retried once via States.Timeout


def test_a_blocking_executor_is_timed_out_in_real_time() -> None:
    release = threading.Event()
    started = time.monotonic()
    execution = run(task(TimeoutSeconds=1), tasks=Recorder(lambda c: release.wait(60)), clock=Clock())
    release.set()
    assert execution.error == "States.Timeout"
    assert time.monotonic() - started < 15  # not the executor's 60 s; slack for a loaded machine


def test_state_machine_timeout_ends_the_execution_timed_out() -> None:
    definition = {"TimeoutSeconds": 10, "StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 100, "End": True}}}
    execution = run(definition)
    assert (execution.status, execution.error) == ("TIMED_OUT", "States.Timeout")
    assert (execution.stop_date - execution.start_date).total_seconds() == 10
    assert [e["type"] for e in execution.history][-2:] == ["WaitStateAborted", "ExecutionTimedOut"]


def test_no_choice_matched() -> None:
    definition = {"StartAt": "C", "States": {"C": {"Type": "Choice", "Choices": [
        {"Variable": "$.x", "NumericEquals": 1, "Next": "D"}]}, "D": {"Type": "Succeed"}}}
    execution = run(definition, {"x": 2})
    assert (execution.status, execution.error) == ("FAILED", "States.NoChoiceMatched")
    missing = run(definition, {"y": 1})  # a Variable that is not in the input is a runtime error
    assert (missing.status, missing.error) == ("FAILED", "States.Runtime")
    assert missing.cause == ("An error occurred while executing the state 'C' (entered at the event id #2). "
                             "Invalid path '$.x': The choice state's condition path references an invalid value.")


def test_payload_limit_of_a_task_result_is_caught() -> None:
    big = "x" * (256 * 1024)
    catch_all = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "End": True,
              "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Caught"}]}, "Caught": {"Type": "Succeed"}}}
    execution = run(catch_all, tasks=Recorder({"blob": big}))
    # A task's oversized result is its failure, which States.ALL catches as AWS records (test_asl_recorded_cases).
    assert execution.status == "SUCCEEDED"
    named = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "End": True,
              "Catch": [{"ErrorEquals": ["States.DataLimitExceeded"], "Next": "Caught"}]},
        "Caught": {"Type": "Succeed"}}}
    assert run(named, tasks=Recorder({"blob": big})).status == "SUCCEEDED"
    just_fits = "x" * (256 * 1024 - len('{"blob":""}'))
    assert run(task(), tasks=Recorder({"blob": just_fits})).status == "SUCCEEDED"
    with pytest.raises(ValueError, match="over the 262144 byte limit"):
        run(task(), {"blob": big}, tasks=Recorder({}))


def test_result_path_match_failure_is_catchable() -> None:
    definition = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "ResultPath": "$.result", "End": True,
              "Catch": [{"ErrorEquals": ["States.ResultPathMatchFailure"], "ResultPath": None, "Next": "Caught"}]},
        "Caught": {"Type": "Pass", "End": True}}}
    execution = run(definition, "a plain string", tasks=Recorder({"ok": 1}))
    assert (execution.status, execution.output) == ("SUCCEEDED", "a plain string")
    failed = run({"StartAt": "P", "States": {"P": {"Type": "Pass", "ResultPath": "$.a.b", "End": True}}}, {"a": 5})
    assert (failed.status, failed.error) == ("FAILED", "States.ResultPathMatchFailure")


def test_unexpected_executor_exceptions_fail_the_task_with_their_class_name() -> None:
    execution = run(task(), tasks=Recorder(KeyError("bucket")))
    assert (execution.error, execution.cause) == ("KeyError", "'bucket'")
    bad = run(task(), tasks=Recorder({"not json": {1, 2}}))
    assert bad.error == "States.Runtime" and "not JSON-serializable" in (bad.cause or "")


def branch(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"StartAt": name, "States": {name: {"Type": "Task", "Resource": LAMBDA, "End": True, **fields}}}


def test_a_failed_branch_fails_the_parallel_state_with_its_error_and_is_caught() -> None:
    def by_state(context: TaskContext) -> Any:
        if context.state_name == "Bad":
            raise TaskFailed("BranchError", "bad branch")
        return "fine"

    definition = {"StartAt": "P", "States": {
        "P": {"Type": "Parallel", "Branches": [branch("Good", {}), branch("Bad", {})], "End": True,
              "Retry": [{"ErrorEquals": ["BranchError"], "MaxAttempts": 1}],
              "Catch": [{"ErrorEquals": ["BranchError"], "ResultPath": "$.error", "Next": "Caught"}]},
        "Caught": {"Type": "Pass", "End": True}}}
    execution = run(definition, {"in": 1}, tasks=Recorder(by_state))
    assert execution.output == {"in": 1, "error": {"Error": "BranchError", "Cause": "bad branch"}}
    types = [e["type"] for e in execution.history]
    # One ParallelStateFailed, for the attempt that ends the state: AWS records none for a retried attempt
    # (LocalStack's snapshot test_base_scenarios::test_parallel_state_retry, recorded against AWS).
    assert types.count("ParallelStateStarted") == 2 and types.count("ParallelStateFailed") == 1
    assert types.index("ParallelStateFailed") > len(types) - 1 - types[::-1].index("ParallelStateStarted")


def test_a_failed_iteration_fails_the_map_state() -> None:
    def odd_fails(context: TaskContext) -> Any:
        raise TaskFailed("Odd", "item 3")

    definition = {"StartAt": "M", "States": {"M": {
        "Type": "Map", "ItemsPath": "$.items", "End": True,
        "ItemProcessor": {"StartAt": "C", "States": {
            "C": {"Type": "Choice", "Choices": [{"Variable": "$", "NumericEquals": 3, "Next": "Work"}],
                  "Default": "Skip"},
            "Work": {"Type": "Task", "Resource": LAMBDA, "End": True}, "Skip": {"Type": "Succeed"}}}}}}
    execution = run(definition, {"items": [1, 2, 3, 4]}, tasks=Recorder(odd_fails))
    assert (execution.status, execution.error, execution.cause) == ("FAILED", "Odd", "item 3")
    types = [e["type"] for e in execution.history]
    assert types.count("MapIterationSucceeded") == 2
    # The failing Task is recorded aborted after its iteration, as AWS records it (test_asl_recorded_cases).
    assert types[-4:] == ["MapIterationFailed", "TaskStateAborted", "MapStateFailed", "ExecutionFailed"]
    not_array = run(definition, {"items": "nope"}, tasks=Recorder("x"))
    assert not_array.error == "States.Runtime" and "must select an array" in (not_array.cause or "")


def test_parallel_branches_run_concurrently_on_a_real_clock_and_a_failure_cancels_the_rest() -> None:
    cancelled = threading.Event()

    def work(context: TaskContext) -> Any:
        if context.state_name == "Fails":
            time.sleep(0.1)
            raise TaskFailed("Boom", "fast failure")
        context.sleep(60)  # cooperative: returns early when the branch is cancelled
        if context.cancelled:
            cancelled.set()
        return "slow"

    definition = {"StartAt": "P", "States": {"P": {"Type": "Parallel", "End": True,
                                                   "Branches": [branch("Slow", {}), branch("Fails", {})]}}}
    started = time.monotonic()
    execution = run(definition, tasks=Recorder(work), clock=Clock())
    assert (execution.status, execution.error) == ("FAILED", "Boom")
    assert time.monotonic() - started < 15  # not the slow branch's 60 s; slack for a loaded machine
    assert cancelled.wait(30)


def test_map_max_concurrency_bounds_parallelism_on_a_real_clock() -> None:
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, peak
    # Iterations meet in pairs while they run: two must overlap (a 50 ms sleep relied on the second
    # starting in time), and one alone would break the barrier (after 30 s) and fail the Map.
    pair = threading.Barrier(2, timeout=30)

    def work(context: TaskContext) -> Any:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        pair.wait()
        with lock:
            running[0] -= 1
        return context.context_object["State"]["Name"]

    definition = {"StartAt": "M", "States": {"M": {"Type": "Map", "MaxConcurrency": 2, "End": True,
                                                   "Iterator": branch("W", {})}}}
    execution = run(definition, [1, 2, 3, 4, 5, 6], tasks=Recorder(work), clock=Clock())
    assert execution.output == ["W"] * 6
    assert running[1] == 2


def test_abort_from_another_thread() -> None:
    machine = StateMachine.from_definition(
        {"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 3600, "End": True}}}, name="Long")
    waiting = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "WaitStateEntered":
            waiting.set()

    execution = machine.start({}, clock=Clock(), execution_name="stop-me", on_event=on_event)
    # The abort must find the execution in its Wait state (an abort before it is entered ends the run
    # without a WaitStateAborted): wait for that event, however busy the machine.
    assert waiting.wait(30)
    assert execution.status == "RUNNING" and not execution.done
    execution.abort(error="Stopped", cause="by the test")
    assert execution.wait(30)
    assert (execution.status, execution.error, execution.cause) == ("ABORTED", "Stopped", "by the test")
    assert [e["type"] for e in execution.history][-2:] == ["WaitStateAborted", "ExecutionAborted"]


def test_a_task_answer_that_arrives_after_the_abort_is_not_recorded() -> None:
    # StopExecution while a .sync create is in flight: the create's answer reaches a worker the state has
    # abandoned. The test holds the answer until the execution has ended.
    called, answer, answered = threading.Event(), threading.Event(), threading.Event()
    cancelled: list[bool] = []

    def create(resource: str, parameters: Any, context: TaskContext) -> Any:
        called.set()
        answer.wait(30)
        context.submitted({"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/late"})
        cancelled.append(context.cancelled)
        answered.set()
        return None

    definition = {"StartAt": "Train", "States": {"Train": {
        "Type": "Task", "Resource": "arn:aws:states:::sagemaker:createTrainingJob.sync", "End": True}}}
    execution = StateMachine.from_definition(definition, name="Late").start(
        {}, executors={"arn:*": create}, clock=Clock(), execution_name="stop-mid-create")
    assert called.wait(30)
    execution.abort(error="Stopped", cause="by the test")
    assert execution.wait(30)
    answer.set()
    assert answered.wait(30) and cancelled == [True]
    assert [e["type"] for e in execution.history] == ["ExecutionStarted", "TaskStateEntered", "TaskScheduled",
                                                      "TaskStarted", "TaskStateAborted", "ExecutionAborted"]


def test_context_object_fields() -> None:
    seen: dict[str, Any] = {}
    tokens = TaskTokens()

    def capture(context: TaskContext) -> Any:
        seen.update(context.context_object)
        assert context.task_token is not None
        tokens.succeed(context.task_token, {"token": context.task_token})  # the receiver calls back at once
        return {"MessageId": "m-1"}

    definition = {"StartAt": "T", "States": {"T": {
        "Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken", "End": True,
        "Parameters": {"token.$": "$$.Task.Token", "id.$": "$$.Execution.Id", "start.$": "$$.Execution.StartTime",
                       "sm.$": "$$.StateMachine.Name", "input.$": "$$.Execution.Input.k", "state.$": "$$.State.Name",
                       "entered.$": "$$.State.EnteredTime", "role.$": "$$.Execution.RoleArn"}}}}
    recorder = Recorder(capture)
    clock = VirtualClock(datetime(2024, 1, 1, tzinfo=UTC))
    execution = StateMachine.from_definition(definition, name="Ctx").run(
        {"k": "v"}, executors={"arn:*": recorder}, execution_name="run-1", clock=clock, callbacks=tokens)
    params = recorder.calls[0][0]
    assert params["id"] == "arn:aws:states:us-east-1:123456789012:execution:Ctx:run-1" == execution.arn
    assert params["start"] == params["entered"] == "2024-01-01T00:00:00.000Z"
    assert (params["sm"], params["input"], params["state"]) == ("Ctx", "v", "T")
    assert params["role"] == "arn:aws:iam::123456789012:role/Ctx-role"
    assert params["token"] == execution.output["token"] and token_execution(params["token"]) == execution.arn
    assert seen["Execution"]["Name"] == "run-1"


def test_query_paths_return_lists_and_missing_input_paths_fail() -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True, "Parameters": {
        "big.$": "$.items[?(@.n > 1)].n", "all.$": "$..n", "first.$": "$.items[0]", "last.$": "$.items[-1].n"}}}}
    execution = run(definition, {"items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    assert execution.output == {"big": [2, 3], "all": [1, 2, 3], "first": {"n": 1}, "last": 3}
    missing = run({"StartAt": "P", "States": {"P": {"Type": "Pass", "InputPath": "$.nope", "End": True}}}, {"a": 1})
    assert missing.error == "States.Runtime" and missing.cause == (
        "An error occurred while executing the state 'P' (entered at the event id #2). "
        "Invalid path '$.nope' : No results for path: $['nope']")


def test_wait_timestamp_path_in_the_past_does_not_wait() -> None:
    definition = {"StartAt": "W", "States": {"W": {"Type": "Wait", "TimestampPath": "$.at", "End": True}}}
    past = run(definition, {"at": "2000-01-01T00:00:00Z"})
    assert past.status == "SUCCEEDED" and past.stop_date == past.start_date
    bad = run(definition, {"at": "tomorrow"})
    assert bad.error == "States.Runtime"


def test_a_task_running_past_the_execution_timeout_ends_it_on_time() -> None:
    definition = {"TimeoutSeconds": 60, "StartAt": "T", "States": {"T": {"Type": "Task", "Resource": LAMBDA,
                                                                          "End": True}}}
    execution = run(definition, tasks=Recorder(lambda context: context.sleep(3600)))
    assert (execution.status, execution.error) == ("TIMED_OUT", "States.Timeout")
    assert (execution.stop_date - execution.start_date).total_seconds() == 60
    assert [e["type"] for e in execution.history][-2:] == ["TaskStateAborted", "ExecutionTimedOut"]
