"""Files of a local dataset that are not regular files: each is rejected by name, none hangs the validator.

Opening a FIFO blocks until a writer comes, so before the fix a dataset whose manifest.json (or
train.json, or an image) was a named pipe hung ``d2ops validate`` forever.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from d2ops import synth
from d2ops_core.validation import Code, validate_local


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-files") / "ds"
    synth.generate(root, images=12, seed=3, size=32)
    return root


def _fifo_instead_of(rel: str) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        (root / rel).unlink()
        os.mkfifo(root / rel)
        return rel
    return make


def _first_image(root: Path) -> str:
    return "images/train/" + sorted(p.name for p in (root / "images" / "train").iterdir())[0]


def _fifo_instead_of_first_image(root: Path) -> str:
    rel = _first_image(root)
    _fifo_instead_of(rel)(root)
    return rel


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [_fifo_instead_of("manifest.json"), _fifo_instead_of("annotations/train.json"),
                                  _fifo_instead_of_first_image], ids=["manifest", "train", "image"])
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_rejected_by_name_not_waited_on(base: Path, tmp_path: Path,
                                                        make: Callable[[Path], str]) -> None:
    root = tmp_path / "ds"
    shutil.copytree(base, root)
    rel = make(root)
    report = validate_local(root)
    assert not report.valid
    named = [i for i in report.errors if rel in (i.file or "") + i.message]
    assert named, report.describe()
    assert named[0].code in {Code.FILE_UNREADABLE, Code.IMAGE_UNREADABLE}
    assert "named pipe" in named[0].message or "empty" in named[0].message
