"""The CoreLayer ships the core package (src/d2ops_core) and nothing else of d2ops."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from d2ops.layer_build import LayerBuildError, build, core_files
from d2ops.template import REPO_ROOT

SRC = REPO_ROOT / "src"


def test_the_core_is_one_package_beside_the_tooling() -> None:
    files = core_files(SRC)
    assert {Path("d2ops_core/run_ids.py"), Path("d2ops_core/validation/manifest.py")} <= set(files)
    assert {f.parts[0] for f in files} == {"d2ops_core"}


def test_build_copies_only_the_core(tmp_path: Path) -> None:
    out = tmp_path / "python"
    files = build(SRC, out, install=False)
    shipped = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert shipped == files == core_files(SRC)
    assert not (out / "d2ops").exists()


def test_a_tree_without_the_core_is_named(tmp_path: Path) -> None:
    with pytest.raises(LayerBuildError, match=r"d2ops_core/__init__\.py: missing"):
        core_files(tmp_path)


def test_the_layer_installs_the_lock_with_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation caught: the layer installing src/requirements.txt (ranges) or dropping --require-hashes."""
    ran: list[list[str]] = []
    monkeypatch.setattr("d2ops.layer_build.subprocess.run", lambda cmd, check: ran.append(cmd))
    build(SRC, tmp_path / "python")
    (cmd,) = ran
    assert "--require-hashes" in cmd
    assert cmd[cmd.index("-r") + 1] == str(SRC / "requirements.lock")


def test_a_tree_without_the_lock_is_named(tmp_path: Path) -> None:
    """Mutation caught: a missing lock silently building a layer without its dependencies."""
    shutil.copytree(SRC / "d2ops_core", tmp_path / "d2ops_core")
    with pytest.raises(LayerBuildError, match=r"requirements\.lock: missing"):
        build(tmp_path, tmp_path / "out")
