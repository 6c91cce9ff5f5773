"""The execution history: GetExecutionHistory event shape, a per-state timeline built from it,
live events, and DescribeExecution."""

from __future__ import annotations

import itertools
import json
import threading
from datetime import UTC, datetime
from typing import Any

from d2ops.asl import Execution, StateMachine, TaskContext, TaskFailed, VirtualClock

RESOURCES = {
    "Invoke": "arn:aws:states:::lambda:invoke",
    "Train": "arn:aws:states:::sagemaker:createTrainingJob.sync",
    "Describe": "arn:aws:states:::aws-sdk:sagemaker:describeEndpoint",
    "Plain": "arn:aws:lambda:us-east-1:123456789012:function:plain",
}
PIPELINE = {"StartAt": "Invoke", "States": {
    "Invoke": {"Type": "Task", "Resource": RESOURCES["Invoke"], "Parameters": {"FunctionName": "f", "Payload.$": "$"},
               "ResultSelector": {"v.$": "$.Payload"}, "ResultPath": "$.invoke", "Next": "Train"},
    "Train": {"Type": "Task", "Resource": RESOURCES["Train"], "ResultPath": "$.train", "TimeoutSeconds": 7200,
              "HeartbeatSeconds": 600, "Retry": [{"ErrorEquals": ["ThrottlingException"], "IntervalSeconds": 30}],
              "Next": "Wait"},
    "Wait": {"Type": "Wait", "Seconds": 60, "Next": "Describe"},
    "Describe": {"Type": "Task", "Resource": RESOURCES["Describe"], "ResultPath": "$.endpoint", "Next": "Ready?"},
    "Ready?": {"Type": "Choice", "Choices": [{"Variable": "$.endpoint.EndpointStatus", "StringEquals": "InService",
                                               "Next": "Plain"}], "Default": "Wait"},
    "Plain": {"Type": "Task", "Resource": RESOURCES["Plain"], "TimeoutSeconds": 30, "ResultPath": None, "End": True}}}


class Services:
    def __init__(self) -> None:
        self.describes = 0
        self.trains = 0

    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        if context.state_name == "Train":
            self.trains += 1
            if self.trains == 1:
                raise TaskFailed("ThrottlingException", "slow down")
            context.submitted({"TrainingJobArn": "arn:job"})
            context.sleep(300)
            return {"TrainingJobStatus": "Completed"}
        if context.state_name == "Describe":
            self.describes += 1
            return {"EndpointStatus": "InService" if self.describes == 2 else "Creating"}
        if context.state_name == "Invoke":
            return {"Payload": 42, "StatusCode": 200}
        return None


def run_pipeline(**options: Any) -> Execution:
    machine = StateMachine.from_definition(PIPELINE, name="Pipeline")
    return machine.run({"run": "r1"}, executors={"arn:*": Services()}, execution_name="r1", **options)


def test_events_have_the_get_execution_history_shape() -> None:
    execution = run_pipeline()
    assert execution.status == "SUCCEEDED", execution.cause
    events = execution.history
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "ExecutionStarted" and events[0]["previousEventId"] == 0
    assert events[-1]["type"] == "ExecutionSucceeded"
    # As AWS records it: the first state's Entered event points at 0, then one thread of execution is a chain.
    assert events[1]["type"].endswith("StateEntered") and events[1]["previousEventId"] == 0
    for previous, event in itertools.pairwise(events[1:]):
        assert event["previousEventId"] == previous["id"]
    for previous, event in itertools.pairwise(events):
        assert event["timestamp"] >= previous["timestamp"]
        assert isinstance(event["timestamp"], datetime) and event["timestamp"].tzinfo is not None
    for event in events:
        detail_keys = [k for k in event if k.endswith("EventDetails")]
        assert set(event) - set(detail_keys) == {"id", "previousEventId", "timestamp", "type"}
        assert len(detail_keys) <= 1
    started = events[0]["executionStartedEventDetails"]
    assert json.loads(started["input"]) == {"run": "r1"}
    assert started["roleArn"] == "arn:aws:iam::123456789012:role/Pipeline-role"
    assert json.loads(events[-1]["executionSucceededEventDetails"]["output"]) == execution.output


