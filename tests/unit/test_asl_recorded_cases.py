"""Corners found by replaying runs AWS recorded (the snapshots of LocalStack's Step Functions suite, recorded
against AWS; the snapshot test is named in each docstring) through the interpreter. Our own definitions and
inputs; only the service's words and results are the service's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from d2ops.asl import StateMachine, VirtualClock

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
