"""The suite's Hypothesis profile (tests/conftest.py): no per-example deadline, failures print their blob."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_profile_is_loaded_by_default() -> None:
    assert settings.default.deadline is None and settings.default.print_blob is True


@settings(max_examples=2, database=None)
@given(st.integers())
def test_a_slow_example_is_not_a_failure(_: int) -> None:
    # 250 ms > Hypothesis' default 200 ms deadline: DeadlineExceeded without the profile.
    time.sleep(0.25)
