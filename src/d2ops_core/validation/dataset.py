"""Validation of a whole dataset version: manifest, both splits, their consistency, the image files."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from d2ops_core.images import max_pixels
from d2ops_core.validation.coco import SplitResult, Thresholds, check_split
from d2ops_core.validation.codes import Code
from d2ops_core.validation.errors import DatasetUnreadable, ObjectChanged, SourceFileError
from d2ops_core.validation.images import ImageItems, OverlapIndex, check_items, image_items, merge_image_issues
from d2ops_core.validation.inventory import ImageItem, InventoryEntry
from d2ops_core.validation.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    Manifest,
    StackLimits,
    parse_manifest,
    stack_limit_problems,
)
from d2ops_core.validation.report import (
    DatasetName,
    ImageCheck,
    Issue,
    IssueLog,
    SplitStats,
    ValidationReport,
    printable,
)
from d2ops_core.validation.sources import LocalSource, S3Source, Source
from d2ops_core.validation.split import DerivedSplit, SplitError, derive_split

logger = logging.getLogger(__name__)
_DATASET_PREFIX = re.compile(r"(?:^|/)datasets/(?P<name>[^/]+)/(?P<version>[^/]+)/?$")

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def dataset_from_prefix(prefix: str) -> tuple[str, str] | None:
    """(name, version) when ``prefix`` follows the datasets/<name>/<version>/ convention."""
    match = _DATASET_PREFIX.search(prefix)
    return (match.group("name"), match.group("version")) if match else None


def _dataset_ref(manifest: Manifest | None, raw: bytes, expected: tuple[str, str] | None) -> DatasetName:
    if manifest is not None:
        return DatasetName(name=manifest.name, version=manifest.version)
    try:  # an invalid manifest may still name the dataset, which makes the report easier to place
        doc: Any = json.loads(raw)
        name, version = doc.get("name"), doc.get("version")
        if isinstance(name, str) and isinstance(version, str):
            return DatasetName(name=printable(name)[:200], version=printable(version)[:200])
    except (ValueError, AttributeError, RecursionError):
        pass
    return DatasetName(name=expected[0], version=expected[1]) if expected else DatasetName()


def _cross_split(train: SplitResult | None, val: SplitResult | None, log: IssueLog, limits: Thresholds, *,
                 derived: bool = False) -> None:
    """Checks across the splits. ``derived``: the two sides of a derived split, where a class whose images all
    drew val is the split's doing, not the uploader's: a warning (CLASS_FEW_INSTANCES), not CATEGORY_NOT_IN_TRAIN."""
    if train is not None:
        counts = {c: train.instances[c] for c in train.categories}
        for c, name in train.categories.items():
            if counts[c] < limits.few_instances:
                why = ""
                if derived and counts[c] == 0 and val is not None and val.instances[c] > 0:
                    why = (f"; its {val.instances[c]} instances are all on images that drew val in the derived "
                           "split, so no model trains on it until one of its images draws train (or upload a val "
                           "file)")
                log.add(Code.CLASS_FEW_INSTANCES, f"category {name!r} (id {c}) has {counts[c]} train instances, "
                        f"fewer than {limits.few_instances}{why}", train.file,
                        f"categories[{train.category_index[c]}]")
        present = {c: n for c, n in counts.items() if n > 0}
        if len(present) >= 2:
            most, least = max(present, key=present.__getitem__), min(present, key=present.__getitem__)
            if present[most] > limits.imbalance_ratio * present[least]:
                log.add(Code.CLASS_IMBALANCE, f"{train.categories[most]!r} has {present[most]} train instances, "
                        f"{train.categories[least]!r} only {present[least]} (ratio "
                        f"{present[most] / present[least]:.0f} > {limits.imbalance_ratio:g})", train.file,
                        "annotations")
    if train is None or val is None:
        return
    for c, name in val.categories.items():
        where = f"categories[{val.category_index[c]}]"
        if c not in train.categories:
            log.add(Code.CATEGORY_MISMATCH, f"val category {name!r} (id {c}) is not a train category", val.file, where)
        elif train.categories[c] != name:
            log.add(Code.CATEGORY_MISMATCH, f"category id {c} is {name!r} in val but {train.categories[c]!r} in "
                    "train", val.file, where)
        if val.instances[c] > 0 and train.instances[c] == 0 and not derived:
            log.add(Code.CATEGORY_NOT_IN_TRAIN, f"category {name!r} (id {c}) has {val.instances[c]} val instances "
                    "and none in train", val.file, where)
    for c, name in train.categories.items():
        if train.instances[c] > 0 and val.instances[c] == 0:
            log.add(Code.CLASS_MISSING_IN_VAL, f"category {name!r} (id {c}) has no val instances: its AP cannot be "
                    "measured", val.file, None)
    # Train/val overlap is by content, once the images are read (images.OverlapIndex); _name_overlap without.


def _name_overlap(train: SplitResult | None, val: SplitResult | None, prefix: str, log: IssueLog) -> None:
    """SPLIT_OVERLAP for val entries naming a train entry's file, when the images are not read."""
    if train is None or val is None:
        return
    train_names = {ref.file_name for ref in train.images}
    for ref in val.images:
        if ref.file_name in train_names:
            log.add(Code.SPLIT_OVERLAP, f"{prefix}{ref.file_name} is in train too", val.file,
                    f"images[{ref.index}].file_name")


