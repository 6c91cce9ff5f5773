"""Compare two dataset versions: images added, removed, renamed and changed, annotations per class, the
class histogram per split and its shift, images moved between train and val.

Pure: a version is read through two callables (``read(key) -> bytes | None`` for the manifest and the
annotation files, ``fingerprints(sorted keys) -> (key, size, sha256)`` for the images), so the CLI
(directories, S3 prefixes) and the prepare Lambda (run inventories and snapshots) share every rule.
Images are identified by content: the same bytes under a new key are *renamed*, not added and removed.
Classes are identified by name: a renumbered category id is no change.

Memory (what grows with what), measured on two 110,000-image versions (770,000 boxes, 7 classes an
image, 110 MB train.json each): 470 MB peak RSS for the whole diff, 4 s a version on this machine.
- one :class:`ImageRecord` per image of each version (key, 32-byte checksum, split, 16 bytes per class:
  a count and an order-independent 64-bit hash of its boxes): ~330 bytes an image at 7 classes,
  ~1 GB for two 1.7 M-image versions; never the boxes themselves;
- while one annotation file is decoded: its bytes, ~160 bytes per annotation (segmentations and
  boxes stay slices of the file) and per-image tallies: this grows with the file's annotations and
  is freed before the next file (Open Images' 15 M boxes would need several GB: that diff belongs on
  a larger machine than the prepare Lambda, which then records why it has none);
- the images present on one side only (to pair renames) grow with the number of added/removed images;
- the listed changed images are a bounded heap (CHANGED_IMAGES_SHOWN); every change is still counted.
The two versions' records are joined by a merge over key-sorted lists, as the inventories are sorted.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from d2ops_core.documents.dataset_diff import (
    CHANGED_IMAGES_SHOWN,
    SPLITS,
    TRAIN_TO_VAL_SHOWN,
    ClassDiff,
    DatasetDiff,
    FileChange,
    ImageChange,
    ImageChangeKind,
    ImageCounts,
    SplitCount,
    VersionSide,
)
from d2ops_core.file_hash import file_sha256_and_size
from d2ops_core.validation.inventory import InventoryEntry
from d2ops_core.validation.manifest import MANIFEST_FILE, Manifest, parse_manifest, unsafe_relative_path
from d2ops_core.validation.split import SplitError, assign_val

_MASK64 = (1 << 64) - 1
_BOX_DECODER = msgspec.json.Decoder()

ReadFile = Callable[[str], "bytes | None"]
Fingerprints = Callable[[list[str]], Iterable[tuple[str, int, "str | None"]]]


class DiffInputError(ValueError):
    """A version cannot be compared: no manifest, unreadable JSON, not a COCO dataset. One line, naming where."""


class DiffTimeout(RuntimeError):
    """The diff ran past its deadline (the prepare Lambda's budget for it)."""


# Lean COCO shapes: only what the diff compares; msgspec skips every other key (segmentations included)
# without building it.
class _Img(msgspec.Struct, gc=False):
    id: Any = None
    file_name: Any = None


class _Ann(msgspec.Struct, gc=False):
    image_id: Any = None
    category_id: Any = None
    # A zero-copy slice of the file, decoded one box at a time: a list of four floats per annotation
    # would triple the decoded file's size.
    bbox: msgspec.Raw = msgspec.Raw()
    iscrowd: Any = 0


class _Cat(msgspec.Struct, gc=False):
    id: Any = None
    name: Any = None


class _Coco(msgspec.Struct, gc=False):
    images: list[_Img] = msgspec.field(default_factory=list)
    annotations: list[_Ann] = msgspec.field(default_factory=list)
    categories: list[_Cat] = msgspec.field(default_factory=list)


# Class names are numbered once per process (both versions share the numbers) so that an image's
# classes pack into 16 bytes each: (name number, instances, boxes hash).
_NAME_NUMBERS: dict[str, int] = {}
_NAMES: list[str] = []
_PACKED = struct.Struct("<IIQ")


def _number(name: str) -> int:
    number = _NAME_NUMBERS.get(name)
    if number is None:
        number = _NAME_NUMBERS[name] = len(_NAMES)
        _NAMES.append(name)
    return number


def _pack(classes: dict[str, tuple[int, int]]) -> bytes:
    return b"".join(_PACKED.pack(_number(n), c, h) for n, (c, h) in sorted(classes.items()))


@dataclass(slots=True)
class ImageRecord:
    """One image of a version, compact (a million of these per side is the diff's main memory):
    about 200 bytes plus 16 per class it carries."""

    key: str  # relative to the version root: images/a.jpg
    size: int = 0
    digest: bytes | None = None  # SHA-256 of the bytes (None: not read, missing)
    split: str = ""  # "train", "val", or "train+val" for an image both files name
    packed: bytes = b""  # per class: name number, instances, order-independent hash of its boxes

    @property
    def sha256(self) -> str | None:
        return self.digest.hex() if self.digest is not None else None

    @property
    def classes(self) -> dict[str, tuple[int, int]]:
        return {_NAMES[n]: (c, h) for n, c, h in _PACKED.iter_unpack(self.packed)}

    @property
    def instances(self) -> int:
        return sum(c for _, c, _ in _PACKED.iter_unpack(self.packed))


@dataclass
class VersionIndex:
    """One version, ready to compare: its images sorted by key, its other files, its histogram."""

    side: VersionSide
    images: list[ImageRecord]
    files: dict[str, str | None]  # manifest / annotation file key -> sha256 (None: not hashed)
    histogram: dict[tuple[str, str], tuple[int, int]]  # (split, class) -> (images, instances)
    notes: list[str] = field(default_factory=list)


def _box_hash(name: str, raw: msgspec.Raw, iscrowd: Any) -> int:
    try:
        bbox: Any = _BOX_DECODER.decode(raw) if len(raw) else None
    except msgspec.DecodeError:
        bbox = bytes(raw)
    if isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, int | float) for v in bbox):
        # Hundredths of a pixel: float noise from a re-export is no change, a moved box is.
        text = f"{name}|" + ",".join(f"{float(v):.2f}" for v in bbox) + f"|{iscrowd}"
    else:
        text = f"{name}|{bbox!r}|{iscrowd}"
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _decode(raw: bytes, where: str) -> _Coco:
    try:
        return msgspec.json.decode(raw, type=_Coco)
    except msgspec.ValidationError as exc:
        raise DiffInputError(f"{where}: not a COCO instances file ({exc})") from None
    except msgspec.DecodeError as exc:
        raise DiffInputError(f"{where}: unreadable JSON ({exc})") from None


