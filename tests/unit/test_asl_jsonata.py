"""JSONata states in the interpreter: Arguments/Output/Condition/Items/ItemSelector, $states, the functions
Step Functions adds, mixed JSONPath/JSONata machines, and the errors AWS gives.

Expected causes are the service's recorded words (States.QueryEvaluationError, "An error occurred while
executing the state '<name>' (entered at the event id #<n>). The JSONata expression '<expr>' specified for
the field '<field>' ..."); load-time refusals are CreateStateMachine's words where AWS documents them.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import AslDefinitionError, Execution, StateMachine, TaskContext, TaskFailed, VirtualClock

START = datetime(2026, 1, 1, tzinfo=UTC)
LAMBDA = "arn:aws:states:::lambda:invoke"
PREFIX = "An error occurred while executing the state 'S' (entered at the event id #2)."


def run(definition: dict[str, Any], data: Any = None, executor: Any = None, seed: int = 0) -> Execution:
    machine = StateMachine.from_definition(definition, name="Jsonata")
    executors = {"arn:*": executor} if executor is not None else None
    return machine.run({} if data is None else data, clock=VirtualClock(START), executors=executors,
                       rng=random.Random(seed))


def one(state: dict[str, Any]) -> dict[str, Any]:
    ending = {} if state["Type"] in ("Succeed", "Fail", "Choice") else {"End": True}
    return {"QueryLanguage": "JSONata", "StartAt": "S", "States": {"S": {**ending, **state}}}


def echo(resource: str, parameters: Any, context: TaskContext) -> Any:
    return {"Payload": parameters}


def refusals(definition: dict[str, Any]) -> list[str]:
    with pytest.raises(AslDefinitionError) as raised:
        StateMachine.from_definition(definition)
    return raised.value.problems


# ----- Pass, Task, Choice, Wait, Succeed, Fail -------------------------------------------------------
def test_pass_output_reads_states_input_and_any_json_value() -> None:
    execution = run(one({"Type": "Pass", "Output": {"sum": "{% $states.input.a + $states.input.b %}",
                                                    "literal": "$.not.a.path", "list": ["{% $states.input.a %}", 2]}}),
                    {"a": 1, "b": 2.5})
    assert execution.output == {"sum": 3.5, "literal": "$.not.a.path", "list": [1, 2]}
    assert run(one({"Type": "Pass", "Output": "{% $states.input.a * 2 %}"}), {"a": 3}).output == 6
    assert run(one({"Type": "Pass"}), {"keep": True}).output == {"keep": True}  # no Output: the input


def test_json_null_stays_null_and_undefined_fails_naming_field() -> None:
    assert run(one({"Type": "Pass", "Output": {"v": "{% $states.input.n %}"}}), {"n": None}).output == {"v": None}
    execution = run(one({"Type": "Pass", "Output": {"result": "{% $doesNotExist %}"}}))
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '$doesNotExist' specified for the field "
                               "'Output/result' returned nothing (undefined).")


def test_task_arguments_output_and_states_result() -> None:
    definition = one({"Type": "Task", "Resource": LAMBDA,
                      "Arguments": {"FunctionName": "f", "Payload": {"x": "{% $states.input.x %}"}},
                      "Output": {"in": "{% $states.input %}", "got": "{% $states.result.Payload.Payload.x %}"}})
    execution = run(definition, {"x": 7}, echo)
    assert execution.output == {"in": {"x": 7}, "got": 7}
    scheduled = next(e for e in execution.history if e["type"] == "TaskScheduled")
    assert json.loads(scheduled["taskScheduledEventDetails"]["parameters"]) == {"FunctionName": "f",
                                                                                "Payload": {"x": 7}}
    # Without Arguments the task gets the state input; without Output the result is the state output.
    assert run(one({"Type": "Task", "Resource": LAMBDA}), {"x": 1}, echo).output == {"Payload": {"x": 1}}


def test_task_timeout_from_an_expression() -> None:
    def slow(resource: str, parameters: Any, context: TaskContext) -> Any:
        context.sleep(10)
        return {}

    execution = run(one({"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": "{% $states.input.t %}"}), {"t": 3},
                    slow)
    assert execution.error == "States.Timeout"
    bad = run(one({"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": "{% 'soon' %}"}), {}, slow)
    assert bad.error == "States.QueryEvaluationError" and "Expected 'integer', but was 'string'" in (bad.cause or "")


def test_choice_condition_routes_and_rule_assign_output_replace_the_states() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "C", "States": {
        "C": {"Type": "Choice", "Choices": [
            {"Condition": "{% $states.input.n > 5 %}", "Next": "Big", "Assign": {"kind": "big"},
             "Output": "rule output"}],
            "Default": "Small", "Assign": {"kind": "small"}, "Output": {"n": "{% $states.input.n %}"}},
        "Big": {"Type": "Pass", "Output": {"kind": "{% $kind %}", "in": "{% $states.input %}"}, "End": True},
        "Small": {"Type": "Pass", "Output": {"kind": "{% $kind %}", "in": "{% $states.input %}"}, "End": True}}}
    assert run(definition, {"n": 9}).output == {"kind": "big", "in": "rule output"}
    assert run(definition, {"n": 1}).output == {"kind": "small", "in": {"n": 1}}


def test_choice_condition_must_be_boolean_and_no_match_without_default_fails() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "S", "States": {
        "S": {"Type": "Choice", "Choices": [{"Condition": "{% $states.input.v %}", "Next": "E"}]},
        "E": {"Type": "Succeed"}}}
    execution = run(definition, {"v": "yes"})
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '$states.input.v' specified for the field "
                               "'Choices[0]/Condition' returned an unexpected result type. Expected 'boolean', but "
                               "was 'string' for value: \"yes\"")
    assert run(definition, {"v": False}).error == "States.NoChoiceMatched"


def test_wait_seconds_and_timestamp_expressions_advance_the_clock() -> None:
    seconds = run(one({"Type": "Wait", "Seconds": "{% $states.input.s %}", "Output": "{% $states.input.s %}"}),
                  {"s": 30})
    assert seconds.output == 30 and seconds.stop_date is not None
    assert (seconds.stop_date - seconds.start_date).total_seconds() == 30
    stamp = run(one({"Type": "Wait", "Timestamp": "{% $states.input.at %}"}), {"at": "2026-01-01T00:02:00Z"})
    assert stamp.status == "SUCCEEDED" and stamp.stop_date is not None
    assert (stamp.stop_date - stamp.start_date).total_seconds() == 120


def test_fail_error_and_cause_from_expressions() -> None:
    execution = run(one({"Type": "Fail", "Error": "{% 'Bad' & $states.input.kind %}", "Cause": "{% $string(1) %}"}),
                    {"kind": "Input"})
    assert (execution.error, execution.cause) == ("BadInput", "1")
    assert run(one({"Type": "Fail", "Error": "{% 1 %}"})).error == "States.QueryEvaluationError"


def test_succeed_output() -> None:
    assert run(one({"Type": "Succeed", "Output": {"ok": "{% $states.input.a %}"}}), {"a": 1}).output == {"ok": 1}


# ----- Map and Parallel --------------------------------------------------------------------------
def test_map_items_item_selector_and_output_of_results() -> None:
    definition = one({"Type": "Map", "Items": "{% $states.input.things %}",
                      "ItemSelector": {"value": "{% $states.context.Map.Item.Value %}",
                                       "index": "{% $states.context.Map.Item.Index %}",
                                       "tag": "{% $states.input.tag %}"},
                      "ItemProcessor": {"StartAt": "P", "States": {"P": {
                          "Type": "Pass", "Output": "{% $states.input.value & '-' & $states.input.tag %}",
                          "End": True}}},
                      "Output": {"all": "{% $states.result %}", "count": "{% $count($states.result) %}"}})
    execution = run(definition, {"things": ["a", "b"], "tag": "t"})
    assert execution.output == {"all": ["a-t", "b-t"], "count": 2}
    literal = one({"Type": "Map", "Items": [1, "{% $states.input.x %}"],
                   "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}})
    assert run(literal, {"x": 5}).output == [1, 5]


@pytest.mark.parametrize(("items", "kind", "shown"), [
    ("{% 'string' %}", "string", '"string"'), ("{% 1 %}", "number", "1"), ("{% null %}", "null", "null"),
    ("{% true %}", "boolean", "true"), ("{% {'foo': 'bar'} %}", "object", '{"foo":"bar"}')])
def test_map_items_that_are_not_an_array(items: str, kind: str, shown: str) -> None:
    execution = run(one({"Type": "Map", "Items": items,
                         "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}}))
    expression = items[2:-2].strip()
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '{expression}' specified for the field 'Items' "
                               f"returned an unexpected result type. Expected 'array', but was '{kind}' for value: "
                               f"{shown}")


def test_map_items_function_is_an_unsupported_result_type() -> None:
    execution = run(one({"Type": "Map", "Items": "{% $fn := function($x){$x} %}",
                         "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}}))
    assert execution.cause == (f"{PREFIX} The JSONata expression '$fn := function($x){{$x}}' specified for the field "
                               "'Items' returned an unsupported result type.")


def test_parallel_arguments_and_output() -> None:
    definition = one({"Type": "Parallel", "Arguments": {"v": "{% $states.input.v %}"},
                      "Branches": [{"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True,
                                                                     "Output": "{% $states.input.v + 1 %}"}}},
                                   {"StartAt": "B", "States": {"B": {"Type": "Pass", "End": True}}}],
                      "Output": {"r": "{% $states.result %}"}})
    assert run(definition, {"v": 1, "other": 0}).output == {"r": [2, {"v": 1}]}


# ----- errors, Catch --------------------------------------------------------------------------------
def test_catch_output_and_assign_see_the_error_output() -> None:
    def boom(resource: str, parameters: Any, context: TaskContext) -> Any:
        raise TaskFailed("Boom", "it broke")

    definition = {"QueryLanguage": "JSONata", "StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "Assign": {"where": "task"},
              "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "F",
                         "Assign": {"where": "catch", "err": "{% $states.errorOutput.Error %}"},
                         "Output": {"input": "{% $states.input %}", "error": "{% $states.errorOutput %}"}}],
              "End": True},
        "F": {"Type": "Pass", "Output": {"in": "{% $states.input %}", "where": "{% $where %}", "err": "{% $err %}"},
              "End": True}}}
    execution = run(definition, {"x": 1}, boom)
    assert execution.output == {"in": {"input": {"x": 1}, "error": {"Error": "Boom", "Cause": "it broke"}},
                                "where": "catch", "err": "Boom"}
    without_output = json.loads(json.dumps(definition))
    del without_output["States"]["T"]["Catch"][0]["Output"]
    assert run(without_output, {"x": 1}, boom).output["in"] == {"Error": "Boom", "Cause": "it broke"}


def test_query_evaluation_errors_can_be_caught() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "T", "States": {
        "T": {"Type": "Task", "Resource": LAMBDA, "Output": "{% $states.result.missing %}", "End": True,
              "Catch": [{"ErrorEquals": ["States.QueryEvaluationError"], "Next": "F"}]},
        "F": {"Type": "Pass", "Output": "{% $states.input.Error %}", "End": True}}}
    assert run(definition, {}, echo).output == "States.QueryEvaluationError"


def test_jsonata_runtime_errors_carry_the_code_and_message() -> None:
    execution = run(one({"Type": "Pass", "Output": "{% $sum('a') %}"}))
    assert execution.cause == (f"{PREFIX} The JSONata expression '$sum('a')' specified for the field 'Output' threw an "
                               "error during evaluation. T0412: Argument 1 of function \"sum\" must be an array of "
                               "\"numbers\"")
    # $eval is the one JSONata function Step Functions leaves out.
    assert run(one({"Type": "Pass", "Output": "{% $eval('1+1') %}"})).cause == (
        f"{PREFIX} The JSONata expression '$eval('1+1')' specified for the field 'Output' threw an error during "
        "evaluation. T1006: Attempted to invoke a non-function")


def test_an_endless_expression_ends_within_the_time_bound() -> None:
    # A tail call never deepens the stack: only the time bound ends it. The bound is per evaluation,
    # not per parsed (cached) expression: one parsed before the loop still runs after it.
    quick = one({"Type": "Pass", "Output": "{% $states.input.a + 1 %}"})
    assert run(quick, {"a": 1}).output == 2
    loop = "( $f := function($x){ $f($x + 1) }; $f(1) )"
    started = time.monotonic()
    execution = run(one({"Type": "Pass", "Output": "{% " + loop + " %}"}))
    assert time.monotonic() - started < 30
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '{loop}' specified for the field 'Output' threw an "
                               "error during evaluation. D1012: Evaluation timeout after 5000 milliseconds. Check "
                               "for infinite loop")
    assert run(quick, {"a": 2}).output == 3


def test_runaway_recursion_is_a_stack_overflow() -> None:
    recursion = "( $f := function($x){ 1 + $f($x + 1) }; $f(1) )"
    execution = run(one({"Type": "Pass", "Output": "{% " + recursion + " %}"}))
    assert execution.cause == (f"{PREFIX} The JSONata expression '{recursion}' specified for the field 'Output' threw "
                               "an error during evaluation. D1011: Stack overflow. Check for non-terminating "
                               "recursive function.  Consider rewriting as tail-recursive")
    # A recursion that ends is evaluated.
    countdown = "{% ( $f := function($n){ $n = 0 ? 0 : 1 + $f($n - 1) }; $f(20) ) %}"
    assert run(one({"Type": "Pass", "Output": countdown})).output == 20


def nested(levels: int) -> str:
    return "{% $reduce([1.." + str(levels) + "], function($a, $v){ {\"a\": $a} }, {}) %}"


def test_a_deeply_nested_result_is_a_one_line_query_evaluation_error() -> None:
    text = nested(3000)
    execution = run(one({"Type": "Pass", "Output": text}))
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '{text[2:-2].strip()}' specified for the field "
                               "'Output' returned a value nested more than 500 levels deep, more than a state's data "
                               "may be.")
    assigned = run({"QueryLanguage": "JSONata", "StartAt": "S", "States": {
        "S": {"Type": "Pass", "Assign": {"x": nested(900)}, "Next": "T"},
        "T": {"Type": "Pass", "Output": "{% $x %}", "End": True}}})
    assert assigned.error == "States.QueryEvaluationError"
    assert "specified for the field 'Assign/x' returned a value nested more than 500 levels deep" in (
        assigned.cause or "")


def test_a_nested_result_within_the_limit_keeps_its_shape_and_order() -> None:
    value: Any = run(one({"Type": "Pass", "Output": nested(450)})).output
    depth = 0
    while value:
        assert list(value) == ["a"]
        value, depth = value["a"], depth + 1
    assert depth == 450 and value == {}
    ordered = run(one({"Type": "Pass", "Output": "{% {'z': 1, 'a': [1, {'y': null, 'b': 2.0}], 'm': {}} %}"})).output
    assert list(ordered) == ["z", "a", "m"] and list(ordered["a"][1]) == ["y", "b"]
    assert ordered == {"z": 1, "a": [1, {"y": None, "b": 2}], "m": {}}


@pytest.mark.parametrize(("expression", "message"), [
    ("$partition([1,2,3], 0)", "the chunk size must be greater than 0"),
    ("$range(0, 100000000, 1)", "the range has 100000001 elements, more than 1000"),
    ("$hash('x', 'NOPE')", "unsupported algorithm 'NOPE' (one of MD5, SHA-1, SHA-256, SHA-384, SHA-512)"),
    ("$parse('{')", "the argument is not a JSON text: Expecting property name enclosed in double quotes: line 1 "
                    "column 2 (char 1)"),
    ("$random('x')", "the seed of $random must be an integer"),
    ("$parse($sum)", "an argument is not a JSON value"),
    ("$partition([$reduce([1..600], function($a, $v){ {'a': $a} }, {})], 1)",
     "an argument is nested more than 500 levels deep"),
])
def test_step_functions_function_errors_say_what_was_wrong(expression: str, message: str) -> None:
    execution = run(one({"Type": "Pass", "Output": "{% " + expression + " %}"}))
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause == (f"{PREFIX} The JSONata expression '{expression}' specified for the field 'Output' "
                               f"threw an error during evaluation. D3001: {message}")


# ----- the functions Step Functions adds -----------------------------------------------------------
def test_step_functions_jsonata_functions() -> None:
    output = run(one({"Type": "Pass", "Output": {
        "partition": "{% $partition([1,2,3,4,5], 2) %}", "range": "{% $range(0, 10, 5) %}",
        "hash": "{% $hash('hello', 'SHA-256') %}", "parse": "{% $parse($states.input.text) %}",
        "uuid": "{% $uuid() %}", "seeded": "{% [$random(7), $random(7)] %}", "random": "{% $random() %}"}}),
        {"text": "{\"a\": [1, null]}"}).output
    assert output["partition"] == [[1, 2], [3, 4], [5]]
    assert output["range"] == [0, 5, 10]
    assert output["hash"] == hashlib.sha256(b"hello").hexdigest()
    assert output["parse"] == {"a": [1, None]}
    assert len(output["uuid"]) == 36 and output["uuid"][14] == "4"
    assert output["seeded"][0] == output["seeded"][1] == random.Random(7).random()
    assert 0 <= output["random"] < 1


# ----- mixed query languages ----------------------------------------------------------------------
def test_jsonpath_state_then_jsonata_state_share_data_and_variables() -> None:
    # The recorded JSONPATH_TO_JSONATA_DATAFLOW case: a JSONPath Pass assigns from its Result, a JSONata
    # Task reads the data and the variable; its own Assign of 'answer' does not change what its Output sees.
    definition = {"StartAt": "StateJsonPath", "States": {
        "StateJsonPath": {"QueryLanguage": "JSONPath", "Type": "Pass", "Result": {"riddle": "R?"},
                          "Assign": {"answer": 42, "inputData.$": "$"}, "OutputPath": "$",
                          "ResultPath": "$.enigma.mystery", "Next": "StateJsonata"},
        "StateJsonata": {"QueryLanguage": "JSONata", "Type": "Task", "Resource": LAMBDA,
                         "Arguments": {"FunctionName": "{% $states.input.functionName %}",
                                       "Payload": {"theQuestion": "{% $states.input.enigma.mystery.riddle %}",
                                                   "theAnswer": "{% $answer %}"}},
                         "Assign": {"answer": "<omitted>", "message": "{% $states.result %}"},
                         "Output": {"result": "{% $states.result.Payload %}", "answer": "{% $answer %}"},
                         "End": True}}}
    execution = run(definition, {"functionName": "f"}, echo)
    assert execution.output == {"result": {"FunctionName": "f", "Payload": {"theQuestion": "R?", "theAnswer": 42}},
                                "answer": 42}
    exited = [e["stateExitedEventDetails"] for e in execution.history if e["type"].endswith("StateExited")]
    assert exited[0]["assignedVariables"] == {"answer": "42", "inputData": '{"riddle":"R?"}'}
    assert exited[1]["assignedVariables"]["answer"] == '"<omitted>"'
    assert exited[0]["output"] == json.dumps({"functionName": "f", "enigma": {"mystery": {"riddle": "R?"}}},
                                             separators=(",", ":"))


def test_a_jsonata_state_in_a_jsonpath_machine() -> None:
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Parameters": {"v.$": "$.x"}, "Next": "B"},
        "B": {"Type": "Pass", "QueryLanguage": "JSONata", "Output": "{% $states.input.v * 10 %}", "End": True}}}
    assert run(definition, {"x": 4}).output == 40


# ----- load-time validation ------------------------------------------------------------------------
@pytest.mark.parametrize(("state", "field", "message"), [
    ({"Type": "Pass", "Parameters": {}}, "Parameters",
     "The QueryLanguage is set to 'JSONata', but field 'Parameters' is only supported for the 'JSONPath' "
     "QueryLanguage"),
    ({"Type": "Pass", "InputPath": "$"}, "InputPath", "field 'InputPath' is only supported for the 'JSONPath'"),
    ({"Type": "Task", "Resource": LAMBDA, "ResultSelector": {}}, "ResultSelector", "only supported for the 'JSONPath'"),
    ({"Type": "Wait", "SecondsPath": "$.s"}, "SecondsPath", "only supported for the 'JSONPath'"),
    ({"Type": "Map", "ItemsPath": "$", "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Succeed"}}}},
     "ItemsPath", "only supported for the 'JSONPath'"),
])
def test_jsonpath_fields_are_refused_in_jsonata_states(state: dict[str, Any], field: str, message: str) -> None:
    assert any(p.startswith(f"States.S.{field}:") and message in p for p in refusals(one(state))), refusals(one(state))


@pytest.mark.parametrize("state", [
    {"Type": "Pass", "Output": {}}, {"Type": "Task", "Resource": LAMBDA, "Arguments": {}},
    {"Type": "Map", "Items": [], "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Succeed"}}}}])
def test_jsonata_fields_are_refused_in_jsonpath_states(state: dict[str, Any]) -> None:
    field = next(k for k in ("Output", "Arguments", "Items") if k in state)
    definition = {"StartAt": "S", "States": {"S": {"End": True, **state}}}
    expected = (f"States.S.{field}: The QueryLanguage is set to 'JSONPath', but field '{field}' is only supported "
                "for the 'JSONata' QueryLanguage")
    assert expected in refusals(definition)


def test_language_rules_of_the_definition() -> None:
    downgrade = {"QueryLanguage": "JSONata", "StartAt": "P", "States": {
        "P": {"Type": "Pass", "End": True, "QueryLanguage": "JSONPath"}}}
    assert refusals(downgrade) == ["States.P.QueryLanguage: 'QueryLanguage' can not be 'JSONPath' if set to 'JSONata' "
                                   "for whole state machine"]
    inner = one({"Type": "Map", "ItemProcessor": {"QueryLanguage": "JSONata", "StartAt": "P",
                                                  "States": {"P": {"Type": "Succeed"}}}})
    assert "States.S.ItemProcessor.QueryLanguage: Field 'QueryLanguage' is not supported" in refusals(inner)
    assert any("must be JSONPath or JSONata" in p for p in refusals({**one({"Type": "Succeed"}), "QueryLanguage": "X"}))
    rule = {"QueryLanguage": "JSONata", "StartAt": "C", "States": {
        "C": {"Type": "Choice", "Choices": [{"Variable": "$.x", "IsPresent": True, "Next": "E"}], "Default": "E"},
        "E": {"Type": "Succeed"}}}
    problems = refusals(rule)
    assert any(p.startswith("States.C.Choices[0].Variable:") and "only supported for the 'JSONPath'" in p
               for p in problems) and any("needs a Condition" in p for p in problems)


def test_expressions_that_do_not_parse_are_refused_at_load() -> None:
    problems = refusals(one({"Type": "Pass", "Output": {"v": "{% 1 + %}"}}))
    assert problems == ["States.S.Output: INVALID_JSONATA_EXPRESSION: S0207: Unexpected end of expression"]
    assert any(p.startswith("States.S.Assign.x: INVALID_JSONATA_EXPRESSION")
               for p in refusals(one({"Type": "Pass", "Assign": {"x": "{% [1, %}"}})))


def test_expression_valued_numbers_are_accepted_at_load() -> None:
    StateMachine.from_definition(one({"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": "{% 120 %}",
                                      "HeartbeatSeconds": "{% 20 %}"}))
    StateMachine.from_definition(one({"Type": "Map", "MaxConcurrency": "{% 2 %}", "Items": "{% [1] %}",
                                      "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Succeed"}}}}))


def test_d2ops_asl_run_runs_a_jsonata_definition(tmp_path: Path) -> None:
    path = tmp_path / "jsonata.asl.json"
    path.write_text(json.dumps({"QueryLanguage": "JSONata", "StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"n": "{% $states.input.n %}"}, "Next": "B"},
        "B": {"Type": "Pass", "Output": {"double": "{% $n * 2 %}"}, "End": True}}}))
    (tmp_path / "input.json").write_text('{"n": 21}')
    result = subprocess.run([sys.executable, "-m", "d2ops", "asl", "run", str(path), "--input",
                             str(tmp_path / "input.json")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"double": 42}


@pytest.mark.parametrize(("expression", "name"), [("phone", "phone"), ("$count(items)", "items"),
                                                  ("{'a': x}", "x"), ("$states.input.ok ? other : 1", "other")])
def test_a_bare_top_level_reference_is_refused_at_load(expression: str, name: str) -> None:
    # Nothing is the root document in Step Functions' JSONata: data comes from $states and variables.
    assert refusals(one({"Type": "Pass", "Output": {"v": f"{{% {expression} %}}"}})) == [
        f"States.S.Output: UNSUPPORTED_JSONATA_EXPRESSION: Reference to '{name}' at the top level is not supported."]


def test_names_relative_to_a_step_are_not_top_level() -> None:
    execution = run(one({"Type": "Pass", "Output": {
        "cheap": "{% $states.input.items[price < 5].name %}",
        "renamed": "{% $states.input.items.{'n': name} %}",
        "sum": "{% $sum($states.input.items.price) %}",
        "mapped": "{% $map($states.input.items, function($v){ $v.price * 2 }) %}"}}),
        {"items": [{"name": "a", "price": 1}, {"name": "b", "price": 9}]})
    assert execution.output == {"cheap": "a", "renamed": [{"n": "a"}, {"n": "b"}], "sum": 10, "mapped": [2, 18]}


def test_a_distributed_map_in_jsonata() -> None:
    # The children run in the machine's language (JSONata here), without the parent's variables.
    definition = one({"Type": "Map", "Items": "{% $states.input.items %}",
                      "ItemSelector": {"n": "{% $states.context.Map.Item.Value %}"},
                      "ToleratedFailureCount": "{% $states.input.tolerated %}", "MaxConcurrency": "{% 2 %}",
                      "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                                        "StartAt": "C", "States": {"C": {
                                            "Type": "Choice", "Choices": [{"Condition": "{% $states.input.n = 2 %}",
                                                                           "Next": "Bad"}], "Default": "Good"},
                                            "Good": {"Type": "Pass", "Output": "{% $states.input.n * 10 %}",
                                                     "End": True},
                                            "Bad": {"Type": "Fail", "Error": "Two"}}},
                      "Output": {"results": "{% $states.result %}"}})
    execution = run(definition, {"items": [1, 3], "tolerated": 0})
    assert execution.output == {"results": [10, 30]}
    failed = run(definition, {"items": [1, 2], "tolerated": 0})
    assert failed.error == "States.ExceedToleratedFailureThreshold"
    tolerated = run(definition, {"items": [1, 2], "tolerated": 1})
    assert tolerated.status == "SUCCEEDED" and tolerated.output["results"][0] == 10
    with pytest.raises(AslDefinitionError, match="field 'Parameters' is only supported for the 'JSONPath'"):
        StateMachine.from_definition(one({
            "Type": "Map", "ItemReader": {"Resource": "arn:aws:states:::s3:listObjectsV2", "Parameters": {}},
            "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                              "StartAt": "P", "States": {"P": {"Type": "Succeed"}}}}))


def test_distributed_map_children_do_not_see_the_parents_variables() -> None:
    definition = {"QueryLanguage": "JSONata", "StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"x": 1}, "Next": "M"},
        "M": {"Type": "Map", "Items": [1], "End": True, "ItemSelector": {"x": "{% $x %}"},  # evaluated by the parent
              "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"},
                                "StartAt": "P", "States": {"P": {"Type": "Pass", "End": True,
                                                                 "Output": "{% $exists($x) %}"}}}}}}
    assert run(definition).output == [False]
