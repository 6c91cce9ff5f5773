"""Definition validation, refusals and ${Key} substitutions of the ASL interpreter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import AslDefinitionError, StateMachine, definition_name, placeholders, substitute


def problems_of(definition: Any) -> list[str]:
    with pytest.raises(AslDefinitionError) as info:
        StateMachine.from_definition(definition, name="Bad")
    return info.value.problems


def single(state: dict[str, Any]) -> dict[str, Any]:
    return {"StartAt": "A", "States": {"A": state}}


def test_a_valid_definition_loads() -> None:
    machine = StateMachine.from_definition(single({"Type": "Pass", "End": True}), name="Ok")
    assert machine.arn == "arn:aws:states:us-east-1:123456789012:stateMachine:Ok"


@pytest.mark.parametrize(("definition", "expected"), [
    ({"States": {"A": {"Type": "Pass", "End": True}}}, "StartAt: missing"),
    ({"StartAt": "B", "States": {"A": {"Type": "Pass", "End": True}}},
     "StartAt: names a state that does not exist: 'B'"),
    ({"StartAt": "A"}, "States: missing or empty"),
    ([{"StartAt": "A"}], "the definition: must be a JSON object"),
    ({"StartAt": "C", "States": {"C": {"Type": "Choice", "Choices": [{"Variable": "$.x", "IsNull": True}]}}},
     "States.C.Choices[0].Next: missing (the name of the state to go to)"),
    ({"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "Nowhere"}}},
     "States.A.Next: names a state that does not exist in this scope: 'Nowhere'"),
    (single({"Type": "Pass", "End": True, "Reslt": 1}), "States.A.Reslt: unknown field for a Pass state"),
    (single({"Type": "Pass"}), "States.A: needs exactly one of Next or End: true"),
    (single({"Type": "Banana", "End": True}), "States.A.Type: missing or unknown state type 'Banana'"),
    ({"StartAt": "A", "QueryLanguage": "JSONata", "States": {"A": {"Type": "Pass", "End": True,
                                                                   "QueryLanguage": "JSONPath"}}},
     "States.A.QueryLanguage: 'QueryLanguage' can not be 'JSONPath' if set to 'JSONata' for whole state machine"),
    (single({"Type": "Pass", "End": True, "QueryLanguage": "JSONata", "Result": 1}),
     "States.A.Result: The QueryLanguage is set to 'JSONata', but field 'Result' is only supported for the "
     "'JSONPath' QueryLanguage"),
    (single({"Type": "Pass", "End": True, "Assign": {"states": 1}}), "States.A.Assign.states: 'states' is a reserved"),
    (single({"Type": "Map", "End": True, "ItemReader": {}, "ItemProcessor": {
        "StartAt": "X", "States": {"X": {"Type": "Succeed"}}}}), "States.A.ItemReader: only a Distributed Map"),
    (single({"Type": "Map", "End": True, "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED"},
                                                           "StartAt": "X", "States": {"X": {"Type": "Succeed"}}}}),
     "States.A.ItemProcessor.ProcessorConfig.ExecutionType: a Distributed Map needs ExecutionType STANDARD or EXPRESS"),
    (single({"Type": "Task", "End": True}), "States.A.Resource: missing or not an ARN"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
             "Retry": [{"ErrorEquals": ["States.ALL"]}, {"ErrorEquals": ["X"]}]}),
     "States.A.Retry[0].ErrorEquals: States.ALL must appear alone and in the last retrier/catcher"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
             "Retry": [{"ErrorEquals": ["X"], "BackoffRate": 0.5}]}),
     "States.A.Retry[0].BackoffRate: must be a number >= 1.0"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
             "Retry": [{"ErrorEquals": ["X"], "JitterStrategy": "PARTIAL"}]}), "JitterStrategy: must be FULL or NONE"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True, "TimeoutSeconds": 5,
             "HeartbeatSeconds": 5}), "States.A.HeartbeatSeconds: must be smaller than TimeoutSeconds"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
             "Parameters": {"x.$": "States.Nope($.a)"}}),
     "States.A.Parameters.x.$: unknown intrinsic function States.Nope"),
    (single({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
             "Parameters": {"x.$": "States.Format('{}', $.a"}}), "States.A.Parameters.x.$: expected ',' or ')'"),
    (single({"Type": "Pass", "End": True, "Parameters": {"x.$": "not a path"}}),
     "States.A.Parameters.x.$: a path must be a string starting with '$'"),
    (single({"Type": "Pass", "End": True, "ResultPath": "$.a[*]"}),
     "States.A.ResultPath: '$.a[*]' is not a reference path"),
    (single({"Type": "Wait", "End": True}),
     "States.A: needs exactly one of Seconds, SecondsPath, Timestamp, TimestampPath"),
    (single({"Type": "Wait", "End": True, "Timestamp": "yesterday"}),
     "States.A.Timestamp: must be an ISO 8601 timestamp"),
    (single({"Type": "Choice", "Choices": []}), "States.A.Choices: must be a non-empty array"),
    ({"StartAt": "A", "States": {"A": {"Type": "Choice", "Choices": [
        {"Not": {"Variable": "$.x", "StringEquals": "y", "Next": "B"}, "Next": "B"}]}, "B": {"Type": "Succeed"}}},
     "States.A.Choices[0].Not.Next: only top-level choice rules may have Next"),
    ({"StartAt": "A", "States": {"A": {"Type": "Choice", "Choices": [
        {"Variable": "$.x", "NumericEquals": "1", "Next": "B"}]}, "B": {"Type": "Succeed"}}},
     "States.A.Choices[0].NumericEquals: must be a number"),
    ({"StartAt": "A", "States": {"A": {"Type": "Choice", "Choices": [
        {"Variable": "$.x", "StringEquals": "1", "NumericEquals": 1, "Next": "B"}]}, "B": {"Type": "Succeed"}}},
     "States.A.Choices[0]: needs exactly one comparison operator"),
    ({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}, "Orphan": {"Type": "Succeed"}}},
     "States.Orphan: is not reachable from StartAt"),
    ({"StartAt": "P", "States": {"P": {"Type": "Parallel", "End": True, "Branches": [
        {"StartAt": "P", "States": {"P": {"Type": "Succeed"}}}]}}}, "duplicate state name"),
    ({"StartAt": "P", "States": {"P": {"Type": "Parallel", "End": True, "Branches": [
        {"StartAt": "X", "States": {"X": {"Type": "Pass", "Next": "Outside"}}}]}, "Outside": {"Type": "Succeed"}}},
     "States.P.Branches[0].States.X.Next: names a state that does not exist in this scope: 'Outside'"),
])
def test_bad_definitions_are_refused_naming_state_and_field(definition: dict[str, Any], expected: str) -> None:
    problems = problems_of(definition)
    assert any(expected in problem for problem in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of({"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Next": "Missing", "Bogus": 1},
        "B": {"Type": "Task", "End": True}}})
    assert len(problems) >= 4  # dangling Next, unknown field, Resource, unreachable B
    message = str(AslDefinitionError(problems, source="x.asl.json"))
    assert message.startswith(f"x.asl.json: {len(problems)} problems:")


def test_problems_come_in_a_stable_order() -> None:
    """Unknown fields are listed sorted, not in set order (which changes with PYTHONHASHSEED)."""
    problems = problems_of(single({"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:1:function:f", "End": True,
                                   "Retry": [{"ErrorEquals": ["X"], "Zeta": 1, "Alpha": 2, "Mid": 3}],
                                   "Catch": [{"ErrorEquals": ["Y"], "Next": "A", "Zed": 1, "Abc": 2}]}))
    assert problems == [f"States.A.Retry[0].{key}: unknown retrier field" for key in ("Alpha", "Mid", "Zeta")] + [
        f"States.A.Catch[0].{key}: unknown catcher field" for key in ("Abc", "Zed")]


def test_malformed_json_is_a_definition_error() -> None:
    with pytest.raises(AslDefinitionError, match="not valid JSON"):
        StateMachine.from_definition('{"StartAt": ', name="Bad")


def test_substitutions_replace_placeholders_before_parsing() -> None:
    text = json.dumps(single({"Type": "Task", "Resource": "${FnArn}", "End": True,
                              "Parameters": {"Bucket": "${Bucket}", "Key": "a/${Bucket}/b"}}))
    assert placeholders(text) == ["FnArn", "Bucket"]
    machine = StateMachine.from_definition(text, name="Sub", substitutions={
        "FnArn": "arn:aws:lambda:us-east-1:1:function:f", "Bucket": "data"})
    state = machine.definition["States"]["A"]
    assert state["Resource"] == "arn:aws:lambda:us-east-1:1:function:f"
    assert state["Parameters"] == {"Bucket": "data", "Key": "a/data/b"}


def test_unreplaced_placeholders_are_listed_with_a_case_hint() -> None:
    text = '{"a": "${BucketName}", "b": "${Missing}", "c": "${BucketName}"}'
    with pytest.raises(AslDefinitionError) as info:
        substitute(text, {"bucketname": "x"}, source="sm.asl.json")
    message = str(info.value)
    assert "${BucketName}, ${Missing}" in message
    assert "did you mean 'bucketname'? keys are case-sensitive" in message
    assert message.startswith("sm.asl.json:")


def test_from_file_names_the_machine_after_the_file(tmp_path: Path) -> None:
    for file_name, expected in (("training_pipeline.asl.json", "training_pipeline"), ("flow.json", "flow")):
        path = tmp_path / file_name
        path.write_text(json.dumps(single({"Type": "Succeed"})))
        assert StateMachine.from_file(path).name == expected
        assert definition_name(path) == expected
    assert StateMachine.from_file(tmp_path / "flow.json", name="Custom").name == "Custom"


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.asl.json"
    path.write_text(json.dumps(single({"Type": "Pass"})))
    with pytest.raises(AslDefinitionError, match=r"broken\.asl\.json: States\.A: needs exactly one of Next"):
        StateMachine.from_file(path)
    with pytest.raises(AslDefinitionError, match="cannot read the definition"):
        StateMachine.from_file(tmp_path / "absent.asl.json")
