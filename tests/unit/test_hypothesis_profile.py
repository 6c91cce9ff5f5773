"""The suite's Hypothesis profile (tests/conftest.py): no per-example deadline, failures print their blob."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "fixtures" / "hypothesis_probe.py"


def test_the_profile_is_loaded_by_default() -> None:
    assert settings.default.deadline is None and settings.default.print_blob is True


@settings(max_examples=2, database=None)
@given(st.integers())
def test_a_slow_example_is_not_a_failure(_: int) -> None:
    # 250 ms > Hypothesis' default 200 ms deadline: DeadlineExceeded without the profile.
    time.sleep(0.25)


def _probe(tmp_path: Path, name: str, *args: str, fail: bool = False) -> tuple[str, list[str]]:
    """Run the probe test as CI does (CI=true), in a pytest of its own; its output and the examples it drew."""
    out = tmp_path / name
    env = {**os.environ, "CI": "true", "HYPOTHESIS_PROBE_OUT": str(out)}
    env.pop("HYPOTHESIS_PROFILE", None)
    env.pop("HYPOTHESIS_PROBE_FAIL", None)
    if fail:
        env["HYPOTHESIS_PROBE_FAIL"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(PROBE), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == (1 if fail else 0), done.stdout + done.stderr
    return done.stdout, out.read_text().split() if out.exists() else []


def test_ci_draws_new_examples_each_run_and_prints_the_seed_that_repeats_them(tmp_path: Path) -> None:
    # Hypothesis derandomises wherever CI is set: without the profile's derandomize=False and the session
    # seed, the two runs below would draw the very same examples.
    first_output, first = _probe(tmp_path, "first")
    failed_output, second = _probe(tmp_path, "second", fail=True)
    assert len(set(first)) > 1 and first != second[:len(first)]
    seed = re.search(r"hypothesis seed: (\d+) \(rerun with --hypothesis-seed=\1\)", first_output)
    assert seed, first_output
    # A failing run says its seed again at the end; the printed seed gives that run's examples back, all of them.
    second_seed = re.search(r"hypothesis seed: (\d+) ", failed_output)
    assert second_seed and f"hypothesis seed of this run: {second_seed[1]};" in failed_output, failed_output
    _, again = _probe(tmp_path, "again", f"--hypothesis-seed={seed[1]}")
    assert again == first
