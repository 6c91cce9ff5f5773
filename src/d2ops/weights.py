"""Pretrained weights for a stack: check that a file is a detectron2 checkpoint, then put it at the
stack's ``PretrainedWeightsKey`` in its data bucket (``d2ops weights upload``).

detectron2 picks the loader by the file name (``DetectionCheckpointer._load_file``): ``.pkl`` is a
plain pickle (the model zoo's ``{"model": {name: ndarray}, "__author__": ...}``), anything else goes
to ``torch.load``. The training job sees the object under the key's own name, so a file is accepted
only where its format matches the key's suffix. A ``.pkl`` is read with an unpickler that admits
numpy arrays and plain containers only: a pickle that would run code is refused, never executed.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d2ops_core import pretrained
from d2ops_core.file_hash import file_sha256

SUFFIXES = {".pkl": "pickle", ".pth": "torch"}
# What a model-zoo pickle of numpy arrays refers to (numpy 1 and 2 module names).
_PICKLE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}
PROGRESS_FROM_BYTES = 8 * 2**20  # smaller files upload before a progress line would be read


class CheckpointError(Exception):
    """The file is not a detectron2/torch checkpoint the stack's key can carry; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    format: str  # "pickle" or "torch"
    tensors: int
    bytes: int
    sha256: str


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS:
            raise CheckpointError(f"it pickles {module}.{name}, which a model-zoo checkpoint (numpy arrays) never "
                                  "does; refusing to unpickle it")
        return super().find_class(module, name)


def _file_format(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04"):
        return "torch"  # torch.save's zip container
    if head[:1] == b"\x80":
        return "pickle"
    raise CheckpointError(f"{path}: neither a pickle (.pkl, detectron2's model zoo) nor a torch.save file (.pth); "
                          "is it a detectron2 checkpoint?")


def _weights(document: Any) -> dict[str, Any]:
    # detectron2 checkpoints hold {"model": state dict, ...}; a bare state dict is accepted by its loader too
    state = document.get("model", document) if isinstance(document, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError("no state dict in it (expected {'model': {name: tensor}} or {name: tensor})")
    return state


def _count_tensors(state: dict[str, Any]) -> int:
    import numpy as np

    count = 0
    for name, value in state.items():
        if not isinstance(name, str):
            raise CheckpointError(f"its state dict has a non-string key {name!r}")
        if isinstance(value, np.ndarray) or type(value).__name__ == "Tensor":
            count += 1
    if count == 0:
        raise CheckpointError("its state dict holds no tensors")
    return count


def inspect_checkpoint(path: Path, key: str) -> Checkpoint:
    """``path`` read as the trainer will read it from a channel file named like ``key``."""
    suffix = Path(key).suffix
    if suffix not in SUFFIXES:
        raise CheckpointError(f"PretrainedWeightsKey {key!r} ends {suffix or 'without a suffix'}; the trainer takes "
                              f"one {' or '.join(SUFFIXES)} file from the channel: redeploy with a key ending in one")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    found = _file_format(path)
    if found != SUFFIXES[suffix]:
        ours = next(s for s, f in SUFFIXES.items() if f == found)
        raise CheckpointError(f"{path} is a {found} ({ours}) checkpoint but PretrainedWeightsKey {key!r} ends "
                              f"{suffix}, and detectron2 picks its loader by that name: redeploy with a key ending "
                              f"{ours}")
    try:
        if found == "pickle":
            with path.open("rb") as f:
                document = _ArraysOnly(f, encoding="latin1").load()
        else:
            import torch

            document = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        tensors = _count_tensors(_weights(document))
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: not a detectron2 checkpoint: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, RuntimeError, zipfile.BadZipFile, io.UnsupportedOperation,
            AttributeError, ImportError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a readable {found} checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return Checkpoint(path=path, format=found, tensors=tensors, bytes=path.stat().st_size, sha256=file_sha256(path))


class Progress:
    """boto3's transfer callback: one line at each further 10 % of a large file."""

    def __init__(self, total: int, out: Callable[[str], None]) -> None:
        self.total, self.out, self.sent, self.shown = total, out, 0, 0

    def __call__(self, sent: int) -> None:
        self.sent += sent
        tenth = min(10, self.sent * 10 // max(self.total, 1))
        if self.total >= PROGRESS_FROM_BYTES and tenth > self.shown:
            self.shown = tenth
            self.out(f"  {tenth * 10:3d} %  {self.sent / 2**20:,.1f} of {self.total / 2**20:,.1f} MiB")


def upload(s3: Any, checkpoint: Checkpoint, bucket: str, key: str, out: Callable[[str], None] = print) -> None:
    """Put the checked file at ``s3://bucket/key`` (multipart for large files), its sha256 as object metadata."""
    from boto3.s3.transfer import TransferConfig

    out(f"uploading {checkpoint.path} ({checkpoint.bytes / 2**20:,.1f} MiB, {checkpoint.format} checkpoint with "
        f"{checkpoint.tensors} tensors) to s3://{bucket}/{key}")
    s3.upload_file(str(checkpoint.path), bucket, key, ExtraArgs={"Metadata": {"sha256": checkpoint.sha256}},
                   Callback=Progress(checkpoint.bytes, out), Config=TransferConfig(multipart_chunksize=64 * 2**20))
    out(f"uploaded s3://{bucket}/{key} (sha256 {checkpoint.sha256}); every run of the stack now fine-tunes from it")


def help_text() -> str:
    """The model-zoo checkpoints of the default configs, for ``--help``."""
    default_url = pretrained.MODEL_ZOO_CHECKPOINTS[pretrained.DEFAULT_CONFIGS["detection"]]
    lines = [f"The stack's default PretrainedWeightsKey is {pretrained.DEFAULT_KEY}: the COCO checkpoint of "
             f"{pretrained.DEFAULT_CONFIGS['detection']}, from detectron2's MODEL_ZOO.md:",
             f"  {default_url}",
             f"Download it, then: d2ops weights upload {default_url.rsplit('/', 1)[1]} --stack NAME"]
    for config, url in pretrained.MODEL_ZOO_CHECKPOINTS.items():
        if config != pretrained.DEFAULT_CONFIGS["detection"]:
            lines.append(f"For {config} (key {pretrained.weights_key(config)}): {url}")
    lines.append(f"PretrainedWeightsKey={pretrained.SCRATCH} trains from scratch instead (docs/training.md).")
    return "\n".join(lines)
