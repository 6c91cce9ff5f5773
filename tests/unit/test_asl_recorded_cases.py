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
