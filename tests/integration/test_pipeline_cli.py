"""`d2ops asl run` on the pipeline definition with its Step Functions Local mock config, as a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pipeline import support

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("case", "exit_code", "error"), [("UpdateDeployment", 0, None),
                                                          ("GateFailedRegression", 1, "QualityGateFailed")])
def test_asl_run_prints_the_outcome(tmp_path: Path, case: str, exit_code: int, error: str | None) -> None:
    (tmp_path / "subs.json").write_text(json.dumps(support.substitutions()))
    (tmp_path / "input.json").write_text(json.dumps(support.INPUT))
    # As in Step Functions Local, every Task on the path needs a mocked response: the unit tests run the
    # real compose_notification handler for the two "Compose … notification" states, a process cannot.
    config = json.loads(support.MOCK_CONFIG.read_text())
    config["MockedResponses"]["Composed"] = {"0": {"Return": {"Payload": {
        "subject": "d2ops: shapes v1", "fields": {"cost": None, "cost_summary": "cost unknown: mocked",
                                                  "cost_unknown": "mocked"}}}}}
    for machine in config["StateMachines"].values():
        machine["TestCases"][case] |= {f"Compose {outcome} notification": "Composed"
                                       for outcome in ("success", "failure")}
    mock_config = tmp_path / "mock.json"
    mock_config.write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "d2ops", "asl", "run", str(support.DEFINITION), "--input", str(tmp_path / "input.json"),
         "--substitutions", str(tmp_path / "subs.json"), "--mock-config", str(mock_config),
         "--test-case", case, "--execution-name", support.RUN_ID, "--history", str(tmp_path / "history.json")],
        capture_output=True, text=True, timeout=120, cwd=support.REPO)
    assert result.returncode == exit_code, result.stderr
    printed = json.loads(result.stdout)
    history = json.loads((tmp_path / "history.json").read_text())
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if e["type"].endswith("StateEntered")]
    if error is None:
        assert printed["champion"]["run_id"] == support.RUN_ID
        assert "Update endpoint (blue/green)" in entered
    else:
        assert error in json.dumps(printed)
        assert entered[-1] == "Quality gate failed"
