"""The last corners of today's Step Functions language (issue 31, item 6), each against AWS's documentation
or a run AWS recorded (the snapshots of LocalStack's Step Functions suite, recorded against AWS; the test
named in each docstring). Our own cases; only the service's words are the service's.

1. a JSONata value of the wrong type is a States.QueryEvaluationError with an EvaluationFailed event;
2. a Map's ``*Path`` numbers read from workflow variables (numeric text included, as AWS accepts it);
3. what an inline Map in JSONata accepts;
4. the context object's contents;
5. the exact causes of SecondsPath/TimestampPath/MaxConcurrencyPath errors;
6. a Wait far in the future;
7. escapes in JSONPath names.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from d2ops.asl import AslDefinitionError, StateMachine, VirtualClock

START = datetime(2026, 1, 1, tzinfo=UTC)
PREFIX = "An error occurred while executing the state '{state}' (entered at the event id #{event})."
JSONATA = {"QueryLanguage": "JSONata"}
PASS_PROCESSOR = {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}
DISTRIBUTED = {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}, **PASS_PROCESSOR}


def run(definition: dict[str, Any], data: Any = None, **options: Any) -> Any:
    return StateMachine.from_definition(definition).run(data, clock=VirtualClock(START), **options)


def types(execution: Any) -> list[str]:
    return [event["type"] for event in execution.history]


def event(execution: Any, kind: str) -> dict[str, Any]:
    return next(e for e in execution.history if e["type"] == kind)


def jsonata_map(**fields: Any) -> dict[str, Any]:
    return {**JSONATA, "StartAt": "M", "States": {"M": {"Type": "Map", "ItemProcessor": PASS_PROCESSOR,
                                                           "End": True, **fields}}}


def wait(**fields: Any) -> dict[str, Any]:
    return {"StartAt": "W", "States": {"W": {"Type": "Wait", "End": True, **fields}}}


# ----- 1. wrong types in JSONata: States.QueryEvaluationError --------------------------------------------------
def test_a_jsonata_map_without_items_over_a_non_array_input_is_a_query_error() -> None:
    """AWS-recorded (test_base_scenarios::test_map_state_items_input_types): QueryEvaluationError, an
    EvaluationFailed event without a location, then MapStateFailed and no MapStateStarted. Mutation: the
    old States.Runtime ("The Map state's input must be an array when it has no Items")."""
    execution = run(jsonata_map(), {"foo": "bar"})
    assert (execution.status, execution.error) == ("FAILED", "States.QueryEvaluationError")
    assert execution.cause == PREFIX.format(state="M", event=2) + ' Map state input must be an array but was: ' \
                                                                  '{"foo":"bar"}'
    assert types(execution) == ["ExecutionStarted", "MapStateEntered", "EvaluationFailed", "MapStateFailed",
                                "ExecutionFailed"]
    assert event(execution, "EvaluationFailed")["evaluationFailedEventDetails"] == {
        "error": "States.QueryEvaluationError", "cause": execution.cause, "state": "M"}


def test_items_of_the_wrong_type_record_evaluation_failed_at_items() -> None:
    """AWS-recorded (test_map_state_items_eval_jsonata_fail): the location is the field, MapStateFailed follows."""
    execution = run(jsonata_map(Items="{% 'text' %}"), {})
    assert execution.error == "States.QueryEvaluationError"
    assert execution.cause.endswith("The JSONata expression ''text'' specified for the field 'Items' returned an "
                                    "unexpected result type. Expected 'array', but was 'string' for value: \"text\"")
    details = event(execution, "EvaluationFailed")["evaluationFailedEventDetails"]
    assert details["location"] == "Items" and details["state"] == "M"
    assert types(execution)[-2:] == ["MapStateFailed", "ExecutionFailed"]


@pytest.mark.parametrize("stamp", ["2016-12-05 21:29:29Z", "2016-12-05T21:29:29", "2016-13-05T21:29:29Z",
                                   "05-12-2016T21:29:29Z"])
def test_a_jsonata_timestamp_that_is_no_instant_is_a_query_error(stamp: str) -> None:
    """AWS-recorded (test_base_scenarios::test_wait_timestamp_jsonata): QueryEvaluationError with these words,
    EvaluationFailed at 'Timestamp', no WaitStateExited. Mutation: the JSONPath States.Runtime cause."""
    definition = {**JSONATA, **wait(Timestamp="{% $states.input.at %}")}
    execution = run(definition, {"at": stamp})
    assert (execution.error, execution.cause) == (
        "States.QueryEvaluationError", PREFIX.format(state="W", event=2) + " The Timestamp field cannot be parsed as "
        f"an ISO-8601 extended offset date-time format string: {stamp}")
    assert event(execution, "EvaluationFailed")["evaluationFailedEventDetails"]["location"] == "Timestamp"
    assert types(execution) == ["ExecutionStarted", "WaitStateEntered", "EvaluationFailed", "ExecutionFailed"]


def test_a_jsonata_timestamp_with_nanoseconds_waits_to_the_second() -> None:
    """AWS-recorded (test_wait_timestamp_jsonata[NANOSECONDS]) succeeds; seconds count, the fraction does not."""
    definition = {**JSONATA, **wait(Timestamp="{% $states.input.at %}")}
    execution = run(definition, {"at": "2026-01-01T00:01:00.999999999Z"})
    assert execution.status == "SUCCEEDED"
    assert execution.stop_date - START == timedelta(seconds=60)


@pytest.mark.parametrize(("definition", "location"), [
    ({**JSONATA, **wait(Seconds="{% 'ten' %}")}, "Seconds"),
    (jsonata_map(Items=[1], MaxConcurrency="{% 'two' %}"), "MaxConcurrency"),
    ({**JSONATA, "StartAt": "C", "States": {"C": {"Type": "Choice", "Default": "S", "Choices": [
        {"Condition": "{% 'yes' %}", "Next": "S"}]}, "S": {"Type": "Succeed"}}}, "Choices[0]/Condition"),
    (jsonata_map(Items=[1], ItemProcessor=DISTRIBUTED, ToleratedFailureCount="{% 'none' %}"),
     "ToleratedFailureCount"),
    (jsonata_map(Items=[1], ItemProcessor=DISTRIBUTED, ToleratedFailurePercentage="{% [] %}"),
     "ToleratedFailurePercentage"),
])
def test_every_wrongly_typed_jsonata_field_is_a_query_error_where_it_is(definition: dict[str, Any],
                                                                         location: str) -> None:
    execution = run(definition, {})
    assert execution.error == "States.QueryEvaluationError"
    assert "returned an unexpected result type" in execution.cause
    assert event(execution, "EvaluationFailed")["evaluationFailedEventDetails"]["location"] == location


@pytest.mark.parametrize("error_equals", [["States.ALL"], ["States.QueryEvaluationError"]])
def test_a_query_error_is_caught_by_states_all_and_by_its_name(error_equals: list[str]) -> None:
    """The error-handling guide: States.ALL matches every error but States.Runtime and States.DataLimitExceeded.
    Mutation: a QueryEvaluationError treated like States.Runtime (uncatchable)."""
    definition = jsonata_map(Items="{% $states.input.items %}",
                             Catch=[{"ErrorEquals": error_equals, "Next": "Handled",
                                     "Output": "{% $states.errorOutput.Error %}"}])
    del definition["States"]["M"]["End"]
    definition["States"]["M"]["Next"] = "Handled"
    definition["States"]["Handled"] = {"Type": "Pass", "End": True}
    execution = run(definition, {"items": 5})
    assert (execution.status, execution.output) == ("SUCCEEDED", "States.QueryEvaluationError")
    assert "EvaluationFailed" in types(execution)


def test_a_failing_output_records_evaluation_failed_at_its_field() -> None:
    """AWS-recorded (test_assign_reference_variables::test_undefined_reference): location 'Output/result'."""
    definition = {**JSONATA, "StartAt": "P", "States": {"P": {"Type": "Pass", "Output": {"result": "{% $nope %}"},
                                                              "End": True}}}
    execution = run(definition, {})
    assert event(execution, "EvaluationFailed")["evaluationFailedEventDetails"]["location"] == "Output/result"
    assert types(execution)[-2:] == ["EvaluationFailed", "ExecutionFailed"]


def test_a_jsonpath_state_records_no_evaluation_failed() -> None:
    """The API reference: the event is present only for JSONata states."""
    execution = run(wait(SecondsPath="$.missing"), {})
    assert execution.error == "States.Runtime" and "EvaluationFailed" not in types(execution)


# ----- 2. a Map's *Path numbers from workflow variables ---------------------------------------------------------
def _assign_then(map_state: dict[str, Any], assign: dict[str, Any]) -> dict[str, Any]:
    return {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": assign, "Result": {"Values": [1, 2, 3]}, "Next": "M"},
        "M": {"Type": "Map", "ItemsPath": "$.Values", "End": True, **map_state}}}


def test_max_concurrency_path_reads_a_variable_holding_numeric_text() -> None:
    """AWS-recorded (test_sfn_api_variable_references / test_assign_reference_variables::test_reference_in_map_state
    [MAP_STATE_REFERENCE_IN_MAX_CONCURRENCY_PATH]): "1" from a variable succeeds. Mutation: numbers only."""
    definition = _assign_then({"MaxConcurrencyPath": "$limit", "ItemProcessor": PASS_PROCESSOR}, {"limit": "1"})
    execution = run(definition)
    assert (execution.status, execution.output) == ("SUCCEEDED", [1, 2, 3])


def test_distributed_map_path_fields_read_variables() -> None:
    """AWS-recorded: ToleratedFailure*Path ("1"), MaxItemsPerBatchPath ("2") and MaxInputBytesPerBatchPath
    ("15000") from variables succeed (MAP_STATE_REFERENCE_IN_TOLERATED_FAILURE_PATH / _MAX_PER_BATCH_PATH)."""
    definition = _assign_then({"MaxConcurrencyPath": "$limit", "ToleratedFailureCountPath": "$count",
                               "ToleratedFailurePercentagePath": "$share",
                               "ItemBatcher": {"MaxItemsPerBatchPath": "$per", "MaxInputBytesPerBatchPath": "$bytes"},
                               "ItemProcessor": DISTRIBUTED},
                              {"limit": 2, "count": "1", "share": "12.5", "per": "2", "bytes": "15000"})
    execution = run(definition)
    assert (execution.status, execution.output) == ("SUCCEEDED", [{"Items": [1, 2]}, {"Items": [3]}])
    run_fields = next(iter(execution.map_runs.values()))
    assert (run_fields["maxConcurrency"], run_fields["toleratedFailureCount"],
            run_fields["toleratedFailurePercentage"]) == (2, 1, 12.5)


def test_max_items_path_reads_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS-recorded (MAP_STATE_REFERENCE_IN_MAX_ITEMS_PATH): ReaderConfig.MaxItemsPath "$maxItems" holding "2"."""
    from moto import mock_aws

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="corners")
        s3.put_object(Bucket="corners", Key="items.json", Body=b"[10, 20, 30]")
        definition = _assign_then({"ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
                                                  "ReaderConfig": {"InputType": "JSON", "MaxItemsPath": "$maxItems"},
                                                  "Parameters": {"Bucket": "corners", "Key": "items.json"}},
                                   "ItemProcessor": DISTRIBUTED}, {"maxItems": "2"})
        execution = run(definition)
    assert (execution.status, execution.output) == ("SUCCEEDED", [10, 20])