def _split_images(doc: _Coco, split: str, images_prefix: str,
                  records: dict[str, ImageRecord], histogram: Counter[tuple[str, str]],
                  image_counts: Counter[tuple[str, str]]) -> int:
    """Fold one annotation file into per-image records; returns its instance count.

    A derived val is not known here: its images are train until :func:`_derive_val` moves them,
    once their content is hashed (the split is keyed on it).
    """
    names = {c.id: str(c.name) for c in doc.categories if c.name is not None}
    per_image: dict[Any, dict[str, list[int]]] = defaultdict(dict)
    for ann in doc.annotations:
        name = names.get(ann.category_id, f"category {ann.category_id}")
        slot = per_image[ann.image_id].setdefault(name, [0, 0])
        slot[0] += 1
        slot[1] = (slot[1] + _box_hash(name, ann.bbox, ann.iscrowd)) & _MASK64
    side = split
    for im in doc.images:
        key = images_prefix + str(im.file_name)
        classes = {n: (c, h) for n, (c, h) in per_image.get(im.id, {}).items()}
        record = records.get(key)
        if record is None:
            records[key] = ImageRecord(key=key, split=side, packed=_pack(classes))
        else:  # named by both files (overlap): one image, its boxes from both
            record.split = "+".join(sorted({*record.split.split("+"), side}))
            merged = record.classes
            for n, (c, h) in classes.items():
                oc, oh = merged.get(n, (0, 0))
                merged[n] = (oc + c, (oh + h) & _MASK64)
            record.packed = _pack(merged)
        for n, (c, _) in classes.items():
            histogram[(side, n)] += c
            image_counts[(side, n)] += 1
    for n in names.values():  # a declared class without instances still exists in the version
        histogram.setdefault((split, n), 0)
        image_counts.setdefault((split, n), 0)
    return len(doc.annotations)


def _derive_val(records: list[ImageRecord], name: str, histogram: Counter[tuple[str, str]],
                image_counts: Counter[tuple[str, str]]) -> str | None:
    """Move the images the pipeline's derived split puts in val (d2ops_core.validation.split, keyed on the
    dataset name and each image's SHA-256) from train to val; a note when it cannot be derived."""
    train = [r for r in records if r.split == "train"]
    unhashed = sum(r.digest is None for r in train)
    if unhashed:
        return f"val not derived: {unhashed} train images have no checksum (missing or not read); all count as train"
    try:
        val = assign_val([r.digest.hex() for r in train if r.digest is not None], name)
    except SplitError as exc:  # the validator rejects such a version: everything stays train
        return f"val not derived: {exc}"
    for i in val:
        record = train[i]
        record.split = "val"
        for n, (c, _) in record.classes.items():
            histogram[("train", n)] -= c
            histogram[("val", n)] += c
            image_counts[("train", n)] -= 1
            image_counts[("val", n)] += 1
    return None


