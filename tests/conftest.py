import os
import secrets
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

# OpenMP threads that wait sleep instead of spinning: torch here, and in every TorchServe worker the
# tests start (they inherit the environment; local training and processing jobs set it themselves,
# d2ops.local.jobs). On the shared 2-core machine a torchvision training step with 2 threads burnt
# 10.3 CPU-s spinning by default, 7.1 with PASSIVE (1 thread: 6.8); 20 iterations of the earlier
# detectron2 CPU profile through train-local 141.6 -> 44.3 CPU-s with the same losses
# (docs/training.md). The thread count, so the arithmetic, is unchanged. Set before anything
# imports torch: libgomp reads it when it is loaded. A value the caller set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Hypothesis: no per-example deadline (the default 200 ms flakes on the shared, loaded 2-core
# machine: a slow example is not a failing one; the suite's own time bounds the tests), and a failure
# prints the blob that reproduces it (@reproduce_failure). Examples stay random in CI too: Hypothesis'
# own settings derandomise wherever CI is set, so CI would draw the same examples on every run and never
# find anything new. Each session draws one seed instead (pytest_configure below), printed in the
# header and again after a failure. A test's own @settings still wins for what it names;
# HYPOTHESIS_PROFILE picks another registered profile.
settings.register_profile("d2ops", deadline=None, print_blob=True, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "d2ops"))
HYPOTHESIS_SEED = pytest.StashKey[object]()


def pytest_configure(config: pytest.Config) -> None:
    """One random Hypothesis seed per session unless ``--hypothesis-seed`` names one: new examples each run,
    and the run's seed is known, so a failure found in CI reruns anywhere with ``--hypothesis-seed=N``."""
    from hypothesis import core

    given = config.getoption("--hypothesis-seed", None)
    if given is None and not settings.default.derandomize:
        core.global_force_seed = secrets.randbelow(2**32)
    config.stash[HYPOTHESIS_SEED] = given if given is not None else core.global_force_seed


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.stash.get(HYPOTHESIS_SEED, None)
    return None if seed is None else f"hypothesis seed: {seed} (rerun with --hypothesis-seed={seed})"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seed = config.stash.get(HYPOTHESIS_SEED, None)
    if seed is not None and exitstatus == pytest.ExitCode.TESTS_FAILED:
        terminalreporter.write_line(f"hypothesis seed of this run: {seed}; the same examples again: "
                                    f"pytest --hypothesis-seed={seed} <failed test ids>")


# Every in-process boto3 call is checked against AWS's whole request contract (enums, patterns, maximums).
pytest_plugins = ["tests.fixtures.aws_contract_plugin"]


@pytest.fixture(scope="module", autouse=True)
def _fresh_moto_state() -> Iterator[None]:
    """Each test module starts from empty AWS state.

    moto servers started in-process (ThreadedMotoServer, the offline runtime) share moto's
    global backends, so model packages, queues and messages one module created would
    otherwise show up in the next module's assertions.
    """
    if "moto" in sys.modules:
        from moto.moto_api._internal.models import moto_api_backend

        moto_api_backend.reset()
    yield
