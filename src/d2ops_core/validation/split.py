"""The derived val split: a deterministic, stratified train/val split of a train-only dataset version.

A dataset version whose manifest does not name ``val`` and that has no ``annotations/val.json``
gets its val split derived from its train annotations. The split is a pure function of the
train document and the seed ``<name>/<version>``: the validator (which records it in the
report), the trainer and the evaluation job each compute it and get the same images on each
side, so nothing has to be copied next to the run and a re-run of the same version gets the
same split. Only integer arithmetic and SHA-256 decide it, so it does not depend on the
machine, the Python hash seed or the order of the images in the file.

How images are chosen (``VAL_PERCENT`` of them, at least one, never all):
1. every class with >= 2 images gets one image in val, rarest class first;
2. then images in seeded-hash order while each of their classes is below its share of val;
3. then images in the same order until val has its size.
No step moves a class's last train image, so every class with >= 2 images keeps one in train.
Step 1 cannot always succeed when images carry several classes (three images a+b, a+c, b+c
cannot be two-coloured): classes left without a val image are listed in ``unsplit_categories``
and the validator warns about them (CLASS_MISSING_IN_VAL).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, Field

VAL_PERCENT = 20


class SplitError(ValueError):
    """The train document cannot be split (fewer than two images, malformed image entries)."""


class DerivedSplit(BaseModel):
    """How a val split was derived; in the validation report, the run's validation summary and the trainer's log."""

    seed: str = Field(description="name/version of the dataset version: the split's only source of randomness")
    source: str = Field(description="the train annotations the split was derived from, relative to the dataset root")
    val_percent: int = Field(description="share of the images put in val (more when step 1 needs more)")
    train_images: int
    val_images: int
    val_digest: str = Field(description="SHA-256 of the sorted val file_names joined by newlines: compare two runs")
    unsplit_categories: list[int] = Field(
        description="category ids with >= 2 images that could not be given a val image (multi-class images)")


def split_seed(name: str, version: str) -> str:
    return f"{name}/{version}"


def _rank(seed: str, file_name: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{file_name}".encode()).digest()


def assign_val(images: list[tuple[str, frozenset[int]]], seed: str, val_percent: int = VAL_PERCENT) -> set[int]:
    """Indices of ``images`` (file_name, category ids) that go to val.

    Raises SplitError when no image can go (under two images, or every image holds a class's only image).
    """
    n = len(images)
    if n < 2:
        raise SplitError(f"{n} image(s): a val split needs at least 2 train images to derive one")
    if not 0 < val_percent < 100:
        raise SplitError(f"val_percent {val_percent} is not between 1 and 99")
    target = min(n - 1, max(1, (n * val_percent + 50) // 100))
    order = sorted(range(n), key=lambda i: (_rank(seed, images[i][0]), i))
    members: dict[int, list[int]] = defaultdict(list)
    for i in order:
        for c in images[i][1]:
            members[c].append(i)
    total = {c: len(m) for c, m in members.items()}
    in_train = dict(total)
    in_val = dict.fromkeys(total, 0)
    val: set[int] = set()

    def safe(i: int) -> bool:  # moving i keeps at least one train image of each of its classes
        return i not in val and all(in_train[c] >= 2 for c in images[i][1])

    def move(i: int) -> None:
        val.add(i)
        for c in images[i][1]:
            in_train[c] -= 1
            in_val[c] += 1

    for c in sorted((c for c in total if total[c] >= 2), key=lambda c: (total[c], c)):
        if in_val[c] == 0:
            pick = next((i for i in members[c] if safe(i)), None)
            if pick is not None:
                move(pick)
    quota = {c: (t * val_percent + 99) // 100 for c, t in total.items()}
    for i in order:
        if len(val) >= target:
            break
        if safe(i) and all(in_val[c] < quota[c] for c in images[i][1]):
            move(i)
    for i in order:
        if len(val) >= target:
            break
        if safe(i):
            move(i)
    if not val:
        raise SplitError(f"each of the {n} images holds the only image of some class: none can go to val")
    return val


def derive_split(document: dict[str, Any], seed: str, source: str,
                 val_percent: int = VAL_PERCENT) -> tuple[dict[str, Any], dict[str, Any], DerivedSplit]:
    """(train document, val document, record) from one COCO instances document.

    Images keep their order on each side; annotations follow their image; every other key
    (categories, info, licenses) is copied to both.
    """
    raw_images = document.get("images")
    if not isinstance(raw_images, list) or not all(isinstance(im, dict) for im in raw_images):
        raise SplitError(f"{source}: 'images' is not a list of objects")
    annotations = document.get("annotations") or []
    classes: dict[Any, set[int]] = defaultdict(set)
    for ann in annotations:
        if isinstance(ann, dict) and isinstance(ann.get("category_id"), int):
            classes[ann.get("image_id")].add(ann["category_id"])
    entries = [(str(im.get("file_name", "")), frozenset(classes.get(im.get("id"), ()))) for im in raw_images]
    try:
        val = assign_val(entries, seed, val_percent)
    except SplitError as exc:
        raise SplitError(f"{source}: {exc}") from None
    val_ids = {raw_images[i].get("id") for i in val}
    rest = {k: v for k, v in document.items() if k not in ("images", "annotations")}
    train_doc = {**rest, "images": [im for i, im in enumerate(raw_images) if i not in val],
                 "annotations": [a for a in annotations if not (isinstance(a, dict) and a.get("image_id") in val_ids)]}
    val_doc = {**rest, "images": [raw_images[i] for i in sorted(val)],
               "annotations": [a for a in annotations if isinstance(a, dict) and a.get("image_id") in val_ids]}
    val_classes = {c for i in val for c in entries[i][1]}
    counts: dict[int, int] = defaultdict(int)
    for _, cs in entries:
        for c in cs:
            counts[c] += 1
    names = sorted(entries[i][0] for i in val)
    record = DerivedSplit(seed=seed, source=source, val_percent=val_percent, train_images=len(entries) - len(val),
                          val_images=len(val), val_digest=hashlib.sha256("\n".join(names).encode()).hexdigest(),
                          unsplit_categories=sorted(c for c, n in counts.items() if n >= 2 and c not in val_classes))
    return train_doc, val_doc, record