@pytest.mark.parametrize(("value", "shown"), [("NoNumber", "NoNumber"), ({}, "{}"), (1.5, "1.5"), ("1.0", "1.0")])
def test_a_max_concurrency_path_that_is_no_integer_fails_with_the_recorded_words(value: Any, shown: str) -> None:
    """AWS-recorded (test_base_scenarios::test_max_concurrency_path[NoNumber], [max_concurrency_value0]), the
    inline Map as well as the distributed one. Mutation: the old inline-only wording ("must select a
    non-negative integer")."""
    definition = _assign_then({"MaxConcurrencyPath": "$limit", "ItemProcessor": PASS_PROCESSOR}, {"limit": value})
    execution = run(definition)
    assert (execution.error, execution.cause) == (
        "States.Runtime", PREFIX.format(state="M", event=4) + f' The MaxConcurrencyPath field refers to value '
                                                               f'"{shown}" which is not a valid integer: $limit')


# ----- 3. an inline Map in JSONata -----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["ItemsPath", "Parameters", "ResultPath", "ResultSelector", "InputPath",
                                   "OutputPath", "MaxConcurrencyPath"])
def test_a_jsonata_map_refuses_the_jsonpath_fields(field: str) -> None:
    with pytest.raises(AslDefinitionError, match=f"field '{field}' is only supported for the 'JSONPath'"):
        StateMachine.from_definition(jsonata_map(Items=[1], **{field: "$.x" if field.endswith("Path") else {}}))


