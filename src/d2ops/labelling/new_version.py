"""Labelled images into a NEW dataset version: the base version plus the new images, validated, never half-written.

The base is a dataset version (a directory, or an S3 prefix copied down first: the champion's dataset
version, or any other). The new version is the base's files, its manifest with the new ``version``, and the
new images under ``<images>/labelled/<sha256>.<ext>`` with their boxes added to the annotations:

- **Every base image keeps its split.** Base files are copied byte for byte, so an image in train stays in
  train and a val image stays in val (and a derived split, keyed on content, draws the same sides again).
- **New images take the pipeline's own split rule** (d2ops_core.validation.split, docs/dataset-format.md
  "Derived val split"): with a base that derives val from train, they are appended to train and the
  pipeline derives their side; with an uploaded val file, each goes to the side ``draws_val`` gives it, the
  side it would get in a derived split, so it keeps that side in every later version too.
- An image whose bytes the base already has is not added again (reported).

The version is written to a temporary directory beside ``out``, validated with the rules any upload is
validated with (``validate_local``: every image decoded), and renamed to ``out`` only when valid: an
interrupted or rejected import leaves no directory that looks like a version. :func:`upload_version` puts
it under ``datasets/<name>/<version>/`` with ``manifest.json`` last, whose arrival starts the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d2ops.labelling.labelstudio import LabelledImage, LabellingError
from d2ops_core import s3_layout
from d2ops_core.champion import read_champion
from d2ops_core.file_hash import file_sha256
from d2ops_core.validation import ValidationReport, validate_local
from d2ops_core.validation.manifest import MANIFEST_FILE, parse_manifest
from d2ops_core.validation.split import draws_val

LABELLED_DIR = "labelled"  # under the version's images/: where imported images go
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class BaseVersion:
    root: Path
    raw_manifest: dict[str, Any]
    name: str
    version: str
    train: str
    val: str
    images: str  # images prefix, "images/"
    val_file: bool  # True: an uploaded val file; False: val derived from train
    classes: dict[str, int]  # category name -> id (train's)


def open_base(root: Path) -> BaseVersion:
    """The base version in ``root``; a LabellingError names what is missing or unreadable."""
    path = root / MANIFEST_FILE
    if not path.is_file():
        raise LabellingError(f"{path}: missing; --dataset must be a dataset version (manifest.json, annotations/, "
                             "images/)")
    raw = path.read_bytes()
    manifest, problems = parse_manifest(raw)
    if manifest is None:
        raise LabellingError(f"{path}: invalid manifest: {'; '.join(m for _, m, _ in problems)}")
    train = _read_coco(root / manifest.train)
    val_file = manifest.val_named or (root / manifest.val).is_file()
    categories = train.get("categories") or []
    if not isinstance(categories, list):
        raise LabellingError(f"{root / manifest.train}: 'categories' is not a list")
    classes = {}
    for i, cat in enumerate(categories):
        if not (isinstance(cat, dict) and isinstance(cat.get("name"), str) and type(cat.get("id")) is int):
            raise LabellingError(f"{root / manifest.train}: categories[{i}] is not a COCO category (an integer 'id' "
                                 "and a string 'name')")
        classes[cat["name"]] = cat["id"]
    if not classes:
        raise LabellingError(f"{root / manifest.train}: no categories: the base version names no classes")
    return BaseVersion(root=root, raw_manifest=json.loads(raw), name=manifest.name, version=manifest.version,
                       train=manifest.train, val=manifest.val, images=manifest.images_prefix, val_file=val_file,
                       classes=classes)


def _read_coco(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep for json.loads
        raise LabellingError(f"{path}: not readable COCO JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise LabellingError(f"{path}: not a COCO instances file (no 'images' list)")
    document.setdefault("annotations", [])
    return document


def next_version(version: str) -> str:
    """v1 -> v2, 2024-07 -> 2024-08, data -> data-2: the default name of the new version."""
    head = version.rstrip("0123456789")
    digits = version[len(head):]
    return f"{head}{int(digits) + 1:0{len(digits)}d}" if digits else f"{version}-2"


@dataclass
class NewVersion:
    path: Path
    name: str
    version: str
    added_train: int = 0
    added_val: int = 0
    added_boxes: int = 0
    already_in_base: list[str] = field(default_factory=list)  # "task N: <file_name>"
    report: ValidationReport | None = None


def write_version(base: BaseVersion, labelled: Sequence[LabelledImage], out: Path, *, version: str,
                  progress: Progress = _quiet) -> NewVersion:
    """Write base + ``labelled`` as dataset version ``version`` to ``out`` (which must not exist); validated."""
    if out.exists():
        raise LabellingError(f"{out} already exists: a dataset version is never overwritten; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        result = _write(base, labelled, tmp, version, progress)
        progress(f"validating {base.name}/{version} with the pipeline's rules (every image decoded)")
        report = validate_local(tmp)
        report.source = str(out)
        result.report = report
        if not report.valid:
            first = report.errors[0] if report.errors else None
            detail = f"; first: {first.code} {first.location}: {first.message}" if first else ""
            raise InvalidVersion(report, f"the new version {base.name}/{version} is invalid ({report.error_count} "
                                         f"errors{detail}); nothing written to {out}")
        os.rename(tmp, out)
        result.path = out
        return result
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class InvalidVersion(LabellingError):
    def __init__(self, report: ValidationReport, message: str) -> None:
        super().__init__(message)
        self.report = report


def _write(base: BaseVersion, labelled: Sequence[LabelledImage], tmp: Path, version: str,
           progress: Progress) -> NewVersion:
    progress(f"copying the base version {base.name}/{base.version} from {base.root}")
    shutil.copytree(base.root, tmp, symlinks=False,
                    ignore=lambda d, names: [MANIFEST_FILE] if Path(d) == base.root else [])
    train = _read_coco(tmp / base.train)
    val = _read_coco(tmp / base.val) if base.val_file else None
    docs = [d for d in (train, val) if d is not None]
    images_dir = tmp / base.images
    have: dict[str, str] = {}  # sha256 -> file_name of every image the version holds
    names = {str(im.get("file_name", "")) for doc in docs for im in doc["images"]}
    for name in sorted(names):
        if (images_dir / name).is_file():
            have.setdefault(file_sha256(images_dir / name), name)
    next_image = 1 + max((int(im["id"]) for d in docs for im in d["images"] if isinstance(im.get("id"), int)),
                         default=0)
    next_ann = 1 + max((int(a["id"]) for d in docs for a in d["annotations"] if isinstance(a.get("id"), int)),
                       default=0)
    result = NewVersion(path=tmp, name=base.name, version=version)
    (images_dir / LABELLED_DIR).mkdir(parents=True, exist_ok=True)
    for item in sorted(labelled, key=lambda x: x.sha256):
        if item.sha256 in have:
            result.already_in_base.append(f"task {item.task_id}: {have[item.sha256]}")
            continue
        file_name = f"{LABELLED_DIR}/{item.sha256}.{item.extension}"
        (images_dir / file_name).write_bytes(item.data)
        have[item.sha256] = file_name
        to_val = val is not None and draws_val(base.name, item.sha256)
        doc = val if to_val and val is not None else train
        doc["images"].append({"id": next_image, "file_name": file_name, "width": item.width, "height": item.height})
        for box in item.boxes:
            x, y, w, h = box.bbox
            doc["annotations"].append({"id": next_ann, "image_id": next_image,
                                       "category_id": base.classes[box.class_name], "bbox": [x, y, w, h],
                                       "area": round(w * h, 2), "iscrowd": 0})
            next_ann += 1
            result.added_boxes += 1
        next_image += 1
        if to_val:
            result.added_val += 1
        else:
            result.added_train += 1
    (tmp / base.train).write_text(json.dumps(train))
    if val is not None:
        (tmp / base.val).write_text(json.dumps(val))
    (tmp / MANIFEST_FILE).write_text(json.dumps({**base.raw_manifest, "version": version}, indent=1))
    return result


# --- S3: the base in, the new version out ------------------------------------------------------------------------


def split_s3_uri(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket:
        raise LabellingError(f"{uri!r} has no bucket: use s3://BUCKET/PREFIX/")
    return bucket, prefix


def download_base(s3: Any, uri: str, into: Path, progress: Progress = _quiet) -> Path:
    """Copy the dataset version under ``uri`` (s3://bucket/datasets/<name>/<version>/) into ``into``."""
    bucket, prefix = split_s3_uri(uri)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if not rel or rel.endswith("/") or ".." in rel.split("/"):
                continue
            target = into / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))
            count += 1
    if not (into / MANIFEST_FILE).is_file():
        raise LabellingError(f"{uri}: no manifest.json there ({count} objects): not a dataset version")
    progress(f"downloaded the base version from {uri} ({count} files)")
    return into