def derive_val_split(train_document: bytes, manifest: Manifest, sha256_of: Mapping[str, str], log: IssueLog,
                     limits: Thresholds | None = None) -> tuple[DerivedSplit, dict[str, SplitStats]] | None:
    """Derive val from the (already checked) train file, once its images' content hashes are known.

    ``sha256_of``: file_name -> hex SHA-256 of the image's bytes, as the image checks computed it
    (inline here, or the Distributed Map's results in the summarize step: d2ops_core.validation.merge).
    Adds the cross-split checks of the two sides to ``log`` (the train file's own issues are in it
    already: the sides are checked again only for their statistics, into a scratch log). Returns the
    record and the two sides' statistics, or None (a split that cannot be derived is
    MANIFEST_PATH_MISSING at ``val``).
    """
    limits = limits or Thresholds()
    document = json.loads(train_document)
    try:
        train, val, record = derive_split(document, manifest.name, manifest.train, sha256_of)
    except SplitError as exc:
        log.add(Code.MANIFEST_PATH_MISSING, f"no val annotations were uploaded and none can be derived: {exc}",
                MANIFEST_FILE, "val")
        return None
    del document
    scratch = IssueLog()
    sides = [check_split(json.dumps(doc).encode(), split, f"{manifest.train} (derived {split})", scratch,
                         task=manifest.task, limits=limits) for split, doc in (("train", train), ("val", val))]
    if sides[0] is None or sides[1] is None or sides[0].stats is None or sides[1].stats is None:
        return None
    _cross_split(sides[0], sides[1], log, limits, derived=True)
    return record, {"train": sides[0].stats, "val": sides[1].stats}


def _check_failed(log: IssueLog, file: str | None, what: str, exc: Exception) -> None:
    """A check raised where it never should: reject with CHECK_FAILED (one line), keep the trace in the log.

    Fail closed: a file that made a check crash must not pass unchecked, and the report is still written.
    """
    logger.exception("validation check %s of %s failed", what, file)
    log.add(Code.CHECK_FAILED, f"the {what} check stopped on an unexpected {type(exc).__name__}: "
            f"{str(exc)[:200]}; the file is rejected (please report this)", file)


@dataclass
class Validated:
    """What one validation produced: the report, the inventory of what it read, and what is left to check."""

    report: ValidationReport
    inventory: list[InventoryEntry] = field(default_factory=list)  # sorted by key
    images_pending: bool = False  # too many images to check here: ``items`` go to the Distributed Map
    items: ImageItems | list[ImageItem] = field(default_factory=list)  # the image files, in key order
    snapshot_complete: bool = False  # every file the run reads was copied into the snapshot


