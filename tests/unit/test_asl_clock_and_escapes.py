"""The virtual clock starts at the wall clock; quoted path names are read as Jayway (Step Functions' JsonPath)
reads them in query paths as in reference paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from d2ops.asl import StateMachine, VirtualClock
from d2ops.asl.paths import select


def test_the_virtual_clock_starts_now_in_utc_to_the_millisecond() -> None:
    before = datetime.now(UTC)
    clock = VirtualClock()
    after = datetime.now(UTC)
    assert before - timedelta(milliseconds=1) <= clock.now() <= after
    assert clock.now().tzinfo is not None and clock.now().microsecond % 1000 == 0


def test_a_past_timestamp_path_does_not_wait_and_a_near_one_waits_until_it() -> None:
    # With the clock at 2024-01-01 a TimestampPath an hour ago (computed from the wall clock) was years
    # ahead: the execution waited past a year and ended TIMED_OUT.
    machine = StateMachine.from_definition({"StartAt": "W", "States": {"W": {
        "Type": "Wait", "TimestampPath": "$.at", "End": True}}})
    now = datetime.now(UTC)
    past = machine.run({"at": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")})
    assert past.status == "SUCCEEDED" and past.stop_date is not None
    assert (past.stop_date - past.start_date).total_seconds() == 0
    soon = machine.run({"at": (now + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")})
    assert soon.status == "SUCCEEDED" and soon.stop_date is not None
    assert 290 <= (soon.stop_date - soon.start_date).total_seconds() <= 300


DATA: dict[str, Any] = {"it's": 1, "a\\b": 2, 'x"y': 3, "n\nl": 4, "u\u00e9": 5, "a/b": 6, "tab\t": 7}


@pytest.mark.parametrize(("quoted", "key"), [
    ("'it\\'s'", "it's"), ("'a\\\\b'", "a\\b"), ('"x\\"y"', 'x"y'), ("'n\\nl'", "n\nl"),
    ("'u\\u00e9'", "u\u00e9"), ("'a\\/b'", "a/b"), ("'tab\\t'", "tab\t")])
def test_bracket_escapes_read_the_same_in_reference_and_query_paths(quoted: str, key: str) -> None:
    assert select(f"$[{quoted}]", DATA) == DATA[key]  # a reference path: one node
    assert select(f"$..[{quoted}]", DATA) == [DATA[key]]  # a query path (jsonpath-ng): a list
    assert select(f"$[{quoted},'a/b']", DATA) == [DATA[key], DATA["a/b"]]
