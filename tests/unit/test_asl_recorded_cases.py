"""Corners found by replaying runs AWS recorded (the snapshots of LocalStack's Step Functions suite, recorded
against AWS; the snapshot test is named in each docstring) through the interpreter. Our own definitions and
inputs; only the service's words and results are the service's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import StateMachine, TaskFailed, VirtualClock

START = datetime(2026, 1, 1, tzinfo=UTC)


def run(definition: dict[str, Any], data: Any = None, **options: Any) -> Any:
    return StateMachine.from_definition(definition).run(data, clock=VirtualClock(START), **options)


def jsonata_pass(output: str) -> dict[str, Any]:
    return {"QueryLanguage": "JSONata", "StartAt": "P", "States": {"P": {"Type": "Pass", "Output": output,
                                                                         "End": True}}}


@pytest.mark.parametrize(("expression", "expected"), [
    ("{% $range(4, 11, 7) %}", [4, 11]),
    ("{% $range(4, 10, 7) %}", 4),   # one element: the value itself, as JSONata gives a one-item sequence
    ("{% $range(3, 3, 1) %}", 3),
    ("{% [$range(3, 3, 1)] %}", [3]),
])
def test_jsonata_range_of_one_element_is_that_element(expression: str, expected: Any) -> None:
    """AWS-recorded (test_array_jsonata::test_array_range, $range(1, 9, 9) -> 1). Mutation: $range returning
    a plain array ([4]), as States.ArrayRange does."""
    execution = run(jsonata_pass(expression))
    assert (execution.status, execution.output) == ("SUCCEEDED", expected)


def test_jsonata_partition_keeps_a_single_chunk_an_array() -> None:
    """AWS-recorded (test_array_jsonata::test_array_partition, $partition([0], 1) -> [[0]]): unlike $range,
    one chunk stays wrapped. Mutation: collapsing every one-item function result."""
    execution = run(jsonata_pass("{% $partition([5], 3) %}"))
    assert execution.output == [[5]]


def inline_jsonata_map(processor_state: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"QueryLanguage": "JSONata", "StartAt": "M", "States": {"M": {
        "Type": "Map", "Items": [7, 8], "End": True, **fields,
        "ItemProcessor": {"StartAt": "P", "States": {"P": processor_state}}}}}


@pytest.mark.parametrize("fields", [{"ToleratedFailureCount": 3}, {"ToleratedFailurePercentage": 50},
                                    {"ToleratedFailureCount": "{% $n := 1 %}"}])
def test_an_inline_jsonata_map_accepts_tolerated_failure_fields(fields: dict[str, Any]) -> None:
    """AWS-recorded (test_base_evaluate_expressions::test_base_map[TOLERATED_FAILURE_COUNT] and
    [TOLERATED_FAILURE_PERCENTAGE]): an inline JSONata Map with these fields is created and runs. Mutation: the
    load-time refusal 'only a Distributed Map has this field'."""
    execution = run(inline_jsonata_map({"Type": "Pass", "End": True}, **fields))
    assert (execution.status, execution.output) == ("SUCCEEDED", [7, 8])


def test_tolerated_failures_do_not_apply_to_an_inline_map() -> None:
    """The Inline Map page: an iteration that fails fails the Map state, so a tolerated count changes nothing.
    Mutation: letting the inline Map tolerate the failure."""
    execution = run(inline_jsonata_map({"Type": "Fail", "Error": "Boom"}, ToleratedFailureCount=5))
    assert (execution.status, execution.error) == ("FAILED", "Boom")


def _failing_task(resource: str, parameters: Any, context: Any) -> Any:
    raise TaskFailed("Sprocket.Jammed", "the sprocket jammed")


def task(**fields: Any) -> dict[str, Any]:
    return {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "Parameters": {"FunctionName": "gear"},
            **fields}


def _chain(execution: Any) -> list[tuple[int, int, str]]:
    return [(e["id"], e["previousEventId"], e["type"]) for e in execution.history]


def test_a_task_failing_a_parallel_branch_is_recorded_aborted() -> None:
    """AWS-recorded (test_callback::test_sqs_failure_in_wait_for_task_tok_no_error_field
    [SQS_PARALLEL_WAIT_FOR_TASK_TOKEN], test_error_output::test_parallel_catch_error): after the branch's
    TaskFailed (8) come TaskStateAborted (9, previous 8) and ParallelStateFailed (10, previous 8). Mutation: no
    TaskStateAborted, or one that moves the chain (ParallelStateFailed after 9)."""
    definition = {"StartAt": "Fan", "States": {
        "Fan": {"Type": "Parallel", "Branches": [{"StartAt": "Work", "States": {"Work": task(End=True)}}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Recover"}], "End": True},
        "Recover": {"Type": "Pass", "End": True}}}
    execution = run(definition, {"job": 1}, executors={"*": _failing_task})
    assert _chain(execution)[6:10] == [(7, 6, "TaskFailed"), (8, 7, "TaskStateAborted"),
                                       (9, 7, "ParallelStateFailed"), (10, 9, "ParallelStateExited")]
    assert execution.status == "SUCCEEDED"


def test_a_task_failing_a_map_iteration_is_recorded_aborted_after_the_iteration() -> None:
    """AWS-recorded (test_timeouts::test_service_lambda_map_timeout): TaskTimedOut (20), MapIterationFailed
    (24, previous 20), TaskStateAborted (25, previous 20) ... MapStateFailed (32, previous 20). Mutation: the
    aborted event before the iteration's, or MapStateFailed chained to another event."""
    definition = {"StartAt": "Each", "States": {"Each": {
        "Type": "Map", "ItemProcessor": {"StartAt": "Work", "States": {"Work": task(End=True)}}, "End": True}}}
    execution = run(definition, [3], executors={"*": _failing_task})
    assert _chain(execution)[7:] == [(8, 7, "TaskFailed"), (9, 8, "MapIterationFailed"), (10, 8, "TaskStateAborted"),
                                     (11, 8, "MapStateFailed"), (12, 11, "ExecutionFailed")]
    assert (execution.error, execution.cause) == ("Sprocket.Jammed", "the sprocket jammed")