def test_a_jsonata_item_selector_sees_the_item_its_index_and_the_map_input() -> None:
    """The Map state page: ItemSelector (JSONata) with $states.context.Map.Item.Index/Value; $states.input is
    the Map state's input."""
    definition = jsonata_map(Items="{% $states.input.list %}", ItemSelector={
        "index": "{% $states.context.Map.Item.Index %}", "value": "{% $states.context.Map.Item.Value %}",
        "tag": "{% $states.input.tag %}"})
    execution = run(definition, {"list": ["a", "b"], "tag": "t"})
    assert execution.output == [{"index": 0, "value": "a", "tag": "t"}, {"index": 1, "value": "b", "tag": "t"}]


def test_a_jsonata_item_selector_may_be_one_expression() -> None:
    definition = jsonata_map(Items=[3, 4], ItemSelector="{% $states.context.Map.Item.Value * 10 %}")
    assert run(definition, {}).output == [30, 40]


# ----- 4. the context object -----------------------------------------------------------------------------------
def test_the_context_of_a_pass_state_has_no_retry_count() -> None:
    """AWS-recorded (test_context_object::test_input_path[$$], a Pass state): State holds Name and EnteredTime
    only; Execution and StateMachine hold exactly these keys. Mutation: RetryCount in every state's context."""
    definition = {**JSONATA, "StartAt": "P", "States": {"P": {"Type": "Pass", "Output": "{% $states.context %}",
                                                              "End": True}}}
    execution = run(definition, {"x": 1}, execution_name="corner")
    context = execution.output
    assert set(context) == {"Execution", "StateMachine", "State"}
    assert context["Execution"] == {"Id": execution.arn, "Input": {"x": 1}, "Name": "corner",
                                    "RoleArn": execution.state_machine.role_arn,
                                    "StartTime": "2026-01-01T00:00:00.000Z", "RedriveCount": 0}
    assert context["StateMachine"] == {"Id": execution.state_machine.arn, "Name": execution.state_machine.name}
    assert context["State"] == {"Name": "P", "EnteredTime": "2026-01-01T00:00:00.000Z"}


