"""Periodic checkpoints in the checkpoint directory, written atomically, and resume from the newest.

Layout (the same pointer convention as detectron2's checkpointer)::

    model_0000300.pth     torch.save'd dict: model, optimizer, scheduler, iteration, rng
    last_checkpoint       text: the file name of the newest complete checkpoint

A checkpoint is written to a temporary name, fsync'ed and renamed; only then is the
pointer replaced (same way). An interruption at any moment leaves either the previous
pointer or the new one, each naming a complete file.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import torch

POINTER = "last_checkpoint"
KEEP = 2
_NAME = re.compile(r"^model_(\d{7})\.pth$")
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "iteration", "rng")


class CheckpointError(Exception):
    """A checkpoint exists but cannot be used; the message names the file and what to do."""


def _write_atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def save_checkpoint(directory: Path, iteration: int, state: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"model_{iteration:07d}.pth"
    _write_atomic(path, lambda h: torch.save({**state, "iteration": iteration}, h))
    _write_atomic(directory / POINTER, lambda h: h.write(path.name.encode()))
    for old in sorted(p for p in directory.iterdir() if _NAME.match(p.name))[:-KEEP]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = directory / POINTER
    if not pointer.is_file():
        return None
    try:  # a pointer of binary junk or megabytes is a foreign file, not a reason for a traceback
        name = pointer.read_bytes()[:200].decode("utf-8", "replace").strip()
    except OSError as exc:
        raise CheckpointError(f"{pointer}: unreadable ({exc.strerror or exc}); delete it to start over") from None
    if not _NAME.match(name):
        raise CheckpointError(f"{pointer}: names {name[:40]!r}, not a checkpoint file; delete {pointer} to start over")
    path = directory / name
    if not path.is_file():
        raise CheckpointError(f"{pointer} names {name} but {path} is missing; restore it or delete {pointer}")
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        # weights_only: a checkpoint from S3 must not be able to run code when loaded.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError... for damaged files
        raise CheckpointError(f"{path}: corrupt or unreadable checkpoint ({type(exc).__name__}: {exc}); "
                              f"delete it and {path.parent / POINTER} to start over") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a d2ops checkpoint (missing {missing}); "
                              f"delete it and {path.parent / POINTER} to start over")
    # The right keys with the wrong contents would fail later as a TypeError in int() or set_rng_state.
    iteration, rng = state["iteration"], state["rng"]
    if (not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0
            or not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor)
            or not isinstance(rng.get("python"), tuple)):
        raise CheckpointError(f"{path}: not a d2ops checkpoint (iteration {str(iteration)[:40]!r}, rng of the wrong "
                              f"form); delete it and {path.parent / POINTER} to start over")
    return state
