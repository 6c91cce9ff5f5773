"""A missing detectron2 skips its tests on a developer's machine and fails them in CI (tests/fixtures/frameworks.py).

The suite's detectron2 tests run in a pytest of their own with detectron2 hidden
(tests/fixtures/hide_detectron2.py), once as CI runs them (``CI=true``) and once as a developer does.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.frameworks import in_ci, require_detectron2

REPO = Path(__file__).resolve().parents[2]
DEFINITION = "tests/fixtures/frameworks.py"
THIS = "tests/unit/test_detectron2_required.py"  # calls it too, on modules it hides itself
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _require_calls(node: ast.AST) -> int:
    return sum(isinstance(n, ast.Call) and "require_detectron2" in (getattr(n.func, "id", None),
                                                                    getattr(n.func, "attr", None))
               for n in ast.walk(node))


def _is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in ast.unparse(decorator) for decorator in function.decorator_list)


def detectron2_places() -> tuple[list[str], list[str]]:
    """Every place the suite needs detectron2, found by scanning tests/ for ``require_detectron2(``: the files
    that call it at their top (skipped or failed whole), and the tests (every parametrization) of the other
    files that call it themselves, through a fixture (an argument) or through a helper (a call) of their file."""
    modules, tests = [], []
    for path in sorted((REPO / "tests").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        source = path.read_text()
        if name in (DEFINITION, THIS) or "require_detectron2(" not in source:
            continue
        tree = ast.parse(source)
        functions = {node.name: node for node in tree.body if isinstance(node, FUNCTIONS)}
        at_top = sum(_require_calls(node) for node in tree.body if not isinstance(node, (*FUNCTIONS, ast.ClassDef)))
        placed = at_top + sum(_require_calls(function) for function in functions.values())
        assert placed == _require_calls(tree), f"{name}: a require_detectron2 call in a class: teach this scan"
        if at_top:
            modules.append(name)
            continue
        needs = {f for f, function in functions.items() if _require_calls(function)}
        while more := {f for f, function in functions.items() if f not in needs and (
                {a.arg for a in function.args.args} & {n for n in needs if _is_fixture(functions[n])}
                or {c.func.id for c in ast.walk(function) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                & needs)}:
            needs |= more
        here = [f"{name}::{f}" for f in functions if f in needs and f.startswith("test_")]
        assert here, f"{name} calls require_detectron2, but in none of its tests: through a conftest fixture?"
        tests += here
    return modules, tests


MODULE_LEVEL, TEST_LEVEL = detectron2_places()


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
    reported = re.findall(r"^(?:FAILED|ERROR) (\S+) - Failed: CI requires detectron2", output, re.MULTILINE)
    assert {re.sub(r"\[.*\]$", "", r) for r in reported} == {*MODULE_LEVEL, *TEST_LEVEL}, output  # less parameters
    assert " skipped" not in output, output


@pytest.mark.parametrize("ci", [None, "false"])
def test_elsewhere_they_skip_and_say_why(ci: str | None) -> None:
    done = _run_hidden(ci)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    # Every place skipped (a parametrized test once per parameter set), nothing passed, failed or errored
    skipped = re.search(r"^(\d+) skipped in ", output, re.MULTILINE)
    assert skipped and int(skipped[1]) >= len(MODULE_LEVEL) + len(TEST_LEVEL), output
    assert "detectron2 is not installed (ModuleNotFoundError" in output and "make setup" in output, output


def test_no_test_skips_on_detectron2_by_itself() -> None:
    """importorskip would pass CI with the tests skipped: every detectron2 test goes through require_detectron2."""
    offenders = [str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("*.py")
                 if re.search(r"importorskip\(\s*[\"']detectron2", path.read_text())]
    assert offenders == []


def test_the_scan_finds_the_places_at_a_files_top_in_a_test_and_through_a_fixture() -> None:
    assert "tests/unit/test_detectron2_export.py" in MODULE_LEVEL
    assert "tests/unit/test_trainer_choice.py::test_detectron2_imports_in_this_environment_when_installed" in TEST_LEVEL
    assert ("tests/unit/test_training_weights_digest.py::"  # through its d2_hooks fixture
            "test_detectron2_digest_hashes_the_parameters_not_the_batch_norm_statistics") in TEST_LEVEL
    assert not any(test.startswith(tuple(f"{m}::" for m in MODULE_LEVEL)) for test in TEST_LEVEL)
