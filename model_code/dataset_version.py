"""A dataset version on disk (a SageMaker channel or a processing input): its manifest and split files.

Shared by training and evaluation. The manifest schema is d2ops_core.validation.manifest's; this
module only resolves paths and reads a split's COCO categories into the label order every
trainer and the artifact use (sorted dataset category ids -> labels 0..K-1).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from d2ops_core.file_hash import file_sha256
from d2ops_core.validation.manifest import MANIFEST_FILE, parse_manifest, unsafe_relative_path
from d2ops_core.validation.split import DerivedSplit, SplitError, derive_split


class DatasetError(Exception):
    """The dataset version is missing, has no manifest, or a split file cannot be read."""


@dataclass(frozen=True)
class DatasetVersion:
    root: Path
    name: str
    version: str
    task: Literal["detection", "instance_segmentation"]
    train_json: Path
    val_json: Path
    images_dir: Path
    derived: DerivedSplit | None = None  # set when val was derived from train (d2ops_core.validation.split)
    # file_name -> SHA-256 of the image's bytes, where deriving the split hashed them (the export reuses them)
    image_sha256: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    def split(self, split: Literal["train", "val"]) -> Path:
        return self.train_json if split == "train" else self.val_json


@dataclass(frozen=True)
class Categories:
    """Label index i <-> dataset category id ``ids[i]`` and name ``names[i]``."""

    ids: list[int]
    names: list[str]

    def label_of(self) -> dict[int, int]:
        return {cid: i for i, cid in enumerate(self.ids)}


def open_dataset_version(root: Path | str) -> DatasetVersion:
    base = Path(root)
    if not base.is_dir():
        raise DatasetError(f"{base}: no such dataset directory")
    manifest_path = base / MANIFEST_FILE
    if not manifest_path.is_file():
        raise DatasetError(f"{manifest_path}: missing; a dataset version needs a manifest.json")
    manifest, problems = parse_manifest(manifest_path.read_bytes())
    if manifest is None:
        details = "; ".join(message for _, message, _ in problems)
        raise DatasetError(f"{manifest_path}: invalid manifest: {details}")
    version = DatasetVersion(root=base, name=manifest.name, version=manifest.version, task=manifest.task,
                             train_json=base / manifest.train, val_json=base / manifest.val,
                             images_dir=base / manifest.images_prefix)
    if not manifest.val_named and not version.val_json.is_file() and version.train_json.is_file():
        version = _with_derived_val(version, manifest.train)
    for path in (version.train_json, version.val_json):
        if not path.is_file():
            raise DatasetError(f"{path}: missing (named by {manifest_path})")
    return version


def _with_derived_val(version: DatasetVersion, train_rel: str) -> DatasetVersion:
    """The split the validator recorded, in a scratch directory.

    The split is keyed on the dataset name and each image's SHA-256 (d2ops_core.validation.split);
    the images here are the run's snapshot of the bytes the validator hashed, so hashing them again
    gives its split (2,000 images of 100 KB: about 0.25 s). Channels may be read-only, so the two
    documents go to a temporary directory; images stay where they are (file_name values are
    relative to images_dir, which does not move).
    """
    document = read_coco(version.train_json)
    names = [str(im.get("file_name", "")) for im in document["images"] if isinstance(im, dict)]
    hashes = image_sha256(version.images_dir, names)
    try:
        train, val, record = derive_split(document, version.name, train_rel, hashes)
    except SplitError as exc:
        raise DatasetError(f"{version.root}: no val split and none can be derived: {exc}") from None
    out = Path(tempfile.mkdtemp(prefix="d2ops-split-"))
    # Read for the life of this process (a training or evaluation job); not left behind in /tmp, where the
    # offline runtime's jobs run on the user's own machine run after run.
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    (out / "train.json").write_text(json.dumps(train))
    (out / "val.json").write_text(json.dumps(val))
    return DatasetVersion(root=version.root, name=version.name, version=version.version, task=version.task,
                          train_json=out / "train.json", val_json=out / "val.json", images_dir=version.images_dir,
                          derived=record, image_sha256=hashes)


def annotated_image_sha256(coco_json: Path, images_dir: Path, *, known: Mapping[str, str] | None = None) -> set[str]:
    """The SHA-256 of every image file a COCO file names (for the train split: a model's training_images.txt)."""
    document = read_coco(coco_json)
    names = [str(im.get("file_name", "")) for im in document["images"] if isinstance(im, dict)]
    return set(image_sha256(images_dir, names, known=known).values())


def image_sha256(images_dir: Path, file_names: Iterable[str], *,
                 known: Mapping[str, str] | None = None) -> dict[str, str]:
    """file_name -> hex SHA-256 of the image file's bytes (``known`` ones are not read again).

    A few threads: hashlib releases the GIL on large buffers, so reads and hashing overlap. A
    missing or unreadable file, or a name that is not a safe relative path, is a DatasetError naming it.
    """
    known = known or {}
    names = set(file_names)
    for name in names:
        problem = unsafe_relative_path(name)
        if problem:
            raise DatasetError(f"{images_dir}: image file_name {name!r} {problem}")
    todo = sorted(n for n in names if n not in known)

    def one(name: str) -> tuple[str, str]:
        try:
            return name, file_sha256(images_dir / name)
        except OSError as exc:
            raise DatasetError(f"{images_dir / name}: cannot read the image to hash it: "
                               f"{exc.strerror or exc}") from None

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        hashed = dict(pool.map(one, todo))
    return {**{n: known[n] for n in names if n in known}, **hashed}


def read_coco(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not readable COCO JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("images"), list) \
            or not isinstance(document.get("categories"), list):
        raise DatasetError(f"{path}: not a COCO instances file (needs 'images' and 'categories' lists)")
    document.setdefault("annotations", [])
    return document


def categories_of(document: dict[str, Any]) -> Categories:
    cats = sorted(document["categories"], key=lambda c: int(c["id"]))
    return Categories(ids=[int(c["id"]) for c in cats], names=[str(c["name"]) for c in cats])