def test_a_task_context_counts_retries_and_only_callbacks_get_a_token() -> None:
    """AWS-recorded (test_lambda_invoke_with_retry_extended_input): a Task's State has RetryCount; the Context
    object page: Task.Token for .waitForTaskToken tasks."""
    seen: list[dict[str, Any]] = []

    def flaky(resource: str, parameters: Any, context: Any) -> Any:
        seen.append(parameters)
        if len(seen) == 1:
            raise RuntimeError("once")
        return {}

    definition = {"StartAt": "T", "States": {"T": {
        "Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f", "End": True,
        "Parameters": {"state.$": "$$.State", "keys.$": "States.JsonToString($$)"},
        "Retry": [{"ErrorEquals": ["RuntimeError"], "IntervalSeconds": 1}]}}}
    execution = run(definition, {}, executors={"arn:aws:lambda:*": flaky})
    assert execution.status == "SUCCEEDED"
    assert [p["state"]["RetryCount"] for p in seen] == [0, 1]
    assert '"Task"' not in seen[0]["keys"]


# ----- 5. the causes of SecondsPath / TimestampPath errors -----------------------------------------------------
@pytest.mark.parametrize(("data", "detail"), [
    ({}, "The SecondsPath parameter does not reference an input value: $.s"),
    ({"s": 1.5}, "The SecondsPath parameter cannot be parsed as a long value: $.s == 1.5"),
    ({"s": -1.5}, "The SecondsPath parameter cannot be parsed as a long value: $.s == -1.5"),
    ({"s": -1}, "The SecondsPath parameter references a negative value: $.s == -1"),
])
def test_seconds_path_errors_carry_the_recorded_causes(data: dict[str, Any], detail: str) -> None:
    """AWS-recorded (test_wait::test_base_wait_seconds_path, test_logs wait_seconds_path). Mutation: the
    interpreter's earlier single "does not reference an integer from 0 to 99999999" cause, or "Invalid path"."""
    execution = run(wait(SecondsPath="$.s"), data)
    assert (execution.error, execution.cause) == ("States.Runtime", PREFIX.format(state="W", event=2) + " " + detail)


def test_seconds_path_zero_does_not_wait() -> None:
    execution = run(wait(SecondsPath="$.s"), {"s": 0})
    assert execution.status == "SUCCEEDED" and execution.stop_date == START


def test_a_seconds_path_variable_is_read_like_an_input_value() -> None:
    definition = {"StartAt": "A", "States": {"A": {"Type": "Pass", "Assign": {"pause": 90}, "Next": "W"},
                                             "W": {"Type": "Wait", "SecondsPath": "$pause", "End": True}}}
    execution = run(definition, {})
    assert execution.status == "SUCCEEDED" and execution.stop_date - START == timedelta(seconds=90)