def index_version(uri: str, source: str, read: ReadFile, fingerprints: Fingerprints, *,
                  run_id: str | None = None, inventory_digest: str | None = None,
                  file_hashes: dict[str, str | None] | None = None,
                  deadline: float | None = None) -> VersionIndex:
    """Read one version's manifest and annotation files and fingerprint every image they reference.

    ``file_hashes``: the checksums of manifest/annotation files where an inventory already has them.
    """
    manifest, raw = read_manifest(read, uri)
    records: dict[str, ImageRecord] = {}
    histogram: Counter[tuple[str, str]] = Counter()
    image_counts: Counter[tuple[str, str]] = Counter()
    files: dict[str, str | None] = {MANIFEST_FILE: _sha(raw)}
    instances = 0
    val_raw = read(manifest.val)
    derive = val_raw is None and not manifest.val_named
    if val_raw is None and manifest.val_named:
        raise DiffInputError(f"{uri}{manifest.val}: missing (the manifest names it)")
    train_raw = read(manifest.train)
    if train_raw is None:
        raise DiffInputError(f"{uri}{manifest.train}: missing (the manifest names it)")
    for split, key, data in (("train", manifest.train, train_raw), ("val", manifest.val, val_raw)):
        if data is None:
            continue
        files[key] = _sha(data)
        doc = _decode(data, uri + key)
        instances += _split_images(doc, split, manifest.images_prefix, records, histogram, image_counts)
        del doc
        _check(deadline)
    if file_hashes:
        files.update({k: v for k, v in file_hashes.items() if k in files and v})
    ordered = sorted(records.values(), key=lambda r: r.key)
    keys = [r.key for r in ordered]
    hashed = 0
    for record, (key, size, sha) in zip(ordered, fingerprints(keys), strict=True):
        if key != record.key:
            raise AssertionError(f"fingerprints out of order: {key} for {record.key}")
        record.size, record.digest = size, bytes.fromhex(sha) if sha else None
        hashed += sha is not None
        if hashed % 1000 == 0:
            _check(deadline)
    notes = []
    if hashed < len(ordered):
        notes.append(f"{uri}: {len(ordered) - hashed} of {len(ordered)} images have no checksum (missing or not "
                     "read): their content is not compared")
    if derive:  # the manifest names no val: the pipeline derives it from the images' content, so does the diff
        note = _derive_val(ordered, manifest.name, histogram, image_counts)
        if note:
            notes.append(f"{uri}: {note}")
    side = VersionSide(uri=uri, name=manifest.name, version=manifest.version, source=source, run_id=run_id,
                       inventory_digest=inventory_digest, images=len(ordered), instances=instances,
                       val_derived=derive)
    both = {k: (image_counts[k], histogram[k]) for k in histogram}
    return VersionIndex(side=side, images=ordered, files=files, histogram=both, notes=notes)


def read_manifest(read: ReadFile, uri: str) -> tuple[Manifest, bytes]:
    raw = read(MANIFEST_FILE)
    if raw is None:
        raise DiffInputError(f"{uri}: no {MANIFEST_FILE} (not a dataset version)")
    manifest, problems = parse_manifest(raw)
    if manifest is None:
        raise DiffInputError(f"{uri}{MANIFEST_FILE}: {problems[0][1]}")
    return manifest, raw


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DiffTimeout("the diff ran past its time budget")


def inventory_fingerprints(entries: Iterable[InventoryEntry]) -> Fingerprints:
    """Fingerprints from a key-sorted inventory: a merge join, so the inventory is streamed, never held."""

    def lookup(keys: list[str]) -> Iterator[tuple[str, int, str | None]]:
        it = iter(entries)
        current = next(it, None)
        for key in keys:
            while current is not None and current.key < key:
                current = next(it, None)
            if current is not None and current.key == key:
                yield key, current.size, current.sha256
            else:
                yield key, 0, None

    return lookup


# ----- the comparison -------------------------------------------------------------------------


def _merge(a: list[ImageRecord], b: list[ImageRecord]) -> Iterator[tuple[ImageRecord | None, ImageRecord | None]]:
    i = j = 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and a[i].key < b[j].key):
            yield a[i], None
            i += 1
        elif i >= len(a) or b[j].key < a[i].key:
            yield None, b[j]
            j += 1
        else:
            yield a[i], b[j]
            i += 1
            j += 1