def download_champion_snapshot(s3: Any, artifacts_bucket: str, into: Path, progress: Progress = _quiet) -> Path:
    """The serving model's training snapshot (``runs/<its run>/dataset/``), copied into ``into``: the bytes the
    champion was trained and judged on, whatever has happened to the data bucket's prefix since."""
    champion = read_champion(s3, artifacts_bucket)
    if champion is None:
        raise LabellingError(f"s3://{artifacts_bucket}: no champion yet (no model has been deployed), so no snapshot "
                             "to build on; name the base with --dataset DIR_OR_S3_URI")
    progress(f"base: the champion's training snapshot, run {champion.run_id} "
             f"({champion.dataset.name}/{champion.dataset.version})")
    return download_base(s3, s3_layout.snapshot_uri(artifacts_bucket, champion.run_id), into, progress)


def upload_version(s3: Any, version: NewVersion, destination: str, progress: Progress = _quiet) -> str:
    """Upload the version to ``s3://bucket/datasets/<name>/<version>/``, manifest.json LAST (it starts a run).

    A prefix that already has a manifest is a dataset version: never overwritten. One with objects but no
    manifest is an upload that did not finish (nothing started a run from it): this upload goes over it, removes
    what it left that this version does not have, and only then puts the manifest.
    """
    bucket, rest = split_s3_uri(destination)
    if rest.strip("/"):
        raise LabellingError(f"--upload {destination}: give the data bucket only (s3://BUCKET); the version goes "
                             f"under datasets/{version.name}/{version.version}/, where the pipeline listens")
    prefix = f"datasets/{version.name}/{version.version}/"
    left = {obj["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])}
    if prefix + MANIFEST_FILE in left:
        raise LabellingError(f"s3://{bucket}/{prefix} is already a dataset version (its manifest.json is there): a "
                             "version is never overwritten; choose another --version")
    if left:
        progress(f"s3://{bucket}/{prefix} holds {len(left)} objects but no manifest.json, left by an upload that "
                 "did not finish: uploading over them")
    files = sorted(p for p in version.path.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    keys = [prefix + path.relative_to(version.path).as_posix() for path in files]
    for path, key in zip(files, keys, strict=True):
        s3.upload_file(str(path), bucket, key)
    stale = sorted(left - set(keys))
    for start in range(0, len(stale), 1000):  # DeleteObjects takes at most 1,000 keys
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in stale[start:start + 1000]],
                                                 "Quiet": True})
    s3.upload_file(str(version.path / MANIFEST_FILE), bucket, prefix + MANIFEST_FILE)
    progress(f"uploaded {len(files) + 1} files to s3://{bucket}/{prefix} (manifest.json last)"
             + (f"; removed {len(stale)} the unfinished upload had left" if stale else ""))
    return f"s3://{bucket}/{prefix}"


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="d2ops-label-base-"))