def test_a_task_failing_outside_branches_or_caught_by_itself_is_not_aborted() -> None:
    """AWS-recorded (every top-level Task failure: TaskFailed then ExecutionFailed; a Fail state in a branch:
    no FailStateAborted, test_base_scenarios::test_parallel_state_fail). Mutation: recording the aborted event
    for every failing state."""
    top = run({"StartAt": "Work", "States": {"Work": task(End=True)}}, {}, executors={"*": _failing_task})
    assert [e["type"] for e in top.history][-2:] == ["TaskFailed", "ExecutionFailed"]
    caught = task(Catch=[{"ErrorEquals": ["States.ALL"], "Next": "Done"}], Next="Done")
    branch = {"StartAt": "Work", "States": {"Work": caught, "Done": {"Type": "Pass", "End": True}}}
    inside = run({"StartAt": "Fan", "States": {"Fan": {"Type": "Parallel", "Branches": [
        branch, {"StartAt": "Stop", "States": {"Stop": {"Type": "Fail", "Error": "Halt"}}}], "End": True}}},
        {}, executors={"*": _failing_task})
    assert "TaskStateAborted" not in [e["type"] for e in inside.history]
    assert "FailStateAborted" not in [e["type"] for e in inside.history]
    assert inside.error == "Halt"


def _oversized(resource: str, parameters: Any, context: Any) -> Any:
    return {"Payload": "é" * 140_000}  # 280,000 UTF-8 bytes: over 256 KiB


TOO_LARGE = "The state/task '{who}' returned a result with a size exceeding the maximum number of bytes service limit."


@pytest.mark.parametrize(("resource", "who", "failed"), [
    ("arn:aws:states:::lambda:invoke", "lambda", "TaskFailed"),
    ("arn:aws:lambda:us-east-1:123456789012:function:shrink", "arn:aws:lambda:us-east-1:123456789012:function:shrink",
     "LambdaFunctionFailed"),
])
def test_an_oversized_task_result_is_a_task_failure_states_all_catches(resource: str, who: str, failed: str) -> None:
    """AWS-recorded (test_states_errors::test_service_task_lambada_catch_state_all_data_limit_exceeded_on_large_
    utf8_response and test_task_lambda_catch_state_all_...): the task fails with States.DataLimitExceeded, its
    cause naming the integration ('lambda') or the function ARN, and a States.ALL catcher takes it. Mutations: the
    error left terminal for States.ALL; the cause naming the state."""
    definition = {"StartAt": "Shrink", "States": {
        "Shrink": {"Type": "Task", "Resource": resource, "Next": "Done",
                   "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Recover"}]},
        "Done": {"Type": "Pass", "End": True}, "Recover": {"Type": "Pass", "End": True}}}
    execution = run(definition, {"n": 1}, executors={"*": _oversized})
    expected = {"Error": "States.DataLimitExceeded", "Cause": TOO_LARGE.format(who=who)}
    assert (execution.status, execution.output) == ("SUCCEEDED", expected)
    failure = next(e for e in execution.history if e["type"] == failed)
    details = next(v for k, v in failure.items() if k.endswith("EventDetails"))
    assert (details["error"], details["cause"]) == (expected["Error"], expected["Cause"])
    assert [e["type"] for e in execution.history][5:7] == ["TaskStateExited", "PassStateEntered"]


