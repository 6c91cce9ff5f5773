"""A conformance sweep of the interpreter against the ASL specification (states-language.net) and the
Step Functions developer guide, table by table, plus hostile inputs.

Expected values come from the documents' own examples and rules:
- paths: https://docs.aws.amazon.com/step-functions/latest/dg/amazon-states-language-paths.html (JsonPath
  as Jayway reads it: bracket names in ' or ", with \\' \\" \\\\ escapes; "No results for path" prints
  each name between the quote it was written with, unescaped: PropertyPathToken.getPathFragment);
- Choice: https://docs.aws.amazon.com/step-functions/latest/dg/state-choice.html (a missing Variable is
  "Invalid path '$.x': The choice state's condition path references an invalid value.");
- Wait: https://docs.aws.amazon.com/step-functions/latest/dg/state-wait.html;
- Retry/Catch: https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
  (IntervalSeconds * BackoffRate^n, capped by MaxDelaySeconds; MaxAttempts 0 never retries);
- intrinsics: https://docs.aws.amazon.com/step-functions/latest/dg/intrinsic-functions.html;
- limits: https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html (256 KiB payloads).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops.asl import AslDefinitionError, Execution, StateMachine, TaskContext, TaskFailed, VirtualClock
from d2ops.asl.choice import string_matches

START = datetime(2026, 1, 1, tzinfo=UTC)
LAMBDA = "arn:aws:states:::lambda:invoke"
PREFIX = "An error occurred while executing the state 'S' (entered at the event id #2)."


def run(definition: dict[str, Any], data: Any = None, executor: Any = None) -> Execution:
    machine = StateMachine.from_definition(definition, name="Conformance")
    executors = {"arn:*": executor} if executor is not None else None
    return machine.run({} if data is None else data, clock=VirtualClock(START), executors=executors)


def one(state: dict[str, Any]) -> dict[str, Any]:
    return {"StartAt": "S", "States": {"S": {"End": True, **state}}}


def elapsed(execution: Execution) -> float:
    assert execution.stop_date is not None
    return (execution.stop_date - START).total_seconds()


# ----- paths -----------------------------------------------------------------------------------
BRACKETS = [  # (path as written in the definition, input, the node it selects)
    ("$['a.b']", {"a.b": 1, "a": {"b": 2}}, 1),
    ('$["x"]', {"x": 2}, 2),
    ("$['it\\'s']", {"it's": 3}, 3),
    ('$["say \\"hi\\""]', {'say "hi"': 4}, 4),
    ("$['back\\\\slash']", {"back\\slash": 5}, 5),
    ("$.a['b c'][0]", {"a": {"b c": [6]}}, 6),
    ("$['a']['b'][1]", {"a": {"b": [0, 7]}}, 7),
    ("$.a[-1]", {"a": [1, 8]}, 8),
    ("$['tab\\tnew\\nline']", {"tab\tnew\nline": 9}, 9),
    ("$['\\u00e9t\\u00e9']", {"été": 10}, 10),
    ("$['$.x']", {"$.x": 11}, 11),
    ("$['[0]']", {"[0]": 12}, 12),
    ("$.a-b.c_d", {"a-b": {"c_d": 13}}, 13),
    ("$.ünïcødé", {"ünïcødé": 14}, 14),
]


@pytest.mark.parametrize(("path", "data", "expected"), BRACKETS)
def test_bracket_and_dot_paths_select_the_same_node_in_every_path_field(path: str, data: Any, expected: Any) -> None:
    assert run(one({"Type": "Pass", "InputPath": path}), data).output == expected
    assert run(one({"Type": "Pass", "Parameters": {"v.$": path}}), data).output == {"v": expected}
    assert run(one({"Type": "Pass", "Parameters": {"v.$": f"States.Array({path})"}}), data).output == {"v": [expected]}
    assert run(one({"Type": "Pass", "OutputPath": path}), data).output == expected
    choice = {"StartAt": "S", "States": {
        "S": {"Type": "Choice", "Choices": [{"Variable": path, "NumericEquals": expected, "Next": "Yes"}],
              "Default": "No"},
        "Yes": {"Type": "Succeed"}, "No": {"Type": "Fail", "Error": "NoMatch"}}}
    assert run(choice, data).status == "SUCCEEDED"


@pytest.mark.parametrize(("path", "written"), [
    ("$['a.b']", {"a.b": "r"}), ('$["x"]', {"x": "r"}), ("$['it\\'s']", {"it's": "r"}),
    ("$['back\\\\slash'].in", {"back\\slash": {"in": "r"}}), ("$.a['b c']", {"a": {"b c": "r"}}),
])
def test_result_path_brackets_create_the_named_node(path: str, written: dict[str, Any]) -> None:
    execution = run(one({"Type": "Pass", "Result": "r", "ResultPath": path}), {})
    assert execution.output == written


@pytest.mark.parametrize(("path", "data", "jayway"), [
    ("$.a.b", {"a": {}}, "$['a']['b']"),
    ("$['x y']", {}, "$['x y']"),
    ('$["x"]', {}, '$["x"]'),
    ("$['it\\'s']", {}, "$['it's']"),
    ("$['back\\\\slash']", {}, "$['back\\slash']"),
    ("$.a['b c'][0]", {"a": {"b c": []}}, "$['a']['b c'][0]"),
    ("$.list[5]", {"list": [1]}, "$['list'][5]"),
])
@pytest.mark.parametrize("field", ["InputPath", "OutputPath"])
def test_a_path_that_matches_nothing_fails_with_aws_cause(path: str, data: Any, jayway: str, field: str) -> None:
    execution = run(one({"Type": "Pass", field: path}), data)
    assert (execution.status, execution.error) == ("FAILED", "States.Runtime")
    assert execution.cause == f"{PREFIX} Invalid path '{path}' : No results for path: {jayway}"


def test_a_parameters_path_that_matches_nothing_names_field_and_input() -> None:
    execution = run(one({"Type": "Pass", "Parameters": {"deep": {"k.$": "$['no such']"}}}), {"a": 1})
    assert execution.cause == (f"{PREFIX} The JSONPath '$['no such']' specified for the field 'k.$' could not be "
                               "found in the input '{\"a\":1}'")


def test_query_paths_always_give_a_list() -> None:
    data = {"a": [{"b": 1}, {"b": 2}, {"c": 3}]}
    for path, expected in [("$.a[*].b", [1, 2]), ("$..b", [1, 2]), ("$.a[?(@.b > 1)].b", [2]), ("$.a[0:2].b", [1, 2]),
                           ("$.missing[*]", []), ("$['a'][*]['c']", [3])]:
        assert run(one({"Type": "Pass", "Parameters": {"v.$": path}}), data).output == {"v": expected}, path


def test_the_paths_page_examples() -> None:
    """https://docs.aws.amazon.com/step-functions/latest/dg/amazon-states-language-paths.html"""
    data = {"foo": 123, "bar": ["a", "b", "c"], "car": {"cdr": True},
            "jar": [{"a": 1}, {"a": 5}, {"a": 2}, {"a": 7}, {"a": 3}], "abc": {"def ghi": "x"}}
    for path, expected in [("$.foo", 123), ("$.bar", ["a", "b", "c"]), ("$.car.cdr", True),
                           ("$.jar[?(@.a >= 5)]", [{"a": 5}, {"a": 7}]), ("$.abc.['def ghi']", "x"),
                           ("$.bar[?(@ == 'a')]", [])]:  # "@ ... does not match scalar values"
        assert run(one({"Type": "Pass", "Parameters": {"v.$": path}}), data).output == {"v": expected}, path
    assert run(one({"Type": "Pass", "Result": 1, "ResultPath": "$.abc.['new key']"}), {"abc": {}}).output == \
        {"abc": {"new key": 1}}


