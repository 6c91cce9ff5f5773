"""The derived val split: each image's side is decided by its content, the same in every version of a dataset.

A dataset version whose manifest does not name ``val`` and that has no ``annotations/val.json``
gets its val split derived from its train annotations. An image is val when
SHA-256(``<dataset name>\\0<SHA-256 of the image's bytes>``) falls in the lowest ``VAL_PERCENT`` % of
its range: a draw of the image's own, keyed on the dataset's name and the image's content. The
version plays no part, so an image keeps its side in every version of the dataset: once train,
always train, and the champion (trained on an earlier version) is never scored on an image it
learned from. A new image draws its own side; a renamed file keeps its side; two files with the
same bytes are on the same side (a derived split has no train/val overlap). Only SHA-256 and
integer arithmetic decide it, so it does not depend on the machine, the Python hash seed or the
order of the images. The share of val is ``VAL_PERCENT`` on average, not exactly (each draw is
independent: 40 images give 8 +- 2.5 val images).

Everyone who needs the split computes it from the same content hashes, which the run's bytes fix:
the validator from the SHA-256s it computes while checking the images (the Distributed Map's
summarize step for large versions, d2ops_core.validation.merge), the trainer and the evaluation
job by hashing the image files of their channel, the run's snapshot of exactly those bytes
(model_code.dataset_version), and the dataset diff from the run's inventory or the files
(d2ops_core.dataset_diff).

Tiny sets. Two rules look past one image, both over the distinct contents:

- *at least one val*: when no image draws val, the one with the lowest draw goes to val. As the
  set grows it returns to train when another image draws val or one with a lower draw arrives
  (val -> train, never train -> val). Only removing images can move a train image to val through
  this rule: when no remaining image draws val (probability 0.8^n for n distinct images, 1 % at
  20); the evaluation job still excludes images a model trained on (model_code.evaluation.held_out).
- *never all*: when every image draws val the split is refused (SplitError) instead of forcing one
  into train, because that image would go back to val as soon as an image drawing train arrived
  (a train -> val move). Probability 0.2^n: 4 % of 2-image sets, under 0.2 % from 4 images.

No per-class stratification: giving a rare class its first val image would take an image that
earlier versions trained on. Classes whose images all drew train are listed in
``unsplit_categories`` (the validator warns CLASS_MISSING_IN_VAL: their AP is not measured) and
classes whose images all drew val in ``val_only_categories`` (CLASS_FEW_INSTANCES with 0 train
instances: no model learns them until an image of theirs draws train). Upload a val file to choose
the split yourself.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

VAL_PERCENT = 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RANGE = 1 << 256


class SplitError(ValueError):
    """The train document cannot be split (under two distinct images, every image drew val, malformed entries)."""


class DerivedSplit(BaseModel):
    """How a val split was derived; in the validation report, the run's validation summary and the trainer's log."""

    keyed_on: str = Field(description="the dataset name: an image is val when SHA-256(name, the SHA-256 of its bytes) "
                                      "falls under val_percent; the version plays no part, so an image keeps its "
                                      "side in every version of the dataset")
    source: str = Field(description="the train annotations the split was derived from, relative to the dataset root")
    val_percent: int = Field(description="each image's chance of val (its own draw: the share is this on average)")
    train_images: int
    val_images: int
    held_for_val: str | None = Field(
        default=None, description="file_name of the image put in val because no image drew val (a tiny set)")
    val_digest: str = Field(description="SHA-256 of the sorted val file_names joined by newlines: compare two runs")
    unsplit_categories: list[int] = Field(
        description="category ids whose annotated images all drew train: no val image, their AP is not measured")
    val_only_categories: list[int] = Field(
        default_factory=list, description="category ids whose annotated images all drew val: no model trains on them")


def draw(name: str, sha256: str) -> int:
    """The image's draw in [0, 2**256): SHA-256 of the dataset name and the image's content hash."""
    return int.from_bytes(hashlib.sha256(f"{name}\0{sha256}".encode()).digest(), "big")


def draws_val(name: str, sha256: str, val_percent: int = VAL_PERCENT) -> bool:
    return draw(name, sha256) * 100 < val_percent * _RANGE


def assign_val(contents: Sequence[str], name: str, val_percent: int = VAL_PERCENT) -> set[int]:
    """Indices of ``contents`` (the hex SHA-256 of each image's bytes) that go to val, for dataset ``name``.

    Entries with the same content are on the same side. Raises SplitError under two distinct
    contents, when every content draws val, or for a value that is not a hex SHA-256.
    """
    if not 0 < val_percent < 100:
        raise SplitError(f"val_percent {val_percent} is not between 1 and 99")
    bad = next((c for c in contents if not _SHA256.match(c)), None)
    if bad is not None:
        raise SplitError(f"{bad[:80]!r} is not a lowercase hex SHA-256")
    distinct = sorted(set(contents))
    if len(distinct) < 2:
        raise SplitError(f"{len(contents)} image(s) with {len(distinct)} distinct content(s): a val split needs at "
                         "least 2 different train images to derive one")
    draws = {c: draw(name, c) for c in distinct}
    val_contents = {c for c, d in draws.items() if d * 100 < val_percent * _RANGE}
    if len(val_contents) == len(distinct):
        raise SplitError(f"all {len(distinct)} distinct images drew val (each has a {val_percent} % chance): "
                         "add images or upload a val file")
    if not val_contents:  # at least one val: the lowest draw (see the module's docstring)
        val_contents = {min(distinct, key=lambda c: (draws[c], c))}
    return {i for i, c in enumerate(contents) if c in val_contents}


def derive_split(document: dict[str, Any], name: str, source: str, sha256_of: Mapping[str, str],
                 val_percent: int = VAL_PERCENT) -> tuple[dict[str, Any], dict[str, Any], DerivedSplit]:
    """(train document, val document, record) from one COCO instances document of dataset ``name``.

    ``sha256_of``: each image's ``file_name`` -> the hex SHA-256 of its bytes (every file_name the
    document names; a missing one is a SplitError naming it). Images keep their order on each
    side; annotations follow their image; every other key (categories, info, licenses) is copied
    to both.
    """
    raw_images = document.get("images")
    if not isinstance(raw_images, list) or not all(isinstance(im, dict) for im in raw_images):
        raise SplitError(f"{source}: 'images' is not a list of objects")
    annotations = document.get("annotations") or []
    classes: dict[Any, set[int]] = defaultdict(set)
    for ann in annotations:
        if isinstance(ann, dict) and isinstance(ann.get("category_id"), int):
            classes[ann.get("image_id")].add(ann["category_id"])
    names = [str(im.get("file_name", "")) for im in raw_images]
    contents = []
    for file_name in names:
        sha = sha256_of.get(file_name)
        if sha is None:
            raise SplitError(f"{source}: no content hash for {file_name!r}: the split is keyed on each image's bytes")
        contents.append(sha.lower())
    try:
        val = assign_val(contents, name, val_percent)
    except SplitError as exc:
        raise SplitError(f"{source}: {exc}") from None
    val_contents = {contents[i] for i in val}
    drew_val = [draws_val(name, c, val_percent) for c in contents]
    held = next((names[i] for i in sorted(val) if not drew_val[i]), None)
    val_ids = {raw_images[i].get("id") for i in val}
    rest = {k: v for k, v in document.items() if k not in ("images", "annotations")}
    train_doc = {**rest, "images": [im for i, im in enumerate(raw_images) if i not in val],
                 "annotations": [a for a in annotations if not (isinstance(a, dict) and a.get("image_id") in val_ids)]}
    val_doc = {**rest, "images": [raw_images[i] for i in sorted(val)],
               "annotations": [a for a in annotations if isinstance(a, dict) and a.get("image_id") in val_ids]}
    sides: dict[int, set[bool]] = defaultdict(set)
    for i, im in enumerate(raw_images):
        for c in classes.get(im.get("id"), ()):
            sides[c].add(contents[i] in val_contents)
    record = DerivedSplit(
        keyed_on=name, source=source, val_percent=val_percent, train_images=len(raw_images) - len(val),
        val_images=len(val), held_for_val=held,
        val_digest=hashlib.sha256("\n".join(sorted(names[i] for i in val)).encode()).hexdigest(),
        unsplit_categories=sorted(c for c, s in sides.items() if s == {False}),
        val_only_categories=sorted(c for c, s in sides.items() if s == {True}))
    return train_doc, val_doc, record