def validate_source(source: Source, *, check_images: bool = True, expected: tuple[str, str] | None = None,
                    limits: Thresholds | None = None, progress: Progress | None = None,
                    stack_limits: StackLimits | None = None) -> ValidationReport:
    """Validate the dataset version ``source`` holds, every image included; raises DatasetUnreadable when it
    cannot be listed. ``stack_limits``: the operator's gate and training limits; manifest settings laxer
    than these are errors (the pipeline passes them; a local check without a stack has none to enforce).
    """
    return validate_version(source, check_images=check_images, expected=expected, limits=limits, progress=progress,
                            stack_limits=stack_limits).report


def validate_version(source: Source, *, check_images: bool = True, expected: tuple[str, str] | None = None,
                     limits: Thresholds | None = None, progress: Progress | None = None,
                     stack_limits: StackLimits | None = None, inline_limit: int | None = None,
                     snapshot: bool = False) -> Validated:
    """:func:`validate_source` with its inventory, snapshot and hand-off to the Distributed Map.

    ``inline_limit``: with more present images than this (and annotations otherwise valid) the images
    are not checked here: ``images_pending`` and ``items`` say what the Map must check. ``snapshot``:
    copy what the run reads (the source's ``copy_to_snapshot``) when it is valid so far.
    """
    max_pixels()  # a bad MAX_IMAGE_PIXELS is PixelLimitError naming it, before any file is judged by it
    say = progress or _quiet
    limits = limits or Thresholds()
    started = time.perf_counter()
    log = IssueLog()
    splits: dict[str, SplitStats] = {}
    derived: DerivedSplit | None = None
    image_check = ImageCheck(mode="skipped")
    manifest: Manifest | None = None
    raw = b""
    read: list[str] = []  # the files (other than images) the validation read whole
    items: ImageItems | list[ImageItem] = []
    image_entries: list[InventoryEntry] = []  # of the images checked
    overlap = OverlapIndex()
    pending = copied = False
    derive_pending = False  # val is derived from train once the images' content hashes are known

    def report() -> ValidationReport:
        return ValidationReport.build(source=source.uri, log=log, manifest=manifest,
                                      dataset=_dataset_ref(manifest, raw, expected), splits=splits,
                                      images=image_check, seconds=time.perf_counter() - started,
                                      derived_split=derived, derived_split_pending=derive_pending)

    def done() -> Validated:
        entries = {e.key: e for e in (source.entry(rel) for rel in read)}
        entries.update((e.key, e) for e in image_entries)
        return Validated(report=report(), inventory=sorted(entries.values(), key=lambda e: e.key),
                         images_pending=pending, items=items, snapshot_complete=copied)

    say(f"listing {source.uri}")
    files = source.list_files()
    for rel, target in sorted(source.links_outside().items()):
        log.add(Code.LINK_OUTSIDE_DATASET, f"{rel} links to {target}, outside the dataset directory: not followed",
                rel)
    if MANIFEST_FILE not in files:
        log.add(Code.MANIFEST_MISSING, f"no {MANIFEST_FILE} in {source.uri} ({len(files)} other files)", MANIFEST_FILE)
        return done()
    try:
        raw = source.read_small(MANIFEST_FILE, MAX_MANIFEST_BYTES)
        read.append(MANIFEST_FILE)
    except ObjectChanged as exc:
        log.add(Code.OBJECT_CHANGED, str(exc), MANIFEST_FILE)
        return done()
    except SourceFileError as exc:
        log.add(Code.FILE_UNREADABLE, str(exc), MANIFEST_FILE)
        return done()
    try:
        manifest, problems = parse_manifest(raw)
    except Exception as exc:
        _check_failed(log, MANIFEST_FILE, "manifest", exc)
        return done()
    for code, message, path in problems:
        log.add(code, message, MANIFEST_FILE, path)
    if manifest is None:
        return done()  # without a manifest there is no telling which files are the splits
    if expected and expected != (manifest.name, manifest.version):
        log.add(Code.MANIFEST_PREFIX_MISMATCH, f"manifest says {manifest.name}/{manifest.version} but the files are "
                f"under datasets/{expected[0]}/{expected[1]}/", MANIFEST_FILE)
    if stack_limits is not None:  # the operator's limits: a manifest may only tighten them
        for code, message, path in stack_limit_problems(manifest.gate, manifest.training, stack_limits):
            log.add(code, message, MANIFEST_FILE, path)
    if manifest.train == manifest.val:
        log.add(Code.MANIFEST_VALUE_INVALID, f"train and val are the same file {manifest.train!r}", MANIFEST_FILE,
                "val")

    # No val named and none uploaded: val is derived from train (d2ops_core.validation.split); a val file
    # the manifest names but that is missing stays an error.
    derive_val = not manifest.val_named and manifest.val not in files
    results: dict[str, SplitResult] = {}
    for split, rel in (("train", manifest.train), ("val", manifest.val)):
        if split == "val" and derive_val:
            continue
        if rel not in files:
            hint = "" if split == "train" else " (omit val from the manifest to have one derived from train)"
            log.add(Code.MANIFEST_PATH_MISSING, f"the {split} annotations {rel} named by the manifest were not "
                    f"uploaded{hint}", MANIFEST_FILE, split)
            continue
        say(f"checking {split} annotations {rel} ({files[rel] / 1e6:.1f} MB)")
        try:
            with source.open_large(rel) as buffer:
                read.append(rel)
                result = check_split(buffer, split, rel, log, task=manifest.task, limits=limits)
        except ObjectChanged as exc:
            log.add(Code.OBJECT_CHANGED, str(exc), rel)
            continue
        except SourceFileError as exc:
            log.add(Code.FILE_UNREADABLE, str(exc), rel)
            continue
        except DatasetUnreadable:
            raise  # access denied or the bucket gone: Step Functions routes on it
        except Exception as exc:
            _check_failed(log, rel, f"{split} annotations", exc)
            continue
        if result is not None and result.stats is not None:
            results[split] = result
            splits[split] = result.stats
            say(f"  {split}: {result.stats.images} images, {result.stats.instances} instances")
    # A derived split is keyed on each image's content (d2ops_core.validation.split): it is derived, and the
    # cross-split checks run on its two sides, once the image checks know every SHA-256 (below, or in the
    # Distributed Map's summarize step). A rejected train file is not split.
    derive_pending = derive_val and "train" in results and log.error_count == 0
    if derive_pending and len(results["train"].images) < 2:  # known before any image is read
        log.add(Code.MANIFEST_PATH_MISSING, f"no val annotations were uploaded and none can be derived: "
                f"{manifest.train}: {len(results['train'].images)} image(s): a val split needs at least 2 train "
                "images to derive one", MANIFEST_FILE, "val")
        derive_pending = False
    if not derive_pending:
        try:
            _cross_split(results.get("train"), results.get("val"), log, limits)
        except Exception as exc:
            _check_failed(log, None, "cross-split", exc)

    prefix = manifest.images_prefix
    if not check_images or not any(key.startswith(prefix) for key in files):
        if check_images:
            log.add(Code.MANIFEST_PATH_MISSING, f"no files under {prefix} (the manifest's images directory)",
                    MANIFEST_FILE, "images")
        try:  # no bytes read: overlap by name, which in one version is overlap by content too
            _name_overlap(results.get("train"), results.get("val"), prefix, log)
        except Exception as exc:
            _check_failed(log, None, "train/val overlap", exc)
    else:
        refs = {r.file: r.images for r in results.values()}
        missing_before = log.counts[Code.IMAGE_MISSING]
        try:
            items = image_items(source, refs, files, prefix, log)
            referenced = sum(len(r) for r in refs.values())
            missing = log.counts[Code.IMAGE_MISSING] - missing_before
            clean = log.error_count == 0
            if inline_limit is not None and len(items) > inline_limit:
                if clean:  # the Distributed Map checks them; the summarize step finishes the report
                    pending = True
                    image_check = ImageCheck(mode="pending", referenced=referenced, missing=missing)
                    say(f"{len(items)} image files: more than {inline_limit}, checked by the Distributed Map")
                else:
                    say(f"{len(items)} image files not checked: the annotations are rejected already")
            else:
                counted = [0, 0]  # entries whose file passed the rule, of those decoded in full

                def found() -> Iterator[Issue]:
                    for image, issues in check_items(source, items, snapshot=snapshot and clean, progress=say):
                        overlap.add(image)
                        image_entries.append(image.entry)
                        if image.passed:
                            counted[0] += len(image.locations)
                            counted[1] += len(image.locations) if image.decoded else 0
                        yield from issues

                merge_image_issues(log, found())
                image_check = ImageCheck(mode="all", referenced=referenced, missing=missing, probed=counted[0],
                                         decoded=counted[1])
        except DatasetUnreadable:
            raise
        except Exception as exc:
            _check_failed(log, prefix, "image files", exc)
    if not pending:
        try:
            overlap.report(log.add)
        except Exception as exc:
            _check_failed(log, None, "train/val overlap", exc)
    if derive_pending and not pending and image_check.mode == "all":
        derive_pending = False
        if log.error_count == 0:  # every image was read and passed: each has its SHA-256
            say(f"deriving a val split from {manifest.train} (keyed on each image's content)")
            try:
                with source.open_large(manifest.train) as buffer:
                    document = bytes(buffer)
                sha256_of = {e.key[len(prefix):]: e.sha256 for e in image_entries
                             if e.sha256 is not None and e.key.startswith(prefix)}
                sides = derive_val_split(document, manifest, sha256_of, log, limits)
                del document
            except ObjectChanged as exc:
                log.add(Code.OBJECT_CHANGED, str(exc), manifest.train)
                sides = None
            except DatasetUnreadable:
                raise
            except Exception as exc:
                _check_failed(log, manifest.train, "derived val split", exc)
                sides = None
            if sides is not None:
                derived, derived_stats = sides
                splits.update(derived_stats)
                say(f"  derived: {derived.train_images} train images, {derived.val_images} val images "
                    f"(keyed on {derived.keyed_on!r} and each image's content)")
    elif derive_pending and log.error_count > 0:
        derive_pending = False  # rejected: nothing will be derived
    if snapshot and log.error_count == 0:
        copied = snapshot_files(source, read, log)
        if pending and not copied:  # a file changed before its copy: rejected now, no Map to run
            pending = False
            image_check = ImageCheck(mode="skipped", referenced=image_check.referenced, missing=image_check.missing)
    say(f"done: {log.error_count} errors, {log.warning_count} warnings")
    return done()