def test_task_events_name_the_integration_like_the_service() -> None:
    events = run_pipeline().history
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    scheduled = [e["taskScheduledEventDetails"] for e in by_type["TaskScheduled"]]
    assert [(d["resourceType"], d["resource"]) for d in scheduled] == [
        ("lambda", "invoke"), ("sagemaker", "createTrainingJob.sync"), ("sagemaker", "createTrainingJob.sync"),
        ("aws-sdk:sagemaker", "describeEndpoint"), ("aws-sdk:sagemaker", "describeEndpoint")]
    assert json.loads(scheduled[0]["parameters"]) == {"FunctionName": "f", "Payload": {"run": "r1"}}
    assert scheduled[1]["region"] == "us-east-1"
    assert (scheduled[1]["timeoutInSeconds"], scheduled[1]["heartbeatInSeconds"]) == (7200, 600)
    failed = by_type["TaskFailed"][0]["taskFailedEventDetails"]
    assert failed == {"resourceType": "sagemaker", "resource": "createTrainingJob.sync",
                      "error": "ThrottlingException", "cause": "slow down"}
    submitted = by_type["TaskSubmitted"][0]["taskSubmittedEventDetails"]
    assert json.loads(submitted["output"]) == {"TrainingJobArn": "arn:job"}
    succeeded = by_type["TaskSucceeded"][0]["taskSucceededEventDetails"]
    assert json.loads(succeeded["output"]) == {"Payload": 42, "StatusCode": 200}  # before ResultSelector
    lambda_scheduled = by_type["LambdaFunctionScheduled"][0]["lambdaFunctionScheduledEventDetails"]
    assert lambda_scheduled["resource"] == RESOURCES["Plain"] and lambda_scheduled["timeoutInSeconds"] == 30
    assert "LambdaFunctionStarted" in by_type and "LambdaFunctionSucceeded" in by_type
    assert by_type["TaskStateExited"][0]["stateExitedEventDetails"]["name"] == "Invoke"
    assert json.loads(by_type["TaskStateExited"][0]["stateExitedEventDetails"]["output"])["invoke"] == {"v": 42}


def timeline(events: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """What a status API does: pair each state's Entered and Exited events (seconds from the start)."""
    start = events[0]["timestamp"]
    open_states: dict[str, datetime] = {}
    rows = []
    for event in events:
        if event["type"].endswith("StateEntered"):
            open_states[event["stateEnteredEventDetails"]["name"]] = event["timestamp"]
        elif event["type"].endswith("StateExited"):
            name = event["stateExitedEventDetails"]["name"]
            rows.append((name, (open_states.pop(name) - start).total_seconds(),
                         (event["timestamp"] - start).total_seconds()))
    return rows


def test_a_per_state_timeline_follows_virtual_time() -> None:
    rows = timeline(run_pipeline().history)
    # Train: throttled at 0, retried after 30 s, then 300 s of training; the Wait loop runs twice.
    assert rows == [("Invoke", 0, 0), ("Train", 0, 330), ("Wait", 330, 390), ("Describe", 390, 390),
                    ("Ready?", 390, 390), ("Wait", 390, 450), ("Describe", 450, 450), ("Ready?", 450, 450),
                    ("Plain", 450, 450)]


def test_parallel_branch_events_point_back_to_the_branch_start() -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Parallel", "End": True, "Branches": [
        {"StartAt": "A", "States": {"A": {"Type": "Wait", "Seconds": 5, "End": True}}},
        {"StartAt": "B", "States": {"B": {"Type": "Wait", "Seconds": 20, "End": True}}}]}}}
    execution = StateMachine.from_definition(definition, name="Par").run({})
    events = {e["id"]: e for e in execution.history}
    started = next(e for e in events.values() if e["type"] == "ParallelStateStarted")
    branch_starts = [e for e in events.values() if e["type"] == "WaitStateEntered"]
    assert [e["previousEventId"] for e in branch_starts] == [started["id"], started["id"]]
    # Branches are simulated as concurrent: both start together and the state lasts as long as the longest.
    assert (execution.stop_date - execution.start_date).total_seconds() == 20
    assert {e["timestamp"] for e in branch_starts} == {execution.start_date}