@pytest.mark.parametrize(("path", "reason"), [
    ("$.bar.length()", "functions such as length() are not supported"),
    ("$.jar[?(@.a =~ /x.*/)]", "regular expression is not supported"),
    ("$.jar[?(@.a > $.limit)]", "referencing another value in the JSON structure"),
])
def test_what_the_paths_page_says_is_unsupported_is_refused_at_load(path: str, reason: str) -> None:
    with pytest.raises(AslDefinitionError, match=re.escape(reason)):
        StateMachine.from_definition(one({"Type": "Pass", "Parameters": {"v.$": path}}))
    assert run(one({"Type": "Pass", "Parameters": {"v.$": "$.jar[?(@.a == '$.limit')]"}}),
               {"jar": [{"a": "$.limit"}]}).output == {"v": [{"a": "$.limit"}]}  # a quoted '$' is text


@pytest.mark.parametrize("path", ["$.a[", "$['unterminated]", "a.b", "$.a.length(", "States.Array($.a)"])
def test_malformed_paths_are_refused_when_loaded_naming_state_and_field(path: str) -> None:
    with pytest.raises(AslDefinitionError, match=r"States\.S\.InputPath"):
        StateMachine.from_definition(one({"Type": "Pass", "InputPath": path}))


# ----- Choice ------------------------------------------------------------------------------------
CHOICES: list[tuple[dict[str, Any], Any, dict[str, Any], bool]] = [  # (operator, $.v, other fields, matches)
    ({"StringEquals": "abc"}, "abc", {}, True),
    ({"StringEquals": "abc"}, "ABC", {}, False),
    ({"StringLessThan": "b"}, "a", {}, True),
    ({"StringGreaterThan": "a"}, "b", {}, True),
    ({"StringLessThanEquals": "a"}, "a", {}, True),
    ({"StringGreaterThanEquals": "b"}, "a", {}, False),
    ({"StringLessThan": "\uffff"}, "\U0001f600", {}, True),  # Java compares UTF-16 code units
    ({"StringEquals": "1"}, 1, {}, False),  # wrong type never matches
    ({"NumericEquals": 1}, 1.0, {}, True),
    ({"NumericEquals": 1}, "1", {}, False),
    ({"NumericEquals": 1}, True, {}, False),
    ({"NumericLessThan": 0}, -0.5, {}, True),
    ({"NumericGreaterThan": 10}, 10, {}, False),
    ({"NumericLessThanEquals": 10}, 10, {}, True),
    ({"NumericGreaterThanEquals": 1e300}, 10**301, {}, True),
    ({"BooleanEquals": False}, False, {}, True),
    ({"BooleanEquals": False}, 0, {}, False),
    ({"TimestampEquals": "2026-01-01T00:00:00Z"}, "2026-01-01T01:00:00+01:00", {}, True),
    ({"TimestampLessThan": "2026-01-01T00:00:00Z"}, "2025-12-31T23:59:59.999Z", {}, True),
    ({"TimestampGreaterThan": "2026-01-01T00:00:00Z"}, "not a time", {}, False),
    ({"TimestampLessThan": "2026-01-01T00:00:00Z"}, "2024-02-30T00:00:00Z", {}, False),  # no such day
    ({"TimestampLessThan": "2026-01-01T00:00:00Z"}, "2024-13-01T00:00:00Z", {}, False),  # no such month
    ({"IsTimestamp": True}, "2024-01-01T24:00:00Z", {}, False),
    ({"TimestampLessThan": "2026-01-01T00:00:00Z"}, "2025-12-31T23:59:59.123456789Z", {}, True),  # nanoseconds
    ({"TimestampLessThanEquals": "2026-01-01T00:00:00Z"}, "2026-01-01T00:00:00Z", {}, True),
    ({"TimestampGreaterThanEquals": "2026-01-01T00:00:00Z"}, "2025-01-01T00:00:00Z", {}, False),
    ({"StringMatches": "log-*.txt"}, "log-2026.txt", {}, True),
    ({"StringMatches": "*.log"}, "a.log.gz", {}, False),
    ({"StringMatches": "a\\*b"}, "a*b", {}, True),
    ({"StringMatches": "a\\*b"}, "axb", {}, False),
    ({"StringMatches": "a\\\\*"}, "a\\anything", {}, True),
    ({"StringMatches": "**"}, "", {}, True),
    ({"IsNull": True}, None, {}, True),
    ({"IsNull": False}, 0, {}, True),
    ({"IsNumeric": True}, 2.5, {}, True),
    ({"IsNumeric": True}, "2.5", {}, False),
    ({"IsString": True}, "", {}, True),
    ({"IsBoolean": True}, True, {}, True),
    ({"IsBoolean": True}, "true", {}, False),
    ({"IsTimestamp": True}, "2016-03-14T01:59:00Z", {}, True),
    ({"IsTimestamp": True}, "2016-03-14 01:59:00Z", {}, False),
    ({"IsPresent": True}, 0, {}, True),
    ({"StringEqualsPath": "$.o"}, "x", {"o": "x"}, True),
    ({"StringLessThanPath": "$.o"}, "a", {"o": "b"}, True),
    ({"StringGreaterThanPath": "$.o"}, "a", {"o": "b"}, False),
    ({"StringLessThanEqualsPath": "$.o"}, "b", {"o": "b"}, True),
    ({"StringGreaterThanEqualsPath": "$.o"}, "c", {"o": "b"}, True),
    ({"NumericEqualsPath": "$.o"}, 3, {"o": 3}, True),
    ({"NumericEqualsPath": "$.o"}, 3, {"o": "3"}, False),
    ({"NumericLessThanPath": "$.o"}, 2, {"o": 3}, True),
    ({"NumericGreaterThanPath": "$.o"}, 2, {"o": 3}, False),
    ({"NumericLessThanEqualsPath": "$.o"}, 3, {"o": 3}, True),
    ({"NumericGreaterThanEqualsPath": "$.o"}, 4, {"o": 3}, True),
    ({"BooleanEqualsPath": "$.o"}, True, {"o": True}, True),
    ({"TimestampEqualsPath": "$.o"}, "2026-01-01T00:00:00Z", {"o": "2026-01-01T00:00:00.000Z"}, True),
    ({"TimestampLessThanPath": "$.o"}, "2025-01-01T00:00:00Z", {"o": "2026-01-01T00:00:00Z"}, True),
    ({"TimestampGreaterThanPath": "$.o"}, "2025-01-01T00:00:00Z", {"o": "2026-01-01T00:00:00Z"}, False),
    ({"TimestampLessThanEqualsPath": "$.o"}, "2026-01-01T00:00:00Z", {"o": "2026-01-01T00:00:00Z"}, True),
    ({"TimestampGreaterThanEqualsPath": "$.o"}, "2027-01-01T00:00:00Z", {"o": "2026-01-01T00:00:00Z"}, True),
]


