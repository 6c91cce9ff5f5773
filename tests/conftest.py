import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

# OpenMP threads that wait sleep instead of spinning: torch here, and in every training job and
# TorchServe worker the tests start (they inherit the environment). On the shared 2-core machine a
# torchvision training step with 2 threads burnt 10.3 CPU-s spinning by default, 7.1 with PASSIVE
# (1 thread: 6.8); 20 detectron2 iterations through train-local 141.6 -> 44.3 CPU-s with the same
# losses (docs/training.md). The thread count, so the arithmetic, is unchanged. Set before anything
# imports torch: libgomp reads it when it is loaded. A value the caller set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Hypothesis: no per-example deadline (the default 200 ms flakes on the shared, loaded 2-core
# machine: a slow example is not a failing one; the suite's own time bounds the tests), examples stay
# random, and a failure prints the blob that reproduces it (@reproduce_failure). A test's own
# @settings still wins for what it names; HYPOTHESIS_PROFILE picks another registered profile.
settings.register_profile("d2ops", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "d2ops"))

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