def test_on_event_sees_every_event_live_in_order() -> None:
    seen: list[dict[str, Any]] = []
    execution = run_pipeline(on_event=seen.append)
    assert [e["id"] for e in seen] == [e["id"] for e in execution.history]
    assert seen[-1]["type"] == "ExecutionSucceeded"


def test_a_failing_on_event_callback_does_not_break_the_execution() -> None:
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("display crashed")

    assert run_pipeline(on_event=broken).status == "SUCCEEDED"


def test_history_and_describe_can_be_read_while_running() -> None:
    release = threading.Event()

    def slow(resource: str, parameters: Any, context: TaskContext) -> Any:
        release.wait(60)  # the test releases it once it has read the running execution (not a time)
        return "ok"

    definition = {"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": RESOURCES["Invoke"], "End": True}}}
    before = datetime.now(UTC)
    execution = StateMachine.from_definition(definition, name="Live").start(
        {"a": 1}, executors={"arn:*": slow}, execution_name="live")  # start() runs on the real clock
    assert execution.start_date >= before
    while not any(e["type"] == "TaskStarted" for e in execution.history):
        threading.Event().wait(0.01)
    running = execution.describe()
    assert running["status"] == "RUNNING" and "stopDate" not in running and "output" not in running
    release.set()
    assert execution.wait(30)
    done = execution.describe()
    assert done["status"] == "SUCCEEDED" and json.loads(done["output"]) == "ok"
    assert done["executionArn"] == "arn:aws:states:us-east-1:123456789012:execution:Live:live"
    assert done["stateMachineArn"] == "arn:aws:states:us-east-1:123456789012:stateMachine:Live"
    assert done["stopDate"] >= done["startDate"]


def test_a_failed_execution_records_the_error_and_cause() -> None:
    definition = {"StartAt": "F", "States": {"F": {"Type": "Fail", "Error": "DatasetRejected", "Cause": "3 errors"}}}
    execution = StateMachine.from_definition(definition, name="Fails").run({}, clock=VirtualClock())
    types = [e["type"] for e in execution.history]
    assert types == ["ExecutionStarted", "FailStateEntered", "ExecutionFailed"]
    assert execution.history[-1]["executionFailedEventDetails"] == {"error": "DatasetRejected", "cause": "3 errors"}
    assert execution.describe()["error"] == "DatasetRejected"


def test_map_concurrency_is_simulated_on_the_virtual_clock() -> None:
    def definition(concurrency: int) -> dict[str, Any]:
        return {"StartAt": "M", "States": {"M": {"Type": "Map", "MaxConcurrency": concurrency, "End": True,
                                                 "ItemProcessor": {"StartAt": "W", "States": {
                                                     "W": {"Type": "Wait", "SecondsPath": "$", "End": True}}}}}}

    def iteration_starts(execution: Execution) -> list[float]:
        return [(e["timestamp"] - execution.start_date).total_seconds() for e in execution.history
                if e["type"] == "MapIterationStarted"]

    items = [10, 20, 30, 40]
    for concurrency, starts, total in ((0, [0, 0, 0, 0], 40), (1, [0, 10, 30, 60], 100), (2, [0, 0, 10, 20], 60)):
        execution = StateMachine.from_definition(definition(concurrency), name="M").run(items)
        assert execution.output == items
        assert iteration_starts(execution) == starts
        assert (execution.stop_date - execution.start_date).total_seconds() == total
