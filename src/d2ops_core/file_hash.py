"""A file's SHA-256, read a block at a time: checkpoints, images and dataset files are never held whole.

The one loop the tooling (checkpoint checks), the core (dataset diffs) and the images (dataset
versions, initial weights) share.
"""

from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20


def file_sha256_and_size(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Hex SHA-256 of the file's bytes, and how many bytes were read."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(BLOCK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the file's bytes."""
    return file_sha256_and_size(path)[0]
