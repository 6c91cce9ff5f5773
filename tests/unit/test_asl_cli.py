"""``d2ops asl run``: output, exit codes (0 succeeded, 1 failed, 2 bad definition or usage), history file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "asl"
DEFINITION = str(FIXTURES / "mini_pipeline.asl.json")
COMMON = ["asl", "run", DEFINITION, "--input", str(FIXTURES / "mini_pipeline.input.json"),
          "--mock-config", str(FIXTURES / "mini_pipeline.mock.json"),
          "--substitutions", str(FIXTURES / "mini_pipeline.substitutions.json"), "--execution-name", "cli-run"]


def d2ops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "d2ops", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_success_prints_the_output_and_exits_0() -> None:
    result = d2ops(*COMMON, "--test-case", "HappyPath")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"job": "r-train", "model": "s3://artifacts/runs/r/model.tar.gz"}
    assert "-> Validate dataset (Task)" in result.stderr and "ExecutionSucceeded" in result.stderr


def test_a_failed_execution_prints_error_and_cause_and_exits_1() -> None:
    result = d2ops(*COMMON, "--test-case", "DatasetRejected")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"error": "DatasetRejected",
                                         "cause": "s3://artifacts/runs/r/validation/report.json"}
    assert "execution cli-run FAILED" in result.stderr


def test_a_bad_definition_exits_2_naming_the_problem(tmp_path: Path) -> None:
    definition = tmp_path / "broken.asl.json"
    definition.write_text(json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "B"}}}))
    result = d2ops("asl", "run", str(definition))
    assert result.returncode == 2
    assert "States.A.Next: names a state that does not exist in this scope: 'B'" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "message"), [
    (["--mock-config", str(FIXTURES / "mini_pipeline.mock.json")], "--mock-config and --test-case go together"),
    (["--substitutions", str(FIXTURES / "mini_pipeline.substitutions.json"), "--mock-config",
      str(FIXTURES / "mini_pipeline.mock.json"), "--test-case", "NoSuchCase"], "has no test case 'NoSuchCase'"),
    ([], "unreplaced placeholders: ${Partition}, ${ValidateFunctionArn}, ${EndpointName}, ${TopicArn}"),
    (["--substitutions", str(FIXTURES / "mini_pipeline.substitutions.json")],
     "Task state 'Validate dataset': no mocked response and no executor"),
    (["--input", str(FIXTURES / "mini_pipeline.asl.json.missing")], "cannot read the input file"),
])
def test_usage_problems_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["asl", "run", DEFINITION, *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_malformed_input_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "input.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as info:
        main([*COMMON, "--test-case", "HappyPath", "--input", str(bad)])
    assert info.value.code == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_non_utf8_files_and_an_unwritable_history_exit_2_naming_the_file(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    latin1 = tmp_path / "latin1.asl.json"
    latin1.write_bytes(b'{"StartAt": "A", "States": {"A": {"Type": "Pass", "Result": "caf\xe9", "End": true}}}')
    plain = tmp_path / "plain.asl.json"
    plain.write_text(json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}}))
    mock = tmp_path / "mock.json"
    mock.write_bytes(b'{"StateMachines": {"plain": {"TestCases": {"c\xe9": {}}}}, "MockedResponses": {}}')
    cases = [
        (["asl", "run", str(latin1)], f"{latin1}: the definition is not UTF-8 text"),
        (["asl", "validate", str(latin1)], f"{latin1}: the definition is not UTF-8 text"),
        (["asl", "run", str(plain), "--input", str(mock)], f"the input file {mock} is not UTF-8 text"),
        (["asl", "validate", str(plain), "--mock-config", str(mock)], f"{mock}: not UTF-8 text"),
        (["asl", "run", str(plain), "--history", str(tmp_path / "no-dir" / "h.json")],
         "its directory does not exist"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2, args
        assert message in capsys.readouterr().err, args


def test_history_file_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "history.json"
    code = main([*COMMON, "--test-case", "TrainingFailed", "--history", str(history), "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    assert json.loads(captured.out)["error"] == "TrainingFailed"
    assert "->" not in captured.err
    events = json.loads(history.read_text())
    assert events[0]["type"] == "ExecutionStarted" and events[-1]["type"] == "ExecutionFailed"
    assert events[-1]["timestamp"].endswith("+00:00")
    assert not list(tmp_path.glob("*.partial"))


def test_validate_checks_the_definition_and_every_mock_test_case(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = ["asl", "validate", DEFINITION, "--substitutions", str(FIXTURES / "mini_pipeline.substitutions.json")]
    assert main([*args, "--mock-config", str(FIXTURES / "mini_pipeline.mock.json")]) == 0
    assert "valid (15 top-level states, 7 Task states; 7 mock test cases)" in capsys.readouterr().out
    mock = json.loads((FIXTURES / "mini_pipeline.mock.json").read_text())
    mock["StateMachines"]["mini_pipeline"]["TestCases"]["HappyPath"]["Trian"] = "TrainingCompleted"
    typo = tmp_path / "mock.json"
    typo.write_text(json.dumps(mock))
    with pytest.raises(SystemExit) as info:
        main([*args, "--mock-config", str(typo)])
    assert info.value.code == 2
    assert "mocks 'Trian', which is not a Task state" in capsys.readouterr().err