@dataclass
class _ClassTally:
    images_added: int = 0
    images_removed: int = 0
    images_changed: int = 0
    instances_added: int = 0
    instances_removed: int = 0

    def count_whole(self, instances: int, added: bool) -> None:
        """An image with ``instances`` of this class that only B has (added) or only A has (removed)."""
        if added:
            self.images_added, self.instances_added = self.images_added + 1, self.instances_added + instances
        else:
            self.images_removed, self.instances_removed = self.images_removed + 1, self.instances_removed + instances


def _deltas(a: ImageRecord | None, b: ImageRecord | None) -> dict[str, int]:
    before, after = a.classes if a else {}, b.classes if b else {}
    out = {}
    for n in set(before) | set(after):
        d = after.get(n, (0, 0))[0] - before.get(n, (0, 0))[0]
        if d:
            out[n] = d
    return out


def compare(a: VersionIndex, b: VersionIndex) -> DatasetDiff:
    """The diff of A (the older: the champion's) to B (the newer: this run's)."""
    counts = ImageCounts(a=len(a.images), b=len(b.images))
    tallies: dict[str, _ClassTally] = defaultdict(_ClassTally)
    shown: list[tuple[int, int, ImageChange]] = []  # min-heap on (weight, sequence)
    total_changed = 0
    only_a: list[ImageRecord] = []
    only_b: list[ImageRecord] = []
    trained_to_val: list[str] = []  # B's keys of images A had in train and B has in val (a bounded heap's worth)

    def note(change: ImageChange) -> None:
        nonlocal total_changed
        total_changed += 1
        weight = sum(abs(v) for v in change.class_deltas.values()) + len(change.changes)
        item = (weight, -total_changed, change)
        if len(shown) < CHANGED_IMAGES_SHOWN:
            heapq.heappush(shown, item)
        elif item[:2] > shown[0][:2]:
            heapq.heapreplace(shown, item)

    def pair(old: ImageRecord, new: ImageRecord, renamed: bool) -> None:
        kinds: list[ImageChangeKind] = []
        if renamed:
            kinds.append("renamed")
            counts.renamed += 1
        elif old.digest is None or new.digest is None:
            counts.not_compared += 1
        elif old.digest != new.digest:
            kinds.append("content")
            counts.content_changed += 1
        relabelled = False
        old_classes, new_classes = (old.classes, new.classes) if old.packed != new.packed else ({}, {})
        for n in set(old_classes) | set(new_classes):
            before, after = old_classes.get(n, (0, 0)), new_classes.get(n, (0, 0))
            if before != after:
                relabelled = True
                tallies[n].images_changed += 1
                tallies[n].instances_added += max(0, after[0] - before[0])
                tallies[n].instances_removed += max(0, before[0] - after[0])
        if relabelled:
            kinds.append("annotations")
            counts.annotations_changed += 1
        if old.split != new.split:
            kinds.append("split")
            counts.split_moved += 1
            if "train" in old.split.split("+") and "val" in new.split.split("+"):
                # The champion (trained on A's train) would be scored on it: the evaluation job leaves it out.
                counts.train_to_val += 1
                if len(trained_to_val) < TRAIN_TO_VAL_SHOWN:
                    trained_to_val.append(new.key)
        if not kinds:
            counts.unchanged += 1
            return
        note(ImageChange(key=new.key, previous_key=old.key if renamed else None, changes=kinds,
                         split_a=old.split, split_b=new.split, instances_a=old.instances,
                         instances_b=new.instances, class_deltas=_deltas(old, new)))

    def whole(record: ImageRecord, added: bool) -> None:
        """An image only B has (added) or only A has (removed, after renames are paired)."""
        if added:
            counts.added += 1
            change = ImageChange(key=record.key, changes=["added"], split_b=record.split,
                                 instances_b=record.instances, class_deltas=_deltas(None, record))
        else:
            counts.removed += 1
            change = ImageChange(key=record.key, changes=["removed"], split_a=record.split,
                                 instances_a=record.instances, class_deltas=_deltas(record, None))
        for n, (c, _) in record.classes.items():
            tallies[n].count_whole(c, added)
        note(change)

    for old, new in _merge(a.images, b.images):
        if old is not None and new is not None:
            pair(old, new, renamed=False)
        elif old is not None:
            only_a.append(old)
        elif new is not None:
            only_b.append(new)

    # Renames: the same bytes under a key only A has and a key only B has. Grows with added + removed.
    removed_by_sha: dict[bytes, list[ImageRecord]] = defaultdict(list)
    for record in only_a:
        if record.digest:
            removed_by_sha[record.digest].append(record)
    paired: set[str] = set()
    for record in only_b:
        candidates = removed_by_sha.get(record.digest or b"")
        if candidates:
            old = candidates.pop(0)
            paired.add(old.key)
            pair(old, record, renamed=True)
            continue
        whole(record, added=True)
    for record in only_a:
        if record.key not in paired:
            whole(record, added=False)

    classes = _class_diffs(a, b, tallies)
    files: list[FileChange] = []
    for key in sorted(set(a.files) | set(b.files)):
        if key not in b.files:
            files.append(FileChange(key=key, change="removed"))
        elif key not in a.files:
            files.append(FileChange(key=key, change="added"))
        elif a.files[key] != b.files[key]:
            files.append(FileChange(key=key, change="changed"))
    image_changes = [c for _, _, c in sorted(shown, key=lambda t: (-t[0], -t[1]))]
    same = total_changed == 0 and all(c.status == "unchanged" for c in classes)
    notes = [*a.notes, *b.notes]
    if a.side.val_derived != b.side.val_derived:
        notes.append("one version names its val split and the other derives it from train")
    return DatasetDiff(a=a.side, b=b.side, same=same, images=counts, classes=classes, files=files,
                       changed_images=image_changes, changed_images_total=total_changed,
                       train_to_val_examples=sorted(trained_to_val), notes=notes)


