"""The derived val split (d2ops_core.validation.split): keyed on the dataset name and each image's content, so an
image keeps its side in every version; the validator, the trainer/evaluation side and the dataset diff agree."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2ops import synth
from d2ops_core.dataset_diff import compare, directory_reader, index_version
from d2ops_core.validation import Code, validate_local
from d2ops_core.validation.split import VAL_PERCENT, SplitError, assign_val, derive_split, draws_val
from model_code.dataset_version import DatasetError, open_dataset_version, read_coco

FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None)
NAME = "shapes"


def sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


# Contents as the split sees them: hex SHA-256s of distinct images (small sets included: the tiny-set rules).
CONTENTS = st.lists(st.integers(0, 10**9), min_size=2, max_size=60, unique=True).map(lambda ns: [sha(n) for n in ns])


def sides(contents: list[str], name: str = NAME) -> tuple[set[str], set[str]] | None:
    """(train, val) contents, or None when the set cannot be split."""
    try:
        val = {contents[i] for i in assign_val(contents, name)}
    except SplitError:
        return None
    return set(contents) - val, val


def first(n: int, *, val: bool, name: str = NAME, start: int = 0) -> list[str]:
    """The first ``n`` contents (by counter) that draw val (or train) for ``name``."""
    out, i = [], start
    while len(out) < n:
        if draws_val(name, sha(i)) == val:
            out.append(sha(i))
        i += 1
    return out


@FAST
@given(CONTENTS)
def test_an_image_is_val_exactly_when_its_own_draw_says_so(contents: list[str]) -> None:
    """Per image, no quota: a stratification or target-size step that moves images would fail this."""
    split = sides(contents)
    drawn = {c for c in contents if draws_val(NAME, c)}
    if len(drawn) == len(contents):
        assert split is None  # never all val: refused, not forced (a forced train image would return to val)
        return
    assert split is not None
    train, val = split
    assert train and val and train.isdisjoint(val)
    assert val == (drawn or {min(contents, key=lambda c: hashlib.sha256(f"{NAME}\0{c}".encode()).digest())})


@FAST
@given(CONTENTS, CONTENTS)
def test_a_growing_dataset_never_moves_a_train_image_to_val(v1: list[str], added: list[str]) -> None:
    """v2 = v1 + new images: every v1 train image is train in v2; a v1 val image leaves val only when it was
    held for val (no v1 image drew val) and v2 has one that does."""
    before, after = sides(v1), sides(list(dict.fromkeys(v1 + added)))
    if before is None or after is None:
        return
    assert before[0].isdisjoint(after[1])
    for content in before[1] - after[1]:
        assert not draws_val(NAME, content)


@FAST
@given(CONTENTS, st.data())
def test_removing_images_moves_a_train_image_to_val_only_when_no_image_is_left_that_draws_val(
        v1: list[str], data: st.DataObject) -> None:
    v2 = data.draw(st.lists(st.sampled_from(v1), min_size=2, unique=True))
    before, after = sides(v1), sides(v2)
    if before is None or after is None:
        return
    moved = before[0] & after[1]
    if moved:
        assert not any(draws_val(NAME, c) for c in v2) and len(moved) == 1


@FAST
@given(CONTENTS, st.randoms(use_true_random=False))
def test_the_split_does_not_depend_on_the_order_or_on_duplicates(contents: list[str], rnd: Any) -> None:
    doubled = contents + contents[: len(contents) // 2]
    rnd.shuffle(doubled)
    assert sides(doubled) == sides(contents)
    if sides(contents) is not None:
        val = assign_val(doubled, NAME)
        for i, c in enumerate(doubled):  # the same bytes are on the same side: no train/val overlap
            assert (i in val) == all(j in val for j, d in enumerate(doubled) if d == c)


def test_the_dataset_name_keys_the_split_and_the_share_is_val_percent_on_average() -> None:
    contents = [sha(i) for i in range(4000)]
    a, b = set(assign_val(contents, "shapes")), set(assign_val(contents, "other"))
    assert a != b
    assert abs(len(a) / len(contents) - VAL_PERCENT / 100) < 0.02  # 4,000 draws: s.d. 0.6 points


def test_tiny_sets_hold_one_image_for_val_and_refuse_all_val() -> None:
    train_only = first(3, val=False)
    val = assign_val(train_only, NAME)  # nothing drew val: the lowest draw is held for val
    assert len(val) == 1
    with pytest.raises(SplitError, match="all 2 distinct images drew val"):
        assign_val(first(2, val=True), NAME)
    with pytest.raises(SplitError, match="1 distinct content"):
        assign_val([sha(1), sha(1)], NAME)
    with pytest.raises(SplitError, match="not a lowercase hex SHA-256"):
        assign_val(["a.png", sha(1)], NAME)


def document(n: int) -> tuple[dict[str, Any], dict[str, str]]:
    doc = {"info": {"v": 1}, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
           "images": [{"id": i, "file_name": f"{i}.png"} for i in range(n)],
           "annotations": [{"id": 100 + i, "image_id": i, "category_id": 1 + i % 2} for i in range(n)]}
    return doc, {f"{i}.png": sha(i) for i in range(n)}


def test_annotations_follow_their_image_and_nothing_is_lost() -> None:
    doc, hashes = document(30)
    train, val, record = derive_split(doc, NAME, "annotations/train.json", hashes)
    assert train["info"] == val["info"] == doc["info"] and train["categories"] == val["categories"]
    for side in (train, val):
        ids = {im["id"] for im in side["images"]}
        assert all(a["image_id"] in ids for a in side["annotations"])
    assert sorted(im["id"] for im in train["images"] + val["images"]) == list(range(30))
    expected_val = sorted(f"{i}.png" for i in range(30) if draws_val(NAME, sha(i)))
    assert sorted(im["file_name"] for im in val["images"]) == expected_val
    assert (record.keyed_on, record.val_images) == (NAME, len(expected_val))
    assert record.train_images == 30 - len(expected_val)
    assert record.val_digest == hashlib.sha256("\n".join(expected_val).encode()).hexdigest()
    assert record.held_for_val is None


def test_a_renamed_file_keeps_its_side_and_identical_bytes_share_one() -> None:
    doc, hashes = document(30)
    _, val, _ = derive_split(doc, NAME, "t", hashes)
    renamed = {("renamed-" + k if k == "3.png" else k): v for k, v in hashes.items()}
    doc2 = json.loads(json.dumps(doc))
    doc2["images"][3]["file_name"] = "renamed-3.png"
    doc2["images"].append({"id": 99, "file_name": "copy-of-3.png"})  # the same bytes again
    renamed["copy-of-3.png"] = sha(3)
    _, val2, _ = derive_split(doc2, NAME, "t", renamed)
    names = {im["file_name"] for im in val2["images"]}
    was_val = "3.png" in {im["file_name"] for im in val["images"]}
    assert ("renamed-3.png" in names) == ("copy-of-3.png" in names) == was_val


def test_an_image_without_a_content_hash_is_named() -> None:
    doc, hashes = document(5)
    del hashes["2.png"]
    with pytest.raises(SplitError, match=r"annotations/train\.json: no content hash for '2\.png'"):
        derive_split(doc, NAME, "annotations/train.json", hashes)


def test_classes_left_on_one_side_are_listed() -> None:
    doc, hashes = document(30)
    val_image = next(i for i in range(30) if draws_val(NAME, sha(i)))
    train_image = next(i for i in range(30) if not draws_val(NAME, sha(i)))
    doc["categories"] += [{"id": 7, "name": "only-val"}, {"id": 8, "name": "only-train"}]
    doc["annotations"] += [{"id": 1000, "image_id": val_image, "category_id": 7},
                           {"id": 1001, "image_id": train_image, "category_id": 8}]
    _, _, record = derive_split(doc, NAME, "t", hashes)
    assert (record.val_only_categories, record.unsplit_categories) == ([7], [8])


# ----- through the validator, the trainer's side (model_code.dataset_version) and the dataset diff --------------


def train_only(root: Path, *, images: int = 40, seed: int = 3, version: str = "v1") -> Path:
    """A synth version with every image in train.json and no val (val is derived)."""
    synth.generate(root, images=images, seed=seed, size=48, name=NAME, version=version)
    train, val = (json.loads((root / f"annotations/{s}.json").read_text()) for s in ("train", "val"))
    train["images"] += val["images"]
    train["annotations"] += val["annotations"]
    (root / "annotations/train.json").write_text(json.dumps(train))
    (root / "annotations/val.json").unlink()
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["val"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def next_version(v1: Path, root: Path, *, version: str, add: int = 0, remove: int = 0, rename: int = 0,
                 seed: int = 11) -> Path:
    """A copy of ``v1`` as ``version``: ``add`` new images, the first ``remove`` removed, the next ``rename``
    renamed (same bytes)."""
    shutil.copytree(v1, root)
    train = json.loads((root / "annotations/train.json").read_text())
    for im in train["images"][:remove]:
        (root / "images" / im["file_name"]).unlink()
    gone = {im["id"] for im in train["images"][:remove]}
    train["images"] = train["images"][remove:]
    train["annotations"] = [a for a in train["annotations"] if a["image_id"] not in gone]
    for im in train["images"][:rename]:
        new = "renamed/" + im["file_name"].replace("/", "-")
        (root / "images/renamed").mkdir(exist_ok=True)
        (root / "images" / im["file_name"]).rename(root / "images" / new)
        im["file_name"] = new
    if add:
        extra = train_only(root.parent / f"{root.name}-extra", images=add, seed=seed)
        more = json.loads((extra / "annotations/train.json").read_text())
        ids = max(im["id"] for im in train["images"]) + 1000
        anns = max(a["id"] for a in train["annotations"]) + 100000
        for im in more["images"]:
            new = "new/" + im["file_name"].replace("/", "-")
            (root / "images/new").mkdir(exist_ok=True)
            shutil.copyfile(extra / "images" / im["file_name"], root / "images" / new)
            train["images"].append({**im, "id": im["id"] + ids, "file_name": new})
        train["annotations"] += [{**a, "id": a["id"] + anns, "image_id": a["image_id"] + ids}
                                 for a in more["annotations"]]
    (root / "annotations/train.json").write_text(json.dumps(train))
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "version": version}))
    return root


def trainer_sides(root: Path) -> tuple[set[str], set[str], list[str]]:
    """(train contents, val contents, sorted val file_names) as the training and evaluation jobs read them."""
    version = open_dataset_version(root)
    out = []
    for path in (version.train_json, version.val_json):
        names = [im["file_name"] for im in read_coco(path)["images"]]
        out.append({hashlib.sha256((version.images_dir / n).read_bytes()).hexdigest() for n in names})
    val_names = sorted(im["file_name"] for im in read_coco(version.val_json)["images"])
    return out[0], out[1], val_names


def diff_index(root: Path) -> Any:
    read, fingerprints = directory_reader(str(root))
    return index_version(str(root) + "/", "directory", read, fingerprints)


def test_no_image_the_champion_trained_on_is_in_the_next_versions_val(tmp_path: Path) -> None:
    """v1 -> v2 (+ new images, some removed, some renamed, another version string): every v1 train image stays
    train, in the validator's report, the trainer's split and the dataset diff alike.

    Catches the split seeded by the version again (72 % of v2's val was v1's train), keyed on file names (a
    rename would move), or any one of the three deriving it differently.
    """
    v1 = train_only(tmp_path / "v1", images=60)
    v2 = next_version(v1, tmp_path / "v2", version="v2", add=20, remove=5, rename=6)
    train1, val1, _ = trainer_sides(v1)
    train2, val2, val_names2 = trainer_sides(v2)
    assert val1 and val2 and not train1 & val2  # nothing v1 trained on is scored in v2
    assert all(not draws_val(NAME, c) for c in val1 & train2)  # only an image held for val can return to train
    report = validate_local(v2)
    assert report.valid, report.describe()
    derived = report.derived_split
    assert derived is not None and derived.keyed_on == NAME
    assert derived.val_digest == hashlib.sha256("\n".join(val_names2).encode()).hexdigest()
    assert (report.splits["val"].images, report.splits["train"].images) == (len(val_names2), 75 - len(val_names2))
    diff = compare(diff_index(v1), diff_index(v2))
    assert diff.images.train_to_val == 0 and diff.images.split_moved == 0 and diff.images.renamed == 6
    index = diff_index(v2)
    assert sorted(r.key for r in index.images if r.split == "val") == ["images/" + n for n in val_names2]


def test_a_val_file_that_takes_a_champion_training_image_is_counted_by_the_diff(tmp_path: Path) -> None:
    v1 = train_only(tmp_path / "v1", images=40)
    v2 = next_version(v1, tmp_path / "v2", version="v2")
    doc = json.loads((v2 / "annotations/train.json").read_text())
    version1 = open_dataset_version(v1)
    trained = [im for im in read_coco(version1.train_json)["images"]][:3]
    moved_ids = {im["id"] for im in trained}
    val = {**doc, "images": [im for im in doc["images"] if im["id"] in moved_ids],
           "annotations": [a for a in doc["annotations"] if a["image_id"] in moved_ids]}
    doc["images"] = [im for im in doc["images"] if im["id"] not in moved_ids]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] not in moved_ids]
    (v2 / "annotations/train.json").write_text(json.dumps(doc))
    (v2 / "annotations/val.json").write_text(json.dumps(val))
    diff = compare(diff_index(v1), diff_index(v2))
    assert diff.images.train_to_val == 3 and diff.images.split_moved >= 3
    assert diff.train_to_val_examples == sorted("images/" + im["file_name"] for im in trained)


def test_the_validator_derives_the_split_the_trainer_reads_and_records_it(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds", images=20)
    report = validate_local(dataset)
    assert report.valid, report.describe()
    derived = report.derived_split
    assert derived is not None and not report.derived_split_pending
    assert f"val derived from annotations/train.json (keyed on 'shapes' and each image's content): " \
           f"{derived.val_images} val" in report.describe()
    version = open_dataset_version(dataset)
    assert version.derived == derived and open_dataset_version(dataset).derived == derived  # a re-run: the same
    assert version.image_sha256 is not None and len(version.image_sha256) == 20


def test_the_derived_split_files_do_not_outlive_the_job_that_read_them(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds", images=20)
    job = "from model_code.dataset_version import open_dataset_version as o; import sys; " \
          "v = o(sys.argv[1]); print(v.val_json); assert v.val_json.is_file()"
    done = subprocess.run([sys.executable, "-c", job, str(dataset)], capture_output=True, text=True, check=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    val_json = Path(done.stdout.strip())
    assert val_json.is_relative_to(tmp_path) and not val_json.parent.exists()


def test_without_reading_images_the_split_is_pending(tmp_path: Path) -> None:
    report = validate_local(train_only(tmp_path / "ds", images=20), check_images=False)
    assert report.valid and report.derived_split is None and report.derived_split_pending
    assert "val to be derived from train once the images are read" in report.describe()


def test_a_class_whose_images_all_drew_val_is_a_warning_not_a_rejection(tmp_path: Path) -> None:
    """No stratification moves an image to train for it (that image would go back to val as the class grows);
    the uploader is told the model cannot learn it."""
    dataset = train_only(tmp_path / "ds", images=30)
    path = dataset / "annotations/train.json"
    doc = json.loads(path.read_text())
    version = open_dataset_version(dataset)
    assert version.image_sha256 is not None
    lone = next(im for im in doc["images"] if draws_val(NAME, version.image_sha256[im["file_name"]]))
    doc["categories"].append({"id": 9, "name": "rare"})
    doc["annotations"].append({"id": 10**6, "image_id": lone["id"], "category_id": 9, "bbox": [1, 1, 10, 10],
                               "area": 100, "iscrowd": 0})
    path.write_text(json.dumps(doc))
    report = validate_local(dataset)
    assert report.valid, report.describe()
    assert report.derived_split is not None and report.derived_split.val_only_categories == [9]
    assert not report.has(Code.CATEGORY_NOT_IN_TRAIN)
    assert any(i.code is Code.CLASS_FEW_INSTANCES and "'rare'" in i.message and "drew val" in i.message
               for i in report.warnings)


def test_a_val_file_the_manifest_names_is_still_required(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds", images=20)
    manifest = json.loads((dataset / "manifest.json").read_text())
    (dataset / "manifest.json").write_text(json.dumps({**manifest, "val": "annotations/val.json"}))
    report = validate_local(dataset, check_images=False)
    assert not report.valid and report.derived_split is None
    (issue,) = [i for i in report.errors if i.code is Code.MANIFEST_PATH_MISSING]
    assert "omit val from the manifest" in issue.message
    with pytest.raises(DatasetError, match="missing"):
        open_dataset_version(dataset)


@pytest.mark.parametrize("check_images", [True, False])
def test_a_train_split_too_small_to_split_is_rejected_with_the_reason(tmp_path: Path, check_images: bool) -> None:
    dataset = train_only(tmp_path / "ds", images=20)
    path = dataset / "annotations" / "train.json"
    doc = json.loads(path.read_text())
    keep = doc["images"][0]
    doc["images"], doc["annotations"] = [keep], [a for a in doc["annotations"] if a["image_id"] == keep["id"]]
    path.write_text(json.dumps(doc))
    report = validate_local(dataset, check_images=check_images)
    assert not report.valid
    assert any(i.code is Code.MANIFEST_PATH_MISSING and "none can be derived" in i.message and i.path == "val"
               for i in report.errors), report.describe()
    with pytest.raises(DatasetError, match="none can be derived"):
        open_dataset_version(dataset)


def test_two_images_that_both_draw_val_are_refused_by_the_validator_and_the_trainer(tmp_path: Path) -> None:
    dataset = train_only(tmp_path / "ds", images=20)
    version = open_dataset_version(dataset)
    assert version.image_sha256 is not None
    path = dataset / "annotations" / "train.json"
    doc = json.loads(path.read_text())
    keep = [im for im in doc["images"] if draws_val(NAME, version.image_sha256[im["file_name"]])][:2]
    assert len(keep) == 2  # synth's images are fixed by its seed
    ids = {im["id"] for im in keep}
    doc["images"], doc["annotations"] = keep, [a for a in doc["annotations"] if a["image_id"] in ids]
    path.write_text(json.dumps(doc))
    report = validate_local(dataset)
    assert any(i.code is Code.MANIFEST_PATH_MISSING and "drew val" in i.message for i in report.errors)
    with pytest.raises(DatasetError, match="drew val"):
        open_dataset_version(dataset)