def choose(rule: dict[str, Any], data: Any) -> Execution:
    return run({"StartAt": "S", "States": {
        "S": {"Type": "Choice", "Choices": [{**rule, "Next": "Yes"}], "Default": "No"},
        "Yes": {"Type": "Pass", "Result": "yes", "End": True}, "No": {"Type": "Pass", "Result": "no", "End": True}}},
        data)


@pytest.mark.parametrize(("operator", "value", "others", "matches"), CHOICES,
                         ids=[f"{next(iter(c[0]))}-{i}" for i, c in enumerate(CHOICES)])
def test_every_comparison_operator(operator: dict[str, Any], value: Any, others: dict[str, Any],
                                   matches: bool) -> None:
    execution = choose({"Variable": "$.v", **operator}, {"v": value, **others})
    assert execution.output == ("yes" if matches else "no")


def test_string_matches_a_long_value_against_many_stars_in_linear_time() -> None:
    import time

    started = time.monotonic()
    rule = {"Variable": "$.v", "StringMatches": "*a" * 500 + "b"}
    assert choose(rule, {"v": "a" * 200_000}).output == "no"
    assert choose(rule, {"v": "a" * 200_000 + "b"}).output == "yes"
    assert time.monotonic() - started < 5  # a backtracking matcher takes minutes here