# ----- 6. a Wait far in the future ------------------------------------------------------------------------------
def _days_ahead(days: int) -> str:
    return (START + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_timestamp_68_years_ahead_is_refused_at_once() -> None:
    """AWS-recorded (test_wait::test_timestamp_too_far_in_future_boundary[24856]): States.Runtime "Wait state
    delay is too long." right after WaitStateEntered. Mutation: waiting (TIMED_OUT after a year)."""
    execution = run(wait(TimestampPath="$.at"), {"at": _days_ahead(24856)})
    assert (execution.error, execution.cause) == ("States.Runtime", PREFIX.format(state="W", event=2) +
                                                  " Wait state delay is too long.")
    assert types(execution) == ["ExecutionStarted", "WaitStateEntered", "ExecutionFailed"]


def test_a_timestamp_just_inside_the_bound_waits_until_the_year_is_over() -> None:
    """AWS-recorded ([24855]): the Wait is entered and waits; a Standard execution ends at one year (service
    quotas: States.Timeout)."""
    execution = run(wait(TimestampPath="$.at"), {"at": _days_ahead(24855)})
    assert (execution.status, execution.error) == ("TIMED_OUT", "States.Timeout")
    assert execution.stop_date - START == timedelta(days=365)


@pytest.mark.parametrize(("fields", "data", "detail"), [
    ({"SecondsPath": "$.s"}, {"s": 2**31}, "Wait state delay is too long."),
    ({"SecondsPath": "$.s"}, {"s": 10**30},  # past a Java long: not a number the service can hold
     f"The SecondsPath parameter cannot be parsed as a long value: $.s == {10**30}"),
    ({"Timestamp": "9999-12-31T23:59:59Z"}, None, "Wait state delay is too long."),
    ({"TimestampPath": "$.at"}, {"at": "9999-12-31T23:59:59-23:59"}, "Wait state delay is too long."),
])
def test_delays_beyond_the_bound_fail_without_overflow(fields: dict[str, Any], data: Any, detail: str) -> None:
    """The last offset puts the instant past year 9999 in UTC: compared, never converted, so nothing overflows."""
    execution = run(wait(**fields), data)
    assert (execution.error, execution.cause) == ("States.Runtime", PREFIX.format(state="W", event=2) + " " + detail)


def test_a_seconds_path_over_the_seconds_field_bound_waits_like_any_other() -> None:
    """The Wait page bounds Seconds (0-99999999), not SecondsPath ("an integer value"): 100,000,000 seconds
    is over three years, so the execution times out at one year. Mutation: refusing it as out of range."""
    execution = run(wait(SecondsPath="$.s"), {"s": 100_000_000})
    assert (execution.status, execution.stop_date - START) == ("TIMED_OUT", timedelta(days=365))


# ----- 7. escapes in JSONPath names -----------------------------------------------------------------------------
DATA = {"a.b": 1, "a": {"b": 2}, "it's": 3, 'say "hi"': 4, "[x]": 5, "$": 6, "star*": 7}


@pytest.mark.parametrize(("path", "value"), [
    ("$['a.b']", 1), ('$["a.b"]', 1), ("$.['a.b']", 1), ("$.a.b", 2), ("$['a']['b']", 2), ("$['it\\'s']", 3),
    ('$["say \\"hi\\""]', 4), ("$['[x]']", 5), ("$['$']", 6), ("$['star*']", 7),
])
def test_bracketed_names_with_special_characters_select_one_field(path: str, value: Any) -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Parameters": {"v.$": path}, "End": True}}}
    assert run(definition, DATA).output == {"v": value}


def test_a_dotted_name_in_a_result_path_is_one_field_not_two() -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Result": 9, "ResultPath": "$['r.s']",
                                                   "End": True}}}
    assert run(definition, {}).output == {"r.s": 9}


def test_bracketed_names_after_a_variable() -> None:
    definition = {"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Assign": {"v": DATA}, "Next": "P"},
        "P": {"Type": "Pass", "Parameters": {"dot.$": "$v['a.b']", "quote.$": "$v['it\\'s']"}, "End": True}}}
    assert run(definition, {}).output == {"dot": 1, "quote": 3}