def snapshot_files(source: Source, read: list[str], log: IssueLog) -> bool:
    """Copy the manifest and annotation files into the snapshot; a changed one is OBJECT_CHANGED."""
    ok = True
    for rel in dict.fromkeys(read):
        try:
            ok = source.copy_to_snapshot(rel) and ok
        except ObjectChanged as exc:
            log.add(Code.OBJECT_CHANGED, str(exc), rel)
            ok = False
    return ok


def validate_local(path: str | os.PathLike[str], *, check_images: bool = True, limits: Thresholds | None = None,
                   progress: Progress | None = None) -> ValidationReport:
    """Validate the dataset version in directory ``path``; every image is decoded unless ``check_images`` is off."""
    return validate_source(LocalSource(path), check_images=check_images, limits=limits, progress=progress)


def validate_s3(s3_client: Any, bucket: str, prefix: str, *, check_images: bool = True,
                limits: Thresholds | None = None, progress: Progress | None = None,
                stack_limits: StackLimits | None = None) -> ValidationReport:
    """Validate the dataset version under s3://bucket/prefix, every image read (pinned to its listed version)."""
    return validate_source(S3Source(s3_client, bucket, prefix), check_images=check_images,
                           expected=dataset_from_prefix(prefix), limits=limits, progress=progress,
                           stack_limits=stack_limits)