@settings(max_examples=300, deadline=None)
@given(value=st.text("ab*\\", max_size=10), pattern=st.text("ab*\\", max_size=8))
def test_string_matches_agrees_with_a_regex_of_the_documented_rules(value: str, pattern: str) -> None:
    """``*`` is any run of characters, ``\\*`` a literal star, ``\\\\`` a literal backslash (the Choice
    page); any other backslash is itself."""
    regex, index = [], 0
    while index < len(pattern):
        if pattern[index] == "\\" and pattern[index + 1: index + 2] in ("*", "\\"):
            regex.append(re.escape(pattern[index + 1]))
            index += 2
            continue
        regex.append(".*" if pattern[index] == "*" else re.escape(pattern[index]))
        index += 1
    assert string_matches(value, pattern) == (re.fullmatch("".join(regex), value, re.DOTALL) is not None)


def test_is_present_false_and_nested_and_or_not() -> None:
    assert choose({"Variable": "$.missing", "IsPresent": False}, {}).output == "yes"
    rule = {"And": [{"Not": {"Variable": "$.kind", "StringEquals": "skip"}},
                    {"Or": [{"Variable": "$.n", "NumericGreaterThan": 10},
                            {"And": [{"Variable": "$.n", "IsPresent": True},
                                     {"Variable": "$.force", "BooleanEquals": True}]}]}]}
    assert choose(rule, {"kind": "go", "n": 11}).output == "yes"
    assert choose(rule, {"kind": "go", "n": 1, "force": True}).output == "yes"
    assert choose(rule, {"kind": "skip", "n": 11}).output == "no"
    # Or stops at its first true rule: a later rule's missing Variable is never looked at.
    assert choose({"Or": [{"Variable": "$.n", "IsNumeric": True}, {"Variable": "$.nope", "IsNull": True}]},
                  {"n": 1}).output == "yes"


@pytest.mark.parametrize("rule", [
    {"Variable": "$.missing", "NumericEquals": 1},
    {"Not": {"Variable": "$.missing", "StringEquals": "x"}},
    {"Variable": "$.v", "NumericEqualsPath": "$.missing"},
])
def test_a_missing_choice_path_fails_with_aws_cause(rule: dict[str, Any]) -> None:
    execution = choose(rule, {"v": 1})
    assert (execution.status, execution.error) == ("FAILED", "States.Runtime")
    assert execution.cause == (f"{PREFIX} Invalid path '$.missing': The choice state's condition path references "
                               "an invalid value.")


def test_no_rule_and_no_default_is_no_choice_matched() -> None:
    definition = {"StartAt": "S", "States": {
        "S": {"Type": "Choice", "Choices": [{"Variable": "$.v", "NumericEquals": 1, "Next": "E"}]},
        "E": {"Type": "Succeed"}}}
    assert run(definition, {"v": 2}).error == "States.NoChoiceMatched"


# ----- input and output processing ---------------------------------------------------------------
def test_result_path_null_dollar_and_output_path() -> None:
    data = {"keep": 1}
    assert run(one({"Type": "Pass", "Result": {"r": 2}, "ResultPath": None}), data).output == data
    assert run(one({"Type": "Pass", "Result": {"r": 2}, "ResultPath": "$"}), data).output == {"r": 2}
    assert run(one({"Type": "Pass", "Result": {"r": 2}, "ResultPath": "$.out", "OutputPath": "$.out.r"}),
               data).output == 2
    assert run(one({"Type": "Pass", "OutputPath": None}), data).output == {}
    assert run(one({"Type": "Pass", "InputPath": None, "Parameters": {"c.$": "$$.State.Name"}}), data).output == \
        {"c": "S"}


