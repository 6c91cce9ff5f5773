"""The offline interpreter fails the way Step Functions does: same error names, same Cause texts.

Sources of each text and limit:
- Wait: https://docs.aws.amazon.com/step-functions/latest/dg/state-wait.html (Seconds 0 to 99999999;
  timestamps in RFC 3339 with an uppercase T, and Z or an offset; considered to the second); the
  TimestampPath Cause as AWS writes it (LocalStack's snapshot-validated parity tests,
  https://github.com/localstack/localstack/pull/9813).
- A Standard execution runs at most one year, then fails with States.Timeout:
  https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html
- States.DataLimitExceeded: "The state/task '<name>' returned a result with a size exceeding the
  maximum number of bytes service limit." (the console's text, quoted in
  https://github.com/awslabs/aws-securityhub-multiaccount-scripts/issues/63).
- Paths that match nothing: "An error occurred while executing the state '<name>' (entered at the
  event id #<n>). Invalid path '<path>' : No results for path: $['a']" and, for Parameters,
  "The JSONPath '<path>' specified for the field '<key>.$' could not be found in the input '<json>'".
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import Execution, StateMachine, VirtualClock

START = datetime(2026, 1, 1, tzinfo=UTC)


def run(definition: dict[str, Any], data: Any) -> Execution:
    machine = StateMachine.from_definition(definition, name="Fidelity")
    return machine.run(data, clock=VirtualClock(START))


def wait_on(path: str) -> dict[str, Any]:
    return {"StartAt": "W", "States": {"W": {"Type": "Wait", "TimestampPath": path, "End": True}}}


@pytest.mark.parametrize("stamp", ["2026-01-01 00:10:00Z", "2026-01-01T00:10:00", "2026-01-01t00:10:00z",
                                   "2026-02-30T00:00:00Z", "20260101T001000Z", "tomorrow"])
def test_a_timestamp_that_is_not_rfc3339_fails_with_aws_cause(stamp: str) -> None:
    execution = run(wait_on("$.until"), {"until": stamp})
    assert execution.status == "FAILED" and execution.error == "States.Runtime"
    assert execution.cause == ("An error occurred while executing the state 'W' (entered at the event id #2). "
                               "The TimestampPath parameter does not reference a valid ISO-8601 extended offset "
                               f"date-time format string: $.until == {stamp}")


@pytest.mark.parametrize(("stamp", "waited"), [("2026-01-01T00:10:00Z", 600), ("2026-01-01T00:10:00.999Z", 600),
                                                ("2026-01-01T01:10:00+01:00", 600), ("2025-12-31T00:00:00Z", 0)])
def test_rfc3339_timestamps_wait_to_the_second(stamp: str, waited: int) -> None:
    execution = run(wait_on("$.until"), {"until": stamp})
    assert execution.status == "SUCCEEDED"
    assert (execution.stop_date - START).total_seconds() == waited


@pytest.mark.parametrize("seconds", [-1, 2**31, 1.5, "60"])
def test_seconds_path_outside_aws_range_fails(seconds: Any) -> None:
    definition = {"StartAt": "W", "States": {"W": {"Type": "Wait", "SecondsPath": "$.s", "End": True}}}
    execution = run(definition, {"s": seconds})
    assert execution.error == "States.Runtime"
    assert (execution.cause or "").startswith("An error occurred while executing the state 'W' (entered at the "
                                              "event id #2). ")


def test_a_wait_past_one_year_times_the_execution_out_at_one_year() -> None:
    execution = run(wait_on("$.until"), {"until": "2030-01-01T00:00:00Z"})
    assert execution.status == "TIMED_OUT" and execution.error == "States.Timeout"
    assert (execution.stop_date - START).days == 365


def test_an_oversized_result_fails_with_aws_cause() -> None:
    definition = {"StartAt": "Big", "States": {"Big": {"Type": "Pass", "Parameters": {"blob.$": "$.blob"},
                                                     "ResultPath": "$.copy", "End": True}}}
    execution = run(definition, {"blob": "x" * 150_000})
    assert execution.error == "States.DataLimitExceeded"
    assert (execution.cause or "").startswith("The state/task 'Big' returned a result with a size exceeding the "
                                              "maximum number of bytes service limit.")


def test_invalid_paths_name_the_state_and_the_event_that_entered_it() -> None:
    definition = {"StartAt": "First", "States": {
        "First": {"Type": "Pass", "Next": "Both"},
        "Both": {"Type": "Parallel", "End": True, "Branches": [
            {"StartAt": "Inner", "States": {"Inner": {"Type": "Pass", "InputPath": "$.a['b c'][0]", "End": True}}},
        ]},
    }}
    execution = run(definition, {"a": {}})
    assert execution.error == "States.Runtime"
    entered = next(e["id"] for e in execution.history if e["type"] == "PassStateEntered"
                   and e["stateEnteredEventDetails"]["name"] == "Inner")
    assert execution.cause == (f"An error occurred while executing the state 'Inner' (entered at the event id "
                               f"#{entered}). Invalid path '$.a['b c'][0]' : Missing property in path $['a']['b c']")
    # (a name missing before the last step: AWS's words, see test_asl_recorded_cases)


def test_a_parameters_path_that_matches_nothing_fails_with_aws_cause() -> None:
    definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Parameters": {"x.$": "$.missing"}, "End": True}}}
    execution = run(definition, {"present": 1})
    assert execution.cause == ("An error occurred while executing the state 'P' (entered at the event id #2). "
                               "The JSONPath '$.missing' specified for the field 'x.$' could not be found in the "
                               "input '{\"present\":1}'")


def test_a_wait_of_more_than_99999999_seconds_is_refused_when_loaded() -> None:
    from d2ops.asl import AslDefinitionError

    definition = {"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 100_000_000, "End": True}}}
    with pytest.raises(AslDefinitionError, match="0 to 99999999"):
        StateMachine.from_definition(definition, name="Fidelity")
