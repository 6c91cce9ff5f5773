"""The trigger's CloudWatch metrics: EMF documents printed by real handler invocations (moto behind them)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from d2ops_core import pipeline_metrics as pm
from tests.fixtures.emf import emf_metrics, total
from tests.fixtures.pipeline import support

support.function_path("start_pipeline")
from start_pipeline import handler as start_handler  # noqa: E402


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    support.aws_env(monkeypatch)
    with mock_aws():
        yield


def test_the_trigger_counts_started_runs_and_duplicate_deliveries(aws: None, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STATE_MACHINE_ARN", support.create_state_machine(boto3.client("stepfunctions")))
    event = support.load_event("start_pipeline", "manifest_uploaded")
    for _ in range(3):
        start_handler.handler(copy.deepcopy(event), support.FakeLambdaContext())
    out = capsys.readouterr().out
    assert total(out, pm.RUNS_STARTED) == 1 and total(out, pm.DUPLICATE_DELIVERIES) == 2
    ignored = copy.deepcopy(event)
    ignored["detail"]["object"]["key"] = "datasets/shapes/v1/images/a.png"
    start_handler.handler(ignored, support.FakeLambdaContext())
    out = capsys.readouterr().out
    assert total(out, pm.RUNS_STARTED) == 0 and total(out, pm.DUPLICATE_DELIVERIES) == 0
    assert {name for name, _, _ in emf_metrics(out)} == {pm.RUNS_STARTED, pm.DUPLICATE_DELIVERIES}