def test_an_escaped_double_quote_inside_single_quotes_keeps_its_backslash() -> None:
    """AWS-recorded (test_base_scenarios::test_escape_sequence_parsing[ESCAPE_SEQUENCES_JSONPATH]): the path
    $['Test\\""Name"'] selects the key Test\\""Name"  (backslash, two quotes). Mutation: unescaping every
    quote, which looks for Test""Name" and fails with States.Runtime."""
    key = 'Test\\""Name"'
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Parameters": {"value.$": "$['Test\\\"\"Name\"']"},
                                                   "End": True}}}
    execution = run(definition, {key: 'Value"\\'})
    assert (execution.status, execution.output) == ("SUCCEEDED", {"value": 'Value"\\'})


def test_a_missing_error_path_fails_with_the_recorded_words() -> None:
    """AWS-recorded (test_base_scenarios::test_invalid_jsonpath[INVALID_JSONPATH_IN_ERRORPATH]): the Fail
    state's ErrorPath names its field like a Parameters path. Mutation: the generic "Invalid path" cause."""
    definition = {"StartAt": "F", "States": {"F": {"Type": "Fail", "ErrorPath": "$.ErrorX", "Cause": "c"}}}
    execution = run(definition, {"Error": "E"})
    assert (execution.error, execution.cause) == (
        "States.Runtime", PREFIX.format(state="F", event=2) + " The JSONPath '$.ErrorX' specified for the field "
                                                              "'ErrorPath' could not be found in the input "
                                                              '\'{"Error":"E"}\'')


# ----- history details AWS records around these corners ----------------------------------------------------------
def test_a_retried_map_records_map_state_failed_only_when_it_gives_up() -> None:
    """AWS-recorded (test_base_scenarios::test_map_state_retry): MapStateStarted per attempt, MapStateFailed once,
    after the last. Mutation: MapStateFailed after every failed attempt."""
    definition = {"StartAt": "M", "States": {"M": {
        "Type": "Map", "End": True, "Retry": [{"ErrorEquals": ["ItemFailed"], "MaxAttempts": 2}],
        "ItemProcessor": {"StartAt": "F", "States": {"F": {"Type": "Fail", "Error": "ItemFailed", "Cause": "c"}}}}}}
    execution = run(definition, [1])
    kinds = types(execution)
    assert kinds.count("MapStateStarted") == 3 and kinds.count("MapStateFailed") == 1
    assert kinds[-2:] == ["MapStateFailed", "ExecutionFailed"]


def test_the_first_state_and_an_evaluation_failure_point_where_aws_points() -> None:
    """AWS-recorded (every history; test_assign_reference_variables::test_undefined_reference): the first
    state's Entered event has previousEventId 0, and EvaluationFailed carries its state's Entered event's
    previousEventId. Mutation: a plain chain (1, and the Entered event's id)."""
    definition = {**JSONATA, "StartAt": "A", "States": {
        "A": {"Type": "Pass", "Next": "B"},
        "B": {"Type": "Pass", "Output": "{% $nothing %}", "End": True}}}
    events = run(definition, {}).history
    assert [(e["id"], e["previousEventId"], e["type"]) for e in events] == [
        (1, 0, "ExecutionStarted"), (2, 0, "PassStateEntered"), (3, 2, "PassStateExited"),
        (4, 3, "PassStateEntered"), (5, 3, "EvaluationFailed"), (6, 5, "ExecutionFailed")]


def test_a_task_sleeping_for_centuries_reaches_the_execution_deadline_without_overflow() -> None:
    """An executor may sleep any span (TaskContext.sleep); the one-year execution bound stops it. Mutation:
    computing now + seconds first (OverflowError, the execution failing as an interpreter error)."""
    def sleeper(resource: str, parameters: Any, context: Any) -> Any:
        context.sleep(1e15)
        return {}

    definition = {"StartAt": "T", "States": {"T": {"Type": "Task", "End": True,
                                                   "Resource": "arn:aws:lambda:us-east-1:123456789012:function:f"}}}
    execution = run(definition, {}, executors={"arn:aws:lambda:*": sleeper})
    assert (execution.status, execution.stop_date - START) == ("TIMED_OUT", timedelta(days=365))


@pytest.mark.parametrize("seconds", [1e15, float("inf")])
def test_the_virtual_clock_stops_at_the_end_of_the_calendar(seconds: float) -> None:
    clock = VirtualClock(START)
    clock.advance(seconds)
    assert clock.now() > START + timedelta(days=365 * 7000) and clock.now().year == 9999