def test_parameters_and_result_selector_keys_ending_in_dollar_dot() -> None:
    def echo(resource: str, parameters: Any, context: TaskContext) -> Any:
        return {"Payload": {"got": parameters}, "StatusCode": 200}

    state = {"Type": "Task", "Resource": LAMBDA,
             "Parameters": {"static": "s", "list": [1, {"nested.$": "$.x"}], "obj": {"ctx.$": "$$.Execution.Name"},
                            "fn.$": "States.Format('x={}', $.x)"},
             "ResultSelector": {"echo.$": "$.Payload.got", "code.$": "$.StatusCode", "fixed": True},
             "ResultPath": "$.res"}
    machine = StateMachine.from_definition(one(state), name="Conformance")
    execution = machine.run({"x": 5}, clock=VirtualClock(START), executors={"arn:*": echo}, execution_name="run-1")
    # Objects inside arrays are templates too (the guide's events:putEvents "Entries": [{"Detail.$": ...}]).
    assert execution.output == {"x": 5, "res": {"echo": {"static": "s", "list": [1, {"nested": 5}],
                                                          "obj": {"ctx": "run-1"}, "fn": "x=5"},
                                                 "code": 200, "fixed": True}}


def test_a_path_applied_to_a_null_input_fails_with_aws_cause() -> None:
    """The console's words when a Lambda returned nothing and the next state reads its input with a path."""
    null_input: dict[str, Any] = {"StartAt": "Nothing", "States": {
        "Nothing": {"Type": "Pass", "Result": None, "Next": "S"},
        "S": {"Type": "Pass", "Parameters": {"Input.$": "$"}, "End": True}}}
    execution = run(null_input, {})
    assert (execution.status, execution.error) == ("FAILED", "States.Runtime")
    assert execution.cause == ("An error occurred while executing the state 'S' (entered at the event id #4). "
                               "Unable to apply Path transformation to null or empty input.")
    null_input["States"]["S"] = {"Type": "Pass", "Parameters": {"name.$": "$$.State.Name"}, "End": True}
    assert run(null_input, {}).output == {"name": "S"}  # the context object is not the input
    null_input["States"]["S"] = {"Type": "Pass", "End": True}
    assert run(null_input, {}).status == "SUCCEEDED"  # no path applied: null passes through


def test_result_path_into_a_non_object_is_result_path_match_failure() -> None:
    execution = run(one({"Type": "Pass", "Result": 1, "ResultPath": "$.a.b"}), {"a": "text"})
    assert execution.error == "States.ResultPathMatchFailure"


# ----- Fail, Wait ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("state", "data", "error", "cause"), [
    ({"Error": "E", "Cause": "C"}, {}, "E", "C"),
    ({"ErrorPath": "$.e", "CausePath": "$.c"}, {"e": "Dyn", "c": "why"}, "Dyn", "why"),
    ({"ErrorPath": "$['e x']", "CausePath": "States.Format('n={}', $.n)"}, {"e x": "Br", "n": 3}, "Br", "n=3"),
    ({"Error": "Only"}, {}, "Only", None),
])
def test_fail_error_and_cause(state: dict[str, Any], data: Any, error: str, cause: str | None) -> None:
    execution = run({"StartAt": "S", "States": {"S": {"Type": "Fail", **state}}}, data)
    assert (execution.status, execution.error, execution.cause) == ("FAILED", error, cause)


@pytest.mark.parametrize(("state", "data", "seconds"), [
    ({"Seconds": 0}, {}, 0),
    ({"Seconds": 90}, {}, 90),
    ({"SecondsPath": "$['wait for']"}, {"wait for": 30}, 30),
    ({"Timestamp": "2026-01-01T00:05:00Z"}, {}, 300),
    ({"TimestampPath": "$.t"}, {"t": "2026-01-01T00:01:00.500+00:00"}, 60),
    ({"TimestampPath": "$.t"}, {"t": "2020-01-01T00:00:00Z"}, 0),
])
def test_wait_variants(state: dict[str, Any], data: Any, seconds: int) -> None:
    execution = run(one({"Type": "Wait", **state}), data)
    assert execution.status == "SUCCEEDED" and elapsed(execution) == seconds


# ----- Retry, Catch, timeouts ---------------------------------------------------------------------
class Failing:
    """Fails with ``error`` the first ``times`` calls, then returns; records the virtual time of each call."""

    def __init__(self, error: str, times: int) -> None:
        self.error, self.times, self.calls = error, times, []  # type: ignore[var-annotated]

    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        self.calls.append((context.clock.now() - START).total_seconds())
        if len(self.calls) <= self.times:
            raise TaskFailed(self.error, "boom")
        return {"ok": True}


