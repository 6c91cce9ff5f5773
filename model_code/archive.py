"""``model.tar.gz`` as SageMaker packs it, and the one safe way to unpack one.

Standard library only: the local SageMaker (``d2ops.local.jobs``) packs job results with
:func:`pack_directory` without importing torch; ``model_code.artifact`` re-exports these names
and builds opening an artifact (``open_artifact``) on :func:`safe_extract`.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


class ArtifactError(Exception):
    """The artifact is missing a file, has unreadable metadata, or is not a model.tar.gz."""


# Caps on what extracting a model.tar.gz may write: a real artifact is a TorchScript file, two
# JSON files and a small report (a ResNet-50 Mask R-CNN is about 180 MB). A crafted or corrupted
# archive must not fill the evaluation job's or the endpoint's disk, or exhaust its inodes.
MAX_EXTRACTED_BYTES = 4 * 1024**3
MAX_ARCHIVE_MEMBERS = 10_000


def safe_extract(archive: Path | str, target: Path | str, *, max_bytes: int = MAX_EXTRACTED_BYTES,
                 max_members: int = MAX_ARCHIVE_MEMBERS) -> None:
    """Extract a tar archive with the "data" filter (no absolute paths, '..', links out, devices)
    after checking its declared sizes and member count; raises ArtifactError naming the limit."""
    try:
        with tarfile.open(archive) as tar:
            total = 0
            for count, member in enumerate(tar, 1):  # lazily: a header bomb stops at the limit
                if count > max_members:
                    raise ArtifactError(f"{archive}: more than {max_members} files; not a model artifact")
                total += max(member.size, 0)
                if total > max_bytes:
                    raise ArtifactError(f"{archive}: expands to more than {max_bytes} bytes (at {member.name!r}); "
                                        "not a model artifact")
            tar.extractall(target, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArtifactError(f"{archive}: unsafe or corrupt archive: {exc}") from exc


def pack_directory(directory: Path | str, tar_path: Path | str) -> Path:
    """Pack a directory as SageMaker packs /opt/ml/model: a gzipped tar with the files at its root.

    Written beside the destination and renamed, so a reader never sees half an archive.
    """
    src, dst = Path(directory), Path(tar_path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name)
    os.replace(tmp, dst)
    return dst


def extract_archive(source: Path, extract_to: Path) -> Path:
    """``source`` (a model.tar.gz) safely extracted into ``extract_to``; ArtifactError says why not."""
    extract_to.mkdir(parents=True, exist_ok=True)
    try:
        if not tarfile.is_tarfile(source):
            raise ArtifactError("not a directory or a tar archive")
        safe_extract(source, extract_to)
    except (ArtifactError, OSError) as exc:
        raise ArtifactError(f"{source}: not a readable model.tar.gz: {exc}") from exc
    return extract_to
