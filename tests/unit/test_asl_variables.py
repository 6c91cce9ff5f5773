"""Workflow variables: Assign in JSONPath and JSONata states, $name references, scopes, limits, history.

Cases marked "recorded" reproduce executions recorded on AWS (their outputs and assignedVariables).
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import AslDefinitionError, Clock, Execution, StateMachine, TaskContext, TaskFailed, VirtualClock

START = datetime(2026, 1, 1, tzinfo=UTC)
LAMBDA = "arn:aws:states:::lambda:invoke"


def run(definition: dict[str, Any], data: Any = None, executor: Any = None) -> Execution:
    machine = StateMachine.from_definition(definition, name="Variables")
    executors = {"arn:*": executor} if executor is not None else None
    return machine.run({} if data is None else data, clock=VirtualClock(START), executors=executors,
                       rng=random.Random(0))


def assigned(execution: Execution) -> list[tuple[str, dict[str, Any]]]:
    """(state, assignedVariables as JSON values) for every state that assigned something."""
    out = []
    for event in execution.history:
        details = event.get("stateExitedEventDetails", {})
        if "assignedVariables" in details:
            assert details["assignedVariablesDetails"] == {"truncated": False}
            out.append((details["name"], {k: json.loads(v) for k, v in details["assignedVariables"].items()}))
    return out


def echo(resource: str, parameters: Any, context: TaskContext) -> Any:
    return {"Payload": parameters}


# ----- JSONPath -------------------------------------------------------------------------------------
def test_assign_then_reference_across_states_and_paths() -> None:
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"n": 3, "cfg": {"name": "x", "tags": ["a", "b"]}}, "Next": "B"},
        "B": {"Type": "Pass", "Parameters": {"n.$": "$n", "first.$": "$cfg.tags[0]", "ctx.$": "$$.State.Name",
                                             "text.$": "States.Format('{}-{}', $cfg.name, $n)"}, "Next": "C"},
        "C": {"Type": "Pass", "InputPath": "$cfg", "OutputPath": "$.tags", "End": True}}}
    execution = run(definition)
    assert execution.output == ["a", "b"]
    entered_c = next(e for e in execution.history if e.get("stateEnteredEventDetails", {}).get("name") == "C")
    assert json.loads(entered_c["stateEnteredEventDetails"]["input"]) == {"n": 3, "first": "a", "ctx": "B",
                                                                           "text": "x-3"}


def test_recorded_evaluation_order_a_states_paths_see_the_values_at_entry() -> None:
    definition = {"StartAt": "State0", "States": {
        "State0": {"Type": "Pass", "Result": {"theQuestion": "Q?"},
                   "Assign": {"question.$": "$.theQuestion", "answer": 42}, "Next": "State1"},
        "State1": {"Type": "Pass", "InputPath": "$answer", "ResultPath": "$.theAnswer", "OutputPath": "$answer",
                   "Assign": {"answer": "<omitted>"}, "End": True}}}
    execution = run(definition)
    assert execution.output == 42
    assert assigned(execution) == [("State0", {"question": "Q?", "answer": 42}), ("State1", {"answer": "<omitted>"})]


def test_jsonpath_assign_selects_from_the_states_result() -> None:
    # Pass with Parameters (recorded BASE_ASSIGN_FROM_PARAMETERS): '$' is what Parameters made.
    from_parameters = run({"StartAt": "S", "States": {"S": {
        "Type": "Pass", "Parameters": {"input": "PENDING"}, "Assign": {"result.$": "$.input"}, "End": True}}})
    assert assigned(from_parameters) == [("S", {"result": "PENDING"})]
    # Task: '$' is the result after ResultSelector, before ResultPath/OutputPath.
    task = run({"StartAt": "T", "States": {"T": {
        "Type": "Task", "Resource": LAMBDA, "Parameters": {"v": 1}, "ResultSelector": {"p.$": "$.Payload"},
        "Assign": {"got.$": "$.p.v", "input.$": "$$.Execution.Input.k"}, "ResultPath": "$.r", "End": True}}},
        {"k": "K"}, echo)
    assert assigned(task) == [("T", {"got": 1, "input": "K"})]
    assert task.output == {"k": "K", "r": {"p": {"v": 1}}}


def test_recorded_choice_rule_assign_or_the_states_own_for_default() -> None:
    definition = {"StartAt": "Check", "States": {
        "Check": {"Type": "Choice", "Choices": [
            {"Variable": "$.input_value", "IsPresent": False, "Assign": {"status": "UNKNOWN"}, "Next": "Final"},
            {"Variable": "$.input_value", "NumericEquals": 42, "Assign": {"status": "CORRECT"}, "Next": "Final"}],
            "Assign": {"status": "INCORRECT", "guess.$": "$.input_value"}, "Default": "Final"},
        "Final": {"Type": "Pass", "Parameters": {"result.$": "$status"}, "End": True}}}
    assert run(definition, {"input_value": "42"}).output == {"result": "INCORRECT"}  # a string: Default
    assert run(definition, {"input_value": 42}).output == {"result": "CORRECT"}
    assert run(definition, {}).output == {"result": "UNKNOWN"}


def test_recorded_reference_in_fail_paths() -> None:
    execution = run({"StartAt": "Pass", "States": {
        "Pass": {"Type": "Pass", "Assign": {"errorVar": "Exception", "causeVar": "An Exception was encountered"},
                 "Next": "Fail"},
        "Fail": {"Type": "Fail", "CausePath": "$causeVar", "ErrorPath": "$errorVar"}}})
    assert (execution.error, execution.cause) == ("Exception", "An Exception was encountered")


def test_variables_in_wait_items_and_concurrency_paths() -> None:
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"wait": 30, "items": [1, 2], "limit": 1}, "Next": "W"},
        "W": {"Type": "Wait", "SecondsPath": "$wait", "Next": "M"},
        "M": {"Type": "Map", "ItemsPath": "$items", "MaxConcurrencyPath": "$limit",
              "ItemSelector": {"v.$": "$$.Map.Item.Value", "w.$": "$wait"},
              "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}, "End": True}}}
    execution = run(definition)
    assert execution.output == [{"v": 1, "w": 30}, {"v": 2, "w": 30}]
    assert execution.stop_date is not None and (execution.stop_date - execution.start_date).total_seconds() == 30


def test_catch_assign_in_jsonpath_selects_from_the_error_output() -> None:
    def boom(resource: str, parameters: Any, context: TaskContext) -> Any:
        raise TaskFailed("Boom", "why")

    definition = {"StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "Assign": {"ok": True}, "End": True,
              "Catch": [{"ErrorEquals": ["States.ALL"], "Assign": {"err.$": "$.Error"}, "ResultPath": "$.e",
                         "Next": "F"}]},
        "F": {"Type": "Pass", "Parameters": {"err.$": "$err", "e.$": "$.e.Cause"}, "End": True}}}
    execution = run(definition, {}, boom)
    assert execution.output == {"err": "Boom", "e": "why"}
    assert assigned(execution) == [("T", {"err": "Boom"})]  # the failed attempt's own Assign never happened


def test_an_undefined_variable_is_a_runtime_error() -> None:
    execution = run({"StartAt": "S", "States": {"S": {"Type": "Pass", "Parameters": {"v.$": "$nope"},
                                                       "End": True}}})
    assert execution.error == "States.Runtime" and "$nope" in (execution.cause or "")


# ----- scopes --------------------------------------------------------------------------------------
def test_recorded_map_scope_reads_outer_and_keeps_its_own() -> None:
    definition = {"StartAt": "State0", "States": {
        "State0": {"Type": "Pass", "Assign": {"x": 42, "items": [1, 2, 3]}, "Next": "State1"},
        "State1": {"Type": "Map", "ItemsPath": "$items", "MaxConcurrency": 1,
                   "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Inner", "States": {
                       "Inner": {"Type": "Pass", "Assign": {"innerX.$": "$x", "x": 0}, "End": True}}},
                   "Next": "State2"},
        "State2": {"Type": "Pass", "Assign": {"final.$": "$x"}, "End": True}}}
    execution = run(definition, {"input_value": "v"})
    assert execution.output == [1, 2, 3]
    # Each iteration reads the outer x (42) even after an earlier iteration assigned its own x.
    assert assigned(execution) == [("State0", {"x": 42, "items": [1, 2, 3]}),
                                   *[("Inner", {"innerX": 42, "x": 0})] * 3, ("State2", {"final": 42})]
    leak = json.loads(json.dumps(definition))
    leak["States"]["State2"]["Assign"] = {"final.$": "$innerX"}
    assert run(leak).error == "States.Runtime"  # an iteration's variables stay inside it


def test_parallel_branches_are_isolated_from_each_other() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"x": 1}, "Next": "P"},
        "P": {"Type": "Parallel", "Next": "After", "Branches": [
            {"StartAt": "B1", "States": {
                "B1": {"Type": "Pass", "Assign": {"x": 2, "mine": "b1"}, "Next": "B1b"},
                "B1b": {"Type": "Pass", "Output": {"x": "{% $x %}", "mine": "{% $mine %}"}, "End": True}}},
            {"StartAt": "B2", "States": {
                "B2": {"Type": "Pass", "Output": {"x": "{% $x %}", "mine": "{% $exists($mine) %}"}, "End": True}}}]},
        "After": {"Type": "Pass", "Output": {"x": "{% $x %}", "branches": "{% $states.input %}"}, "End": True}}}
    assert run(definition).output == {"x": 1, "branches": [{"x": 2, "mine": "b1"}, {"x": 1, "mine": False}]}


# ----- JSONata -------------------------------------------------------------------------------------
def test_jsonata_assign_and_output_both_see_values_at_entry() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"n": 1}, "Next": "B"},
        "B": {"Type": "Pass", "Assign": {"n": "{% $n + 1 %}", "m": "{% $n + 10 %}"}, "Output": {"n": "{% $n %}"},
              "Next": "C"},
        "C": {"Type": "Pass", "Output": {"n": "{% $n %}", "m": "{% $m %}", "in": "{% $states.input %}"},
              "End": True}}}
    assert run(definition).output == {"n": 2, "m": 11, "in": {"n": 1}}


def test_jsonata_assign_undefined_names_the_field() -> None:
    execution = run({"QueryLanguage": "JSONata", "StartAt": "State0", "States": {"State0": {
        "Type": "Pass", "Assign": {"result": "{% $doesNotExist %}"}, "End": True}}})
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == ("An error occurred while executing the state 'State0' (entered at the event id #2). "
                               "The JSONata expression '$doesNotExist' specified for the field 'Assign/result' "
                               "returned nothing (undefined).")


def test_jsonata_reads_variables_assigned_by_jsonpath_and_back() -> None:
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "QueryLanguage": "JSONata", "Assign": {"v": "{% {'deep': [1, null]} %}"}, "Next": "B"},
        "B": {"Type": "Pass", "Parameters": {"v.$": "$v.deep"}, "Assign": {"w.$": "$v.deep[0]"}, "Next": "C"},
        "C": {"Type": "Pass", "QueryLanguage": "JSONata", "Output": "{% {'w': $w, 'v': $states.input.v} %}",
              "End": True}}}
    assert run(definition).output == {"w": 1, "v": [1, None]}


# ----- names and limits ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "problem"), [("states", "reserved"), ("1abc", "not a valid variable name"),
                                               ("a-b", "not a valid variable name"), ("x" * 81, "at most 80")])
def test_bad_variable_names_are_refused_at_load(name: str, problem: str) -> None:
    with pytest.raises(AslDefinitionError) as raised:
        StateMachine.from_definition({"StartAt": "S", "States": {"S": {"Type": "Pass", "Assign": {name: 1},
                                                                        "End": True}}})
    assert any(problem in p for p in raised.value.problems), raised.value.problems


def test_unicode_and_underscore_names_are_fine() -> None:
    execution = run({"StartAt": "S", "States": {"S": {"Type": "Pass", "Assign": {"_é1": 1, "Ñame": 2},
                                                       "End": True}}})
    assert assigned(execution) == [("S", {"_é1": 1, "Ñame": 2})]


def test_a_variable_over_256_kib_fails_the_state() -> None:
    execution = run({"StartAt": "S", "States": {"S": {"Type": "Pass", "Assign": {"big.$": "$.s"}, "End": True}}},
                    {"s": "x" * (200 * 1024)})
    assert execution.status == "SUCCEEDED"
    two = run({"StartAt": "S", "States": {"S": {"Type": "Pass", "Assign": {"a.$": "$.s", "b.$": "$.s"},
                                                 "End": True}}}, {"s": "x" * (200 * 1024)})
    assert two.error == "States.DataLimitExceeded"  # one Assign is at most 256 KiB in all


def test_variables_reach_map_iterations_on_worker_threads() -> None:
    # On a real clock iterations run on a thread pool: the ItemSelector and the inner states must still
    # read the Map state's variables (not whatever the worker thread last saw).
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"x": 5}, "Next": "M"},
        "M": {"Type": "Map", "ItemsPath": "$.items", "ItemSelector": {"v.$": "$$.Map.Item.Value", "x.$": "$x"},
              "ItemProcessor": {"StartAt": "P", "States": {"P": {
                  "Type": "Pass", "Parameters": {"sum.$": "States.MathAdd($.v, $x)"}, "End": True}}},
              "End": True}}}
    execution = StateMachine.from_definition(definition).run({"items": list(range(8))}, clock=Clock())
    assert execution.output == [{"sum": i + 5} for i in range(8)], (execution.error, execution.cause)


def test_the_execution_limit_counts_live_variables_not_every_iterations() -> None:
    # 60 iterations each holding 200 KiB: 12 MB assigned in all, but never more than 200 KiB alive.
    definition = {"StartAt": "M", "States": {"M": {
        "Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 1, "End": True,
        "ItemSelector": {"s.$": "$.s"},
        "ItemProcessor": {"StartAt": "P", "States": {
            "P": {"Type": "Pass", "Assign": {"big.$": "$.s"}, "Next": "Small"},
            "Small": {"Type": "Pass", "Result": 0, "End": True}}}}}}
    execution = run(definition, {"items": list(range(60)), "s": "x" * (200 * 1024)})
    assert execution.status == "SUCCEEDED", execution.cause
    many = {"StartAt": "A", "States": {f"A{i}" if i else "A": {
        "Type": "Pass", "Assign": {f"v{i}.$": "$.s"}, **({"Next": f"A{i + 1}"} if i < 59 else {"End": True})}
        for i in range(60)}}
    assert run(many, {"s": "x" * (200 * 1024)}).error == "States.DataLimitExceeded"  # 60 live values: 12 MB