@pytest.mark.parametrize(("retrier", "failures", "calls_at"), [
    ({"IntervalSeconds": 3, "BackoffRate": 1.5, "MaxAttempts": 2}, 2, [0, 3, 7.5]),  # the guide's 3 s and 4.5 s
    ({}, 3, [0, 1, 3, 7]),  # defaults: 1 s, rate 2.0, 3 attempts
    ({"IntervalSeconds": 10, "BackoffRate": 3, "MaxDelaySeconds": 20}, 3, [0, 10, 30, 50]),
    ({"MaxAttempts": 0}, 1, [0]),
])
def test_retry_timing(retrier: dict[str, Any], failures: int, calls_at: list[float]) -> None:
    failing = Failing("Flaky", failures)
    state = {"Type": "Task", "Resource": LAMBDA, "Retry": [{"ErrorEquals": ["Flaky"], **retrier}],
             "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Caught"}]}
    definition = {"StartAt": "S", "States": {"S": {**state, "End": True}, "Caught": {"Type": "Pass", "End": True}}}
    run(definition, {}, failing)
    assert failing.calls == calls_at


def test_a_huge_backoff_rate_waits_until_the_execution_times_out_instead_of_overflowing() -> None:
    def boom(resource: str, parameters: Any, context: TaskContext) -> Any:
        raise TaskFailed("X", "x")

    state = {"Type": "Task", "Resource": LAMBDA, "Retry": [{"ErrorEquals": ["X"], "BackoffRate": 1e300,
                                                            "IntervalSeconds": 99_999_999, "MaxAttempts": 5}]}
    execution = run(one(state), {}, boom)
    assert (execution.status, execution.error) == ("TIMED_OUT", "States.Timeout")
    assert elapsed(execution) == 365 * 24 * 3600  # a Standard execution's one-year limit


def test_retriers_and_catchers_match_in_order_and_states_all_comes_last() -> None:
    failing = Failing("Specific", 5)
    definition = {"StartAt": "S", "States": {
        "S": {"Type": "Task", "Resource": LAMBDA, "End": True,
              "Retry": [{"ErrorEquals": ["Other"], "MaxAttempts": 5},
                        {"ErrorEquals": ["States.ALL"], "MaxAttempts": 1}],
              "Catch": [{"ErrorEquals": ["Specific"], "Next": "First", "ResultPath": "$.err"},
                        {"ErrorEquals": ["States.ALL"], "Next": "Second"}]},
        "First": {"Type": "Pass", "End": True}, "Second": {"Type": "Pass", "End": True}}}
    execution = run(definition, {"in": 1}, failing)
    assert len(failing.calls) == 2  # the States.ALL retrier, once
    assert execution.output == {"in": 1, "err": {"Error": "Specific", "Cause": "boom"}}
    misplaced = {"StartAt": "S", "States": {"S": {"Type": "Task", "Resource": LAMBDA, "End": True, "Retry": [
        {"ErrorEquals": ["States.ALL"]}, {"ErrorEquals": ["Other"]}]}}}
    with pytest.raises(AslDefinitionError, match=r"States\.S\.Retry\[0\]\.ErrorEquals: States\.ALL must appear alone"):
        StateMachine.from_definition(misplaced)


@pytest.mark.parametrize(("fields", "problem"), [
    ({"Retry": [{"ErrorEquals": ["X"], "MaxAttempts": 100_000_000}]}, "Retry[0].MaxAttempts"),
    ({"Retry": [{"ErrorEquals": ["X"], "IntervalSeconds": 0}]}, "Retry[0].IntervalSeconds"),
    ({"Retry": [{"ErrorEquals": ["X"], "MaxDelaySeconds": 31_622_401}]}, "Retry[0].MaxDelaySeconds"),
    ({"Retry": [{"ErrorEquals": ["X"], "BackoffRate": 0.5}]}, "Retry[0].BackoffRate"),
    ({"Retry": [{"ErrorEquals": ["X"], "JitterStrategy": "HALF"}]}, "Retry[0].JitterStrategy"),
    ({"TimeoutSeconds": 100_000_000}, "TimeoutSeconds"),
    ({"TimeoutSeconds": 10, "HeartbeatSeconds": 10}, "HeartbeatSeconds"),
])
def test_retrier_and_timeout_bounds_are_checked_at_load(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(AslDefinitionError, match=re.escape(f"States.S.{problem}:")):
        StateMachine.from_definition(one({"Type": "Task", "Resource": LAMBDA, **fields}))
    bounds = {"Retry": [{"ErrorEquals": ["X"], "MaxAttempts": 99_999_999, "MaxDelaySeconds": 31_622_400}],
              "TimeoutSeconds": 99_999_999}
    StateMachine.from_definition(one({"Type": "Task", "Resource": LAMBDA, **bounds}))


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "60", 100_000_000, 10**40])
@pytest.mark.parametrize("key", ["TimeoutSecondsPath", "HeartbeatSecondsPath"])
def test_a_seconds_path_outside_the_service_range_is_states_runtime(key: str, value: Any) -> None:
    execution = run(one({"Type": "Task", "Resource": LAMBDA, key: "$.v"}), {"v": value}, lambda *_: {})
    assert (execution.status, execution.error) == ("FAILED", "States.Runtime")
    assert (execution.cause or "").startswith(f"{PREFIX} The {key} parameter does not reference a positive integer")


