"""Checkpoint files: atomic replacement, the pointer, pruning, and clear errors for damaged ones."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from model_code.training import checkpoints as ck


def state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "optimizer": {}, "scheduler": {}, "rng": ck.rng_state()}


def test_save_points_at_the_newest_and_keeps_two(tmp_path: Path) -> None:
    for it in (10, 20, 30):
        ck.save_checkpoint(tmp_path, it, state(it))
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "model_0000030.pth"
    assert sorted(p.name for p in tmp_path.glob("model_*.pth")) == ["model_0000020.pth", "model_0000030.pth"]
    loaded = ck.load_checkpoint(tmp_path / "model_0000030.pth")
    assert loaded["iteration"] == 30 and torch.equal(loaded["model"]["w"], torch.full((3,), 30.0))
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_no_pointer_means_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "model_0000005.pth").write_bytes(b"a checkpoint whose pointer was never written")
    assert ck.latest_checkpoint(tmp_path) is None


def test_interrupted_write_leaves_the_previous_checkpoint_current(tmp_path: Path, monkeypatch) -> None:
    ck.save_checkpoint(tmp_path, 10, state(1.0))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        ck.save_checkpoint(tmp_path, 20, state(2.0))
    monkeypatch.undo()
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "model_0000010.pth"
    assert not (tmp_path / "model_0000020.pth").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_corrupt_checkpoint_is_named_with_what_to_do(tmp_path: Path) -> None:
    path = ck.save_checkpoint(tmp_path, 10, state(1.0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ck.CheckpointError, match=r"model_0000010.pth: corrupt or unreadable checkpoint.*delete it"):
        ck.load_checkpoint(ck.latest_checkpoint(tmp_path))


def test_pointer_to_a_missing_or_foreign_file(tmp_path: Path) -> None:
    (tmp_path / ck.POINTER).write_text("model_0000099.pth")
    with pytest.raises(ck.CheckpointError, match=r"model_0000099.pth but .* is missing"):
        ck.latest_checkpoint(tmp_path)
    (tmp_path / ck.POINTER).write_text("../../etc/passwd")
    with pytest.raises(ck.CheckpointError, match="not a checkpoint file"):
        ck.latest_checkpoint(tmp_path)
    torch.save({"weights": 1}, tmp_path / "model_0000001.pth")
    with pytest.raises(ck.CheckpointError, match="not a d2ops checkpoint"):
        ck.load_checkpoint(tmp_path / "model_0000001.pth")


def test_rng_state_round_trip() -> None:
    saved = ck.rng_state()
    a = (torch.rand(2), random.random())
    ck.restore_rng(saved)
    b = (torch.rand(2), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
