import sys
from collections.abc import Iterator

import pytest

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