def _class_diffs(a: VersionIndex, b: VersionIndex, tallies: dict[str, _ClassTally]) -> list[ClassDiff]:
    names = {n for _, n in a.histogram} | {n for _, n in b.histogram}
    total_a = sum(i for _, i in a.histogram.values())
    total_b = sum(i for _, i in b.histogram.values())
    out: list[ClassDiff] = []
    for name in names:
        splits = {}
        for split in SPLITS:
            ia, na = a.histogram.get((split, name), (0, 0))
            ib, nb = b.histogram.get((split, name), (0, 0))
            splits[split] = SplitCount(images_a=ia, images_b=ib, instances_a=na, instances_b=nb)
        inst_a = sum(s.instances_a for s in splits.values())
        inst_b = sum(s.instances_b for s in splits.values())
        # New / vanished by instances: category lists often declare every class a project will ever have.
        in_a, in_b = inst_a > 0, inst_b > 0
        tally = tallies.get(name, _ClassTally())
        changed = (inst_a != inst_b or any(s.images_a != s.images_b for s in splits.values())
                   or tally.images_changed or tally.images_added or tally.images_removed)
        status = ("unchanged" if not (in_a or in_b) else "new" if not in_a else "vanished" if not in_b
                  else "changed" if changed else "unchanged")
        out.append(ClassDiff(
            name=name, status=status, splits=splits, instances_a=inst_a, instances_b=inst_b,
            instances_delta=inst_b - inst_a, relative_shift=(inst_b - inst_a) / inst_a if inst_a else None,
            share_a=inst_a / total_a if total_a else 0.0, share_b=inst_b / total_b if total_b else 0.0,
            images_added=tally.images_added, images_removed=tally.images_removed,
            images_changed=tally.images_changed, instances_added=tally.instances_added,
            instances_removed=tally.instances_removed))
    order = {"new": 0, "vanished": 0, "changed": 1, "unchanged": 2}
    out.sort(key=lambda c: (order[c.status], -abs(c.instances_delta), -(c.images_changed + c.images_added
                                                                        + c.images_removed), c.name))
    return out



# ----- a local directory ------------------------------------------------------------------------


def directory_reader(root: str) -> tuple[ReadFile, Fingerprints]:
    """``read`` and ``fingerprints`` of a dataset directory (images hashed in 1 MB chunks, one at a time).

    A key that is not a safe relative path (``..``, absolute) is never opened: it reads as missing.
    """
    import os

    def path_of(key: str) -> str | None:
        if unsafe_relative_path(key):
            return None
        return os.path.join(root, *key.split("/"))

    def read(key: str) -> bytes | None:
        path = path_of(key)
        if path is None or not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            return fh.read()

    def fingerprints(keys: list[str]) -> Iterator[tuple[str, int, str | None]]:
        for key in keys:
            path = path_of(key)
            if path is None or not os.path.isfile(path):
                yield key, 0, None
                continue
            sha256, size = file_sha256_and_size(path)
            yield key, size, sha256

    return read, fingerprints