def _slow(resource: str, parameters: Any, context: Any) -> Any:
    context.sleep(30)
    return {"late": True}


@pytest.mark.parametrize(("resource", "event_type"), [
    ("arn:aws:states:::lambda:invoke", "TaskTimedOut"),
    ("arn:aws:lambda:us-east-1:123456789012:function:slow", "LambdaFunctionTimedOut"),
])
def test_a_task_past_its_timeout_records_no_cause_and_is_caught_with_an_empty_one(resource: str,
                                                                                  event_type: str) -> None:
    """AWS-recorded (test_timeouts::test_fixed_timeout_service_lambda, test_fixed_timeout_lambda: the timed-out
    event and ExecutionFailed carry States.Timeout and no cause; test_task_service_lambda::test_invoke_timeout:
    the catcher's error output is {"Error": "States.Timeout", "Cause": ""}). Mutations: the interpreter's own
    cause text; the Cause key left out of the error output, as for other errors without a cause."""
    slow = {"Type": "Task", "Resource": resource, "TimeoutSeconds": 5, "End": True}
    if resource.endswith("invoke"):
        slow["Parameters"] = {"FunctionName": "f"}
    uncaught = run({"StartAt": "Slow", "States": {"Slow": slow}}, {"job": 2}, executors={"*": _slow})
    assert (uncaught.error, uncaught.cause) == ("States.Timeout", None)
    timed_out = next(e for e in uncaught.history if e["type"] == event_type)
    assert "cause" not in next(v for k, v in timed_out.items() if k.endswith("EventDetails"))
    catching = {**slow, "Catch": [{"ErrorEquals": ["States.Timeout"], "Next": "Late", "ResultPath": "$.error"}]}
    caught = run({"StartAt": "Slow", "States": {"Slow": catching, "Late": {"Type": "Pass", "End": True}}},
                 {"job": 2}, executors={"*": _slow})
    assert caught.output == {"job": 2, "error": {"Error": "States.Timeout", "Cause": ""}}


def test_a_caught_fail_state_without_cause_still_has_no_cause_key() -> None:
    """Guard for the timeout's empty Cause: a Fail state without a Cause caught from a Parallel gives
    {"Error": ...} alone (the interpreter's reading; only the task timeout's empty Cause is recorded)."""
    definition = {"StartAt": "Fan", "States": {
        "Fan": {"Type": "Parallel", "Branches": [{"StartAt": "Stop", "States": {"Stop": {"Type": "Fail",
                                                                                            "Error": "Halt"}}}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Seen"}], "End": True},
        "Seen": {"Type": "Pass", "End": True}}}
    assert run(definition, {}).output == {"Error": "Halt"}


def _echo(resource: str, parameters: Any, context: Any) -> Any:
    return {"kept": {"inner": 1}}


PATH_PREFIX = ("An error occurred while executing the state 'Echo' (entered at the event id #2). "
               "Invalid path '{path}' : ")


@pytest.mark.parametrize(("path", "detail"), [
    ("$.lost.deeper.still", "Missing property in path $['lost']"),
    ("$.kept.gone.deeper", "Missing property in path $['kept']['gone']"),
    ("$.kept.gone", "No results for path: $['kept']['gone']"),
    ("$.lost", "No results for path: $['lost']"),
])
def test_a_path_through_a_missing_property_names_where_it_stops(path: str, detail: str) -> None:
    """AWS-recorded (test_base_scenarios::test_catch_states_runtime: OutputPath '$.no.such.result.path' over a
    result without 'no' fails with "Missing property in path $['no']"; test_invalid_jsonpath: a missing last
    name reads "No results for path: $['NoSuchOutputPath']"). Mutation: every miss worded as "No results for
    path" with the whole path."""
    definition = {"StartAt": "Echo", "States": {"Echo": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                                                         "Parameters": {"FunctionName": "f"}, "OutputPath": path,
                                                         "End": True}}}
    execution = run(definition, {}, executors={"*": _echo})
    assert (execution.error, execution.cause) == ("States.Runtime", PATH_PREFIX.format(path=path) + detail)


def test_an_input_path_through_a_missing_property_names_where_it_stops() -> None:
    """The same engine reads InputPath. Mutation: the new words only for OutputPath."""
    definition = {"StartAt": "Echo", "States": {"Echo": {"Type": "Pass", "InputPath": "$.a.b", "End": True}}}
    execution = run(definition, {"z": 1})
    assert execution.cause == ("An error occurred while executing the state 'Echo' (entered at the event id #2). "
                               "Invalid path '$.a.b' : Missing property in path $['a']")
