"""The derived val split (d2ops_core.validation.split): its properties; how validation, training, evaluation see it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops import synth
from d2ops_core.validation import Code, validate_local
from d2ops_core.validation.split import VAL_PERCENT, SplitError, assign_val, derive_split
from model_code.dataset_version import DatasetError, open_dataset_version

FAST = settings(max_examples=150, deadline=None, derandomize=True, database=None)

# Images as (file_name, classes): up to 6 classes, some images without annotations.
IMAGES = st.lists(st.frozensets(st.integers(1, 6), max_size=3), min_size=2, max_size=60).map(
    lambda classes: [(f"img/{i:04d}.png", c) for i, c in enumerate(classes)])
SINGLE_CLASS = st.lists(st.integers(1, 8), min_size=2, max_size=80).map(
    lambda classes: [(f"img/{i:04d}.png", frozenset({c})) for i, c in enumerate(classes)])


def counts(images: list[tuple[str, frozenset[int]]], indices: set[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in indices:
        for c in images[i][1]:
            out[c] = out.get(c, 0) + 1
    return out


@FAST
@given(IMAGES, st.sampled_from(["shapes/v1", "shapes/v2", "coco/2017"]))
def test_every_class_keeps_a_train_image_and_both_sides_are_non_empty(
        images: list[tuple[str, frozenset[int]]], seed: str) -> None:
    total = counts(images, set(range(len(images))))
    if all(any(total[c] == 1 for c in cs) for _, cs in images):
        with pytest.raises(SplitError, match="only image of some class"):
            assign_val(images, seed)
        return
    val = assign_val(images, seed)
    train = set(range(len(images))) - val
    assert val and train
    in_train, in_val = counts(images, train), counts(images, val)
    for c, n in total.items():
        assert in_train.get(c, 0) >= 1  # never a class's last train image
        if n >= 2 and c not in in_val:
            # Only multi-class images can make this impossible: the record lists such classes.
            assert any(len(cs) > 1 for _, cs in images)
    classes_needing_val = sum(1 for n in total.values() if n >= 2)
    target = max(1, (len(images) * VAL_PERCENT + 50) // 100)
    assert len(val) <= max(target, classes_needing_val)


@FAST
@given(SINGLE_CLASS, st.sampled_from(["shapes/v1", "shapes/v2"]))
def test_with_one_class_per_image_every_class_with_two_images_is_on_both_sides(
        images: list[tuple[str, frozenset[int]]], seed: str) -> None:
    if len({c for _, cs in images for c in cs}) == len(images):
        return  # every class has one image: nothing can go to val (the test above checks the error)
    val = assign_val(images, seed)
    in_val, in_train = counts(images, val), counts(images, set(range(len(images))) - val)
    for c, n in counts(images, set(range(len(images)))).items():
        if n >= 2:
            assert in_val.get(c, 0) >= 1 and in_train.get(c, 0) >= 1, (c, n)
        else:
            assert in_train[c] == 1  # a single image trains


@FAST
@given(IMAGES, st.randoms(use_true_random=False))
def test_the_split_depends_on_the_images_and_the_seed_not_on_their_order(
        images: list[tuple[str, frozenset[int]]], rnd: random.Random) -> None:
    total = counts(images, set(range(len(images))))
    if all(any(total[c] == 1 for c in cs) for _, cs in images):
        return  # nothing can go to val
    val = {images[i][0] for i in assign_val(images, "shapes/v1")}
    shuffled = list(images)
    rnd.shuffle(shuffled)
    assert {shuffled[i][0] for i in assign_val(shuffled, "shapes/v1")} == val


def test_the_seed_is_the_dataset_version() -> None:
    images = [(f"{i}.png", frozenset({i % 3})) for i in range(200)]
    splits = {seed: frozenset(assign_val(images, seed)) for seed in ("shapes/v1", "shapes/v2", "other/v1")}
    assert len(set(splits.values())) == 3
    assert frozenset(assign_val(images, "shapes/v1")) == splits["shapes/v1"]
    assert len(splits["shapes/v1"]) == 40  # VAL_PERCENT of 200


def test_annotations_follow_their_image_and_nothing_is_lost() -> None:
    doc = {"info": {"v": 1}, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
           "images": [{"id": i, "file_name": f"{i}.png"} for i in range(10)],
           "annotations": [{"id": 100 + i, "image_id": i, "category_id": 1 + i % 2} for i in range(10)]}
    train, val, record = derive_split(doc, "s/v", "annotations/train.json")
    assert train["info"] == val["info"] == doc["info"] and train["categories"] == val["categories"]
    for side in (train, val):
        ids = {im["id"] for im in side["images"]}
        assert all(a["image_id"] in ids for a in side["annotations"])
    assert sorted(im["id"] for im in train["images"] + val["images"]) == list(range(10))
    assert (record.train_images, record.val_images, record.unsplit_categories) == (8, 2, [])
    assert {a["category_id"] for a in val["annotations"]} == {1, 2}


def test_one_image_cannot_be_split() -> None:
    with pytest.raises(SplitError, match=r"annotations/train\.json: 1 image"):
        derive_split({"images": [{"id": 1, "file_name": "a.png"}], "annotations": []}, "s/v", "annotations/train.json")


def train_only(root: Path, *, images: int = 20, name_val: bool = False) -> Path:
    synth.generate(root, images=images, seed=3, size=64, name="shapes", version="v7")
    manifest = json.loads((root / "manifest.json").read_text())
    (root / manifest["val"]).unlink()
    if not name_val:
        del manifest["val"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_validation_records_the_split_that_training_and_evaluation_read(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds")
    report = validate_local(dataset)
    assert report.valid, report.describe()
    derived = report.derived_split
    assert derived is not None and derived.seed == "shapes/v7"
    assert f"val derived from annotations/train.json (seed shapes/v7): {derived.val_images} val" in report.describe()
    assert (report.splits["train"].images, report.splits["val"].images) == (derived.train_images, derived.val_images)
    version = open_dataset_version(dataset)  # what the trainer and the evaluation job call
    assert version.derived == derived
    val_names = sorted(im["file_name"] for im in json.loads(version.val_json.read_text())["images"])
    train_names = {im["file_name"] for im in json.loads(version.train_json.read_text())["images"]}
    assert len(val_names) == derived.val_images and train_names.isdisjoint(val_names)
    assert open_dataset_version(dataset).derived == derived  # a re-run gets the same split


def test_a_val_file_the_manifest_names_is_still_required(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds", name_val=True)
    report = validate_local(dataset, check_images=False)
    assert not report.valid and report.derived_split is None
    (issue,) = [i for i in report.errors if i.code is Code.MANIFEST_PATH_MISSING]
    assert "omit val from the manifest" in issue.message
    with pytest.raises(DatasetError, match="missing"):
        open_dataset_version(dataset)


def test_a_train_split_too_small_to_split_is_rejected_with_the_reason(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds")
    path = dataset / "annotations" / "train.json"
    doc = json.loads(path.read_text())
    keep = doc["images"][0]
    doc["images"], doc["annotations"] = [keep], [a for a in doc["annotations"] if a["image_id"] == keep["id"]]
    path.write_text(json.dumps(doc))
    report = validate_local(dataset, check_images=False)
    assert not report.valid
    assert any(i.code is Code.MANIFEST_PATH_MISSING and "none can be derived" in i.message and i.path == "val"
               for i in report.errors), report.describe()
    with pytest.raises(DatasetError, match="none can be derived"):
        open_dataset_version(dataset)
