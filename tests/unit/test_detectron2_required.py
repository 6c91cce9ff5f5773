"""A missing detectron2 skips its tests on a developer's machine and fails them in CI (tests/fixtures/frameworks.py).

The suite's detectron2 tests run in a pytest of their own with detectron2 hidden
(tests/fixtures/hide_detectron2.py), once as CI runs them (``CI=true``) and once as a developer does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.frameworks import in_ci, require_detectron2

REPO = Path(__file__).resolve().parents[2]
# Every place the suite needs detectron2: three files at their top, three tests (one through a fixture).
MODULE_LEVEL = ["tests/unit/test_detectron2_export.py", "tests/integration/test_detectron2_serving.py",
                "tests/integration/test_detectron2_training.py"]
TEST_LEVEL = ["tests/unit/test_trainer_choice.py::test_detectron2_imports_in_this_environment_when_installed",
              "tests/unit/test_training_detectron2.py::test_metric_writer_is_an_event_writer_and_prints_metric_lines",
              "tests/unit/test_training_detectron2.py::test_reference_world_size_rule_is_detectron2s_own[8-16]"]


def test_ci_is_any_value_but_empty_false_no_or_zero() -> None:
    for value in ("true", "1", "yes", "True", "azure"):
        assert in_ci({"CI": value}), value
    for value in ("", "0", "false", "False", "no", " "):
        assert not in_ci({"CI": value}), value
    assert not in_ci({})


@pytest.mark.parametrize("module", ["detectron2", "detectron2.engine.defaults"])
def test_a_missing_detectron2_skips_with_the_reason_here_and_fails_in_ci(
        module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules: importing it raises ImportError; its modules too, in case a test imported them already
    for name in ["detectron2", *(n for n in sys.modules if n.startswith("detectron2."))]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setenv("CI", "true")
    # BaseException: pytest's skip and fail outcomes both are; a skip where a failure is due must not skip this test
    with pytest.raises(BaseException, match=r"CI requires detectron2.*not installed.*make setup") as failed:
        require_detectron2(module)
    assert failed.type is pytest.fail.Exception
    monkeypatch.delenv("CI")
    with pytest.raises(BaseException, match=r"^detectron2 is not installed.*make setup") as skipped:
        require_detectron2(module)
    assert skipped.type is pytest.skip.Exception


def test_an_installed_module_is_returned() -> None:
    assert require_detectron2("json") is sys.modules["json"]


def _run_hidden(ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci is not None else {})
    # --continue-on-collection-errors: every file is reported, not only the first that fails to collect
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "tests.fixtures.hide_detectron2", "-q", "-rfEs", "--continue-on-collection-errors",
                           *MODULE_LEVEL, *TEST_LEVEL], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_in_ci_the_detectron2_tests_fail_without_detectron2() -> None:
    done = _run_hidden("true")
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    reported = set(re.findall(r"^(?:FAILED|ERROR) (\S+) - Failed: CI requires detectron2", output, re.MULTILINE))
    assert reported == {*MODULE_LEVEL, *TEST_LEVEL}, output
    assert " skipped" not in output, output


@pytest.mark.parametrize("ci", [None, "false"])
def test_elsewhere_they_skip_and_say_why(ci: str | None) -> None:
    done = _run_hidden(ci)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    assert re.search(rf"^{len(MODULE_LEVEL) + len(TEST_LEVEL)} skipped in ", output, re.MULTILINE), output
    assert "detectron2 is not installed (ModuleNotFoundError" in output and "make setup" in output, output


def test_no_test_skips_on_detectron2_by_itself() -> None:
    """importorskip would pass CI with the tests skipped: every detectron2 test goes through require_detectron2."""
    offenders = [str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("*.py")
                 if re.search(r"importorskip\(\s*[\"']detectron2", path.read_text())]
    assert offenders == []
    for name in MODULE_LEVEL + sorted({test.split("::")[0] for test in TEST_LEVEL}):
        assert "require_detectron2(" in (REPO / name).read_text(), name