def test_timeout_and_heartbeat_end_the_task_with_states_timeout() -> None:
    def slow(resource: str, parameters: Any, context: TaskContext) -> Any:
        context.sleep(100)
        return {}

    timed = run(one({"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": 5}), {}, slow)
    assert (timed.error, elapsed(timed)) == ("States.Timeout", 5)
    beat = {"StartAt": "S", "States": {
        "S": {"Type": "Task", "Resource": LAMBDA, "TimeoutSeconds": 50, "HeartbeatSeconds": 7, "End": True,
              "Catch": [{"ErrorEquals": ["States.Timeout"], "Next": "C"}]},  # covers heartbeats too
        "C": {"Type": "Pass", "End": True}}}
    caught = run(beat, {}, slow)
    assert caught.output["Error"] in ("States.Timeout", "States.HeartbeatTimeout") and elapsed(caught) == 7


# ----- Map and Parallel -----------------------------------------------------------------------------
def test_map_items_path_item_selector_and_max_concurrency() -> None:
    def work(resource: str, parameters: Any, context: TaskContext) -> Any:
        context.sleep(10)
        return parameters

    definition = one({"Type": "Map", "ItemsPath": "$['the items']", "MaxConcurrency": 2,
                      "ItemSelector": {"i.$": "$$.Map.Item.Index", "v.$": "$$.Map.Item.Value", "k.$": "$.k"},
                      "ItemProcessor": {"StartAt": "W", "States": {"W": {"Type": "Task", "Resource": LAMBDA,
                                                                       "End": True}}},
                      "ResultPath": "$.out"})
    execution = run(definition, {"the items": ["a", "b", "c"], "k": 0}, work)
    assert execution.output["out"] == [{"i": 0, "v": "a", "k": 0}, {"i": 1, "v": "b", "k": 0},
                                       {"i": 2, "v": "c", "k": 0}]
    assert elapsed(execution) == 20  # two at a time: 10 s, then the third


