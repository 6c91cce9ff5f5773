"""The CoreLayer ships the core modules (pyproject's "core" import-linter contract) and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from d2ops.layer_build import LayerBuildError, build, core_files, core_modules
from d2ops.template import REPO_ROOT

SRC = REPO_ROOT / "src"
PYPROJECT = REPO_ROOT / "pyproject.toml"


def test_the_core_list_is_the_import_linter_contract() -> None:
    modules = core_modules(PYPROJECT)
    assert {"d2ops.runs", "d2ops.champion", "d2ops.metrics", "d2ops.validation"} <= set(modules)
    assert not {m for m in modules if m.split(".")[1] in {"asl", "offline", "commands", "bench", "cli"}}


def test_build_copies_only_the_core(tmp_path: Path) -> None:
    out = tmp_path / "python"
    files = build(SRC, PYPROJECT, out, requirements=tmp_path / "none.txt")
    shipped = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert shipped == files == core_files(SRC, core_modules(PYPROJECT))
    assert Path("d2ops/__init__.py") in shipped and Path("d2ops/validation/manifest.py") in shipped
    assert not (out / "d2ops" / "template.py").exists() and not (out / "d2ops" / "offline").exists()


def test_unknown_core_module_is_named(tmp_path: Path) -> None:
    with pytest.raises(LayerBuildError, match=r"d2ops\.nosuch"):
        core_files(SRC, ["d2ops.nosuch"])


def test_pyproject_without_the_contract_is_an_error(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.importlinter]\nroot_packages = ['d2ops']\n")
    with pytest.raises(LayerBuildError, match="id = 'core'"):
        core_modules(pyproject)