def test_map_over_something_that_is_not_an_array_fails() -> None:
    execution = run(one({"Type": "Map", "ItemsPath": "$.x", "ItemProcessor": {
        "StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}}), {"x": {"a": 1}})
    assert execution.error == "States.Runtime"


def test_parallel_outputs_in_branch_order() -> None:
    definition = one({"Type": "Parallel", "Branches": [
        {"StartAt": "A", "States": {"A": {"Type": "Wait", "Seconds": 5, "Next": "A2"},
                                    "A2": {"Type": "Pass", "Result": "a", "End": True}}},
        {"StartAt": "B", "States": {"B": {"Type": "Pass", "Result": "b", "End": True}}}]})
    execution = run(definition, {})
    assert execution.output == ["a", "b"] and elapsed(execution) == 5


# ----- refused features ----------------------------------------------------------------------------
# (JSONata and workflow variables run since issue 23: tests/unit/test_asl_jsonata.py, test_asl_variables.py.)
@pytest.mark.parametrize(("definition", "named"), [
    (one({"Type": "Task", "Resource": LAMBDA, "Credentials": {"RoleArn": "arn:aws:iam::1:role/x"}}),
     "States.S.Credentials"),
])
def test_unsupported_features_are_refused_at_load_naming_feature_and_state(definition: dict[str, Any],
                                                                            named: str) -> None:
    with pytest.raises(AslDefinitionError) as raised:
        StateMachine.from_definition(definition)
    assert any(problem.startswith(f"{named}:") and "not supported" in problem for problem in raised.value.problems), \
        raised.value.problems


# ----- hostile inputs -----------------------------------------------------------------------------
def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deeply_nested_input_is_refused_cleanly() -> None:
    with pytest.raises(ValueError, match="nested more than 500 levels"):
        run(one({"Type": "Pass"}), nested(100_000))
    assert run(one({"Type": "Pass"}), nested(400)).status == "SUCCEEDED"


def test_an_endless_loop_ends_at_the_history_quota_of_25000_events() -> None:
    execution = run({"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "A"}}}, {})
    assert (execution.status, execution.error) == ("FAILED", "States.Runtime")
    # The service's cause, word for word, on event 25,000 (the last Pass exit is event 24,999).
    assert execution.cause == "The execution reached the maximum number of history events (25000)."
    assert len(execution.history) == 25_000 and execution.history[-1]["type"] == "ExecutionFailed"
    assert execution.history[-2]["type"] == "PassStateExited"


def test_a_deeply_nested_definition_is_refused_at_load() -> None:
    opened = '{"StartAt": "C", "States": {"C": {"Type": "Choice", "Default": "E", "Choices": [{"Next": "E", '
    text = opened + '"Not": {' * 5000 + '"Variable": "$.x", "IsPresent": true' + "}" * 5000 + \
        '}]}, "E": {"Type": "Succeed"}}}'
    with pytest.raises(AslDefinitionError, match="nested more than 500 levels"):
        StateMachine.from_definition(text)
    rule: dict[str, Any] = {"Variable": "$.x", "IsPresent": False}
    for _ in range(5000):
        rule = {"Not": rule}
    with pytest.raises(AslDefinitionError, match="nested more than 500 levels"):
        StateMachine.from_definition({"StartAt": "C", "States": {
            "C": {"Type": "Choice", "Default": "E", "Choices": [{**rule, "Next": "E"}]}, "E": {"Type": "Succeed"}}})
    for _ in range(5000 - 100):  # a hundred levels still run
        rule = rule["Not"]
    choice = {"StartAt": "C", "States": {"C": {"Type": "Choice", "Default": "N", "Choices": [{**rule, "Next": "Y"}]},
                                         "Y": {"Type": "Succeed"}, "N": {"Type": "Fail", "Error": "No"}}}
    assert run(choice, {}).status == "SUCCEEDED"  # 100 Nots (even) around IsPresent false on {}


def test_a_deeply_nested_task_result_or_json_string_is_a_states_runtime_error() -> None:
    deep_result = run(one({"Type": "Task", "Resource": LAMBDA}), {}, lambda *_: nested(50_000))
    assert (deep_result.status, deep_result.error) == ("FAILED", "States.Runtime")
    assert "nested more than 500 levels" in (deep_result.cause or "")
    deep_text = run(one({"Type": "Pass", "Parameters": {"v.$": "States.StringToJson($.s)"}}),
                    {"s": "[" * 100_000 + "]" * 100_000})
    assert (deep_text.error, "nested more than 500 levels" in (deep_text.cause or "")) == ("States.Runtime", True)


@pytest.mark.parametrize(("text", "problem"), [("1e400", "inf"), ("1" * 5000, "4300 digits"), ("[1,", "not a JSON")])
def test_numbers_json_cannot_hold_are_states_runtime_errors(text: str, problem: str) -> None:
    execution = run(one({"Type": "Pass", "Parameters": {"v.$": "States.StringToJson($.s)"}}), {"s": text})
    assert execution.error == "States.Runtime" and problem in (execution.cause or "")


@pytest.mark.parametrize("path", ["$" + "[*]" * 3000, "$" + "..a" * 3000])
def test_a_path_with_thousands_of_steps_is_refused_at_load(path: str) -> None:
    with pytest.raises(AslDefinitionError, match=r"States\.S\.InputPath: the JSONPath .* has too many steps"):
        StateMachine.from_definition(one({"Type": "Pass", "InputPath": path}))


def test_a_huge_array_range_is_refused_without_being_built() -> None:
    execution = run(one({"Type": "Pass", "Parameters": {"v.$": "States.ArrayRange(0, 2147483647, 1)"}}), {})
    assert execution.error == "States.Runtime" and "more than 1000" in (execution.cause or "")


def test_lone_surrogates_are_refused_by_name_and_real_pairs_pass() -> None:
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        run(one({"Type": "Pass"}), {"key\udc00": 1})
    parsed = run(one({"Type": "Pass", "Parameters": {"v.$": "States.StringToJson($.s)"}}), {"s": '"\\ud800"'})
    assert parsed.error == "States.Runtime" and "lone UTF-16 surrogate" in (parsed.cause or "")
    pair = run(one({"Type": "Pass", "Parameters": {"v.$": "States.StringToJson($.s)"}}), {"s": '"\\ud83d\\ude00"'})
    assert pair.output == {"v": "\U0001f600"}


def test_big_but_valid_numbers_pass_through_exactly() -> None:
    data = {"big": 10**300, "small": -(10**300), "float": 1.5e308, "tiny": 5e-324}
    assert run(one({"Type": "Pass"}), data).output == data
    with pytest.raises(ValueError, match="JSON cannot represent"):
        run(one({"Type": "Pass"}), {"x": float("nan")})


def test_payloads_over_256_kib() -> None:
    with pytest.raises(ValueError, match="over the 262144 byte limit"):
        run(one({"Type": "Pass"}), {"s": "x" * (256 * 1024)})
    grown = run(one({"Type": "Pass", "Parameters": {"a.$": "$.s", "b.$": "$.s"}}), {"s": "é" * 70_000})
    assert grown.error == "States.DataLimitExceeded"  # 4 x 70,000 UTF-8 bytes: the size counts bytes
    assert grown.cause == ("The state/task 'S' returned a result with a size exceeding the maximum number of bytes "
                           "service limit.")
    catching = {"StartAt": "S", "States": {
        "S": {"Type": "Task", "Resource": LAMBDA, "End": True,
              "Catch": [{"ErrorEquals": ["States.DataLimitExceeded"], "Next": "C"}]},
        "C": {"Type": "Pass", "Result": "caught", "End": True}}}
    assert run(catching, {}, lambda *_: "x" * 300_000).output == "caught"  # terminal unless named
