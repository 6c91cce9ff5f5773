"""`d2ops diff A B` and d2ops_core.dataset_diff: two dataset directories with known changes, exact counts."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from d2ops.cli import main
from d2ops_core.dataset_diff import compare, directory_reader, index_version
from d2ops_core.documents.dataset_diff import DatasetDiff, DatasetDiffSummary
from d2ops_core.validation.split import derive_split

# file name -> (bytes, split, [(class, bbox), ...])
Images = dict[str, tuple[bytes, str, list[tuple[str, list[float]]]]]

VERSION_A: Images = {
    "a.jpg": (b"A" * 50, "train", [("cat", [1, 1, 10, 10])]),
    "b.jpg": (b"B" * 50, "train", [("dog", [2, 2, 5, 5]), ("dog", [20, 20, 5, 5])]),
    "c.jpg": (b"C" * 50, "train", [("cat", [3, 3, 8, 8])]),
    "d.jpg": (b"D" * 50, "train", [("cat", [4, 4, 8, 8])]),
    "e.jpg": (b"E" * 50, "val", [("cat", [5, 5, 8, 8])]),
    "f.jpg": (b"F" * 50, "train", [("dog", [6, 6, 8, 8])]),
    "i.jpg": (b"I" * 50, "val", [("cow", [7, 7, 8, 8])]),
}
VERSION_B: Images = {
    "a.jpg": (b"A" * 50, "train", [("cat", [1.0, 1.0, 10.0, 10.0000001])]),  # float noise: no change
    "b.jpg": (b"b" * 50, "train", [("dog", [20, 20, 5, 5]), ("dog", [2, 2, 5, 5])]),  # new bytes, boxes reordered
    "sub/c2.jpg": (b"C" * 50, "train", [("cat", [3, 3, 8, 8])]),  # c.jpg renamed
    "e.jpg": (b"E" * 50, "train", [("cat", [5, 5, 8, 8])]),  # moved val -> train
    "f.jpg": (b"F" * 50, "train", [("dog", [6, 9, 8, 8])]),  # box moved
    "g.jpg": (b"G" * 50, "val", [("bird", [1, 1, 2, 2])] * 3),  # added, a new class
}


def write_version(root: Path, images: Images, *, version: str, category_ids: dict[str, int] | None = None) -> Path:
    ids = category_ids or {"cat": 1, "dog": 2, "cow": 3, "bird": 4}
    (root / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        doc: dict[str, Any] = {"images": [], "annotations": [],
                               "categories": [{"id": i, "name": n} for n, i in ids.items()]}
        for number, (name, (data, side, boxes)) in enumerate(sorted(images.items()), 1):
            path = root / "images" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if side != split:
                continue
            doc["images"].append({"id": number, "file_name": name, "width": 64, "height": 64})
            for cls, bbox in boxes:
                doc["annotations"].append({"id": len(doc["annotations"]) + 1, "image_id": number,
                                           "category_id": ids[cls], "bbox": bbox, "area": bbox[2] * bbox[3],
                                           "iscrowd": 0})
        (root / "annotations" / f"{split}.json").write_text(json.dumps(doc))
    (root / "manifest.json").write_text(json.dumps({"name": "pets", "version": version, "format": "coco",
                                                    "train": "annotations/train.json"}))
    return root


@pytest.fixture
def versions(tmp_path: Path) -> tuple[Path, Path]:
    # B renumbers its categories: classes are compared by name, so that alone is no change.
    return (write_version(tmp_path / "a", VERSION_A, version="v1"),
            write_version(tmp_path / "b", VERSION_B, version="v2",
                          category_ids={"bird": 1, "cow": 2, "dog": 3, "cat": 9}))


def diff_of(a: Path, b: Path) -> DatasetDiff:
    def index(root: Path) -> Any:
        read, fingerprints = directory_reader(str(root))
        return index_version(str(root) + "/", "directory", read, fingerprints)

    return compare(index(a), index(b))


def test_known_changes_are_counted_exactly(versions: tuple[Path, Path]) -> None:
    diff = diff_of(*versions)
    c = diff.images
    assert (c.a, c.b) == (7, 6)
    assert (c.added, c.removed, c.renamed) == (1, 2, 1)  # g added; d and i removed; c -> sub/c2 renamed
    assert (c.content_changed, c.annotations_changed, c.split_moved) == (1, 1, 1)  # b; f's box; e
    assert c.unchanged == 1  # a (its box differs by float noise only)
    assert diff.changed_images_total == 7
    assert diff.same is False
    by_key = {ch.key: ch for ch in diff.changed_images}
    assert by_key["images/sub/c2.jpg"].changes == ["renamed"]
    assert by_key["images/sub/c2.jpg"].previous_key == "images/c.jpg"
    assert by_key["images/b.jpg"].changes == ["content"]  # reordered boxes are the same boxes
    assert by_key["images/f.jpg"].changes == ["annotations"]
    assert by_key["images/e.jpg"].changes == ["split"]
    assert (by_key["images/e.jpg"].split_a, by_key["images/e.jpg"].split_b) == ("val", "train")
    assert by_key["images/g.jpg"].class_deltas == {"bird": 3}
    assert by_key["images/i.jpg"].changes == ["removed"]
    assert diff.changed_images[0].key == "images/g.jpg"  # the most changed first (3 instances)


def test_classes_histogram_per_split_and_shift(versions: tuple[Path, Path]) -> None:
    classes = {k.name: k for k in diff_of(*versions).classes}
    assert classes["bird"].status == "new" and classes["bird"].relative_shift is None
    assert (classes["bird"].images_added, classes["bird"].instances_added) == (1, 3)
    assert classes["bird"].splits["val"].instances_b == 3
    assert classes["cow"].status == "vanished"
    assert (classes["cow"].images_removed, classes["cow"].instances_removed, classes["cow"].instances_b) == (1, 1, 0)
    cat = classes["cat"]
    assert cat.status == "changed"
    assert (cat.instances_a, cat.instances_b, cat.instances_delta) == (4, 3, -1)  # a c d e -> a c2 e
    assert cat.relative_shift == pytest.approx(-0.25)
    assert (cat.splits["train"].instances_a, cat.splits["train"].instances_b) == (3, 3)
    assert (cat.splits["val"].instances_a, cat.splits["val"].instances_b) == (1, 0)
    assert (cat.images_removed, cat.images_added) == (1, 0)
    dog = classes["dog"]
    assert dog.status == "changed" and dog.instances_delta == 0  # same count, one box moved
    assert (dog.images_changed, dog.instances_added, dog.instances_removed) == (1, 0, 0)
    assert [k.name for k in diff_of(*versions).classes][:2] == ["bird", "cow"]  # new/vanished first


def test_same_version_is_same(versions: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = versions
    copy = write_version(tmp_path / "copy", VERSION_A, version="v1")
    diff = diff_of(a, copy)
    assert diff.same is True
    assert diff.images.unchanged == 7 and diff.changed_images_total == 0
    assert all(k.status == "unchanged" for k in diff.classes)
    assert DatasetDiffSummary.of(diff).line() == "same data as the champion's (pets/v1)"


def test_summary_counts_and_line(versions: tuple[Path, Path]) -> None:
    summary = DatasetDiffSummary.of(diff_of(*versions), uri="s3://x/runs/r/dataset-diff.json", champion_run_id="c")
    assert (summary.added, summary.removed, summary.renamed, summary.instances_delta) == (1, 2, 1, 1)
    assert summary.classes_new == ["bird"] and summary.classes_vanished == ["cow"]
    assert summary.line() == ("vs champion's pets/v1: +1 -2 images; 1 renamed; 1 changed bytes; 1 relabelled; "
                              "1 moved train<->val; instances +1; new classes bird; vanished classes cow")
    assert len(summary.model_dump_json()) < 2000  # travels in the state


def test_cli_text_exit_codes_and_json(versions: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = versions
    assert main(["diff", str(a), str(a)]) == 0
    assert "same: no image" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "images: +1 added, -2 removed, 1 renamed, 1 changed bytes, 1 relabelled, 1 moved train<->val" in out
    assert " bird | new" in out and "images/c.jpg -> images/sub/c2.jpg" in out
    assert " dog  | changed       3 -> 3      (  +0%) train 3->3 | val 0->0  (1 images relabelled)" in out
    assert main(["diff", str(a), str(b), "--json"]) == 1
    doc = DatasetDiff.model_validate_json(capsys.readouterr().out)
    assert doc.images.renamed == 1


def test_derived_val_split_is_the_pipelines(tmp_path: Path) -> None:
    """A manifest naming no val and shipping no val.json: the diff derives val as the pipeline does, keyed on
    the dataset name and each image's bytes (d2ops_core.validation.split); the histogram follows."""
    images: Images = {f"{n}.jpg": (bytes([n]) * 10, "train", [("cat", [1, 1, 2, 2])]) for n in range(30)}
    a = write_version(tmp_path / "a", images, version="v1")
    (a / "annotations/val.json").unlink()
    diff = diff_of(a, a)
    assert diff.a.val_derived is True
    read, fingerprints = directory_reader(str(a))
    index = index_version(str(a), "directory", read, fingerprints)
    hashes = {name: hashlib.sha256(data).hexdigest() for name, (data, _, _) in images.items()}
    _, val_doc, _ = derive_split(json.loads((a / "annotations/train.json").read_text()), "pets", "train", hashes)
    val = {"images/" + im["file_name"] for im in val_doc["images"]}
    assert val and {r.key for r in index.images if r.split == "val"} == val
    cat = next(k for k in diff.classes if k.name == "cat")
    assert (cat.splits["val"].instances_a, cat.splits["train"].instances_a) == (len(val), 30 - len(val))
    assert (cat.splits["val"].images_a, cat.splits["train"].images_a) == (len(val), 30 - len(val))


def test_an_image_the_champion_trained_on_moved_to_val_is_a_warning(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """train -> val (the champion would be scored on its own training image) is counted and named apart from
    val -> train, in the document, the run's summary line, `d2ops status` and `d2ops diff`."""
    from d2ops.commands.status import format_run

    moved = {**VERSION_A, "c.jpg": (b"C" * 50, "val", [("cat", [3, 3, 8, 8])]),
             "a.jpg": (b"A" * 50, "val", [("cat", [1, 1, 10, 10])])}
    a = write_version(tmp_path / "a", VERSION_A, version="v1")
    b = write_version(tmp_path / "b", {**moved, "d.jpg": (b"D" * 50, "train", [("cat", [4, 4, 8, 8])]),
                                       "e.jpg": (b"E" * 50, "train", [("cat", [5, 5, 8, 8])])}, version="v2")
    diff = diff_of(a, b)
    assert (diff.images.split_moved, diff.images.train_to_val) == (3, 2)  # e went val -> train: not counted
    assert diff.train_to_val_examples == ["images/a.jpg", "images/c.jpg"]
    summary = DatasetDiffSummary.of(diff, uri="s3://art/runs/r/dataset-diff.json")
    assert "3 moved train<->val; 2 of them from the champion's train to val" in summary.line()
    assert summary.warning() == ("2 val image(s) of this run are in the champion's training split (pets/v1), e.g. "
                                 "images/a.jpg, images/c.jpg: the comparison leaves them out")
    lines = format_run({"run_id": "r", "status": "RUNNING", "timeline": [],
                        "dataset_diff": summary.model_dump(mode="json")})
    assert f"  data      WARNING: {summary.warning()}" in lines
    assert DatasetDiffSummary.of(diff_of(a, a)).warning() is None
    assert main(["diff", str(a), str(b)]) == 1
    assert ("warning: 2 images in A's train are in B's val (a model trained on A would be scored on them; the "
            "pipeline's comparison leaves them out): images/a.jpg, images/c.jpg") in capsys.readouterr().out


@pytest.mark.parametrize(("damage", "message"), [
    (lambda root: (root / "manifest.json").unlink(), "no manifest.json (not a dataset version)"),
    (lambda root: (root / "manifest.json").write_text("{"), "manifest.json: manifest is not valid JSON"),
    (lambda root: (root / "annotations/train.json").write_text('{"images": [{"id": 1'),
     "annotations/train.json: unreadable JSON"),
    (lambda root: (root / "annotations/train.json").write_text('{"images": 3}'),
     "annotations/train.json: not a COCO instances file"),
    (lambda root: (root / "annotations/train.json").unlink(), "annotations/train.json: missing"),
])
def test_bad_input_is_one_line_exit_2(versions: tuple[Path, Path], damage: Any, message: str) -> None:
    a, b = versions
    damage(b)
    proc = subprocess.run([sys.executable, "-m", "d2ops", "diff", str(a), str(b)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and str(b) in proc.stderr, proc.stderr


def test_not_a_directory_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert "nowhere: does not exist" in capsys.readouterr().err


# ----- S3 (moto) ---------------------------------------------------------------------------------


def upload(s3: Any, bucket: str, prefix: str, root: Path) -> list[Any]:
    """Upload a version directory; returns its inventory entries (as validation records them)."""
    import hashlib

    from d2ops_core.validation.inventory import InventoryEntry

    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = path.relative_to(root).as_posix()
        data = path.read_bytes()
        put = s3.put_object(Bucket=bucket, Key=prefix + key, Body=data)
        entries.append(InventoryEntry(key=key, version_id=put.get("VersionId"), etag=put["ETag"].strip('"'),
                                      size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    return entries


@pytest.fixture
def s3_versions(versions: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Any:
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        import boto3

        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="data")
        s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
        s3.create_bucket(Bucket="artifacts")
        a, b = versions
        yield s3, upload(s3, "data", "datasets/pets/v1/", a), upload(s3, "data", "datasets/pets/v2/", b)


def test_s3_prefixes_give_the_directories_counts(s3_versions: Any, versions: tuple[Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "s3://data/datasets/pets/v1/", "s3://data/datasets/pets/v2/", "--json"]) == 1
    from_s3 = DatasetDiff.model_validate_json(capsys.readouterr().out)
    local = diff_of(*versions)
    assert from_s3.images == local.images
    assert from_s3.classes == local.classes
    assert from_s3.a.uri == "s3://data/datasets/pets/v1/"
    assert main(["diff", "s3://data/datasets/pets/v1/", "s3://data/datasets/pets/v1"]) == 0
    capsys.readouterr()
    assert main(["diff", "s3://data/datasets/pets/v1/", "s3://data/datasets/none/"]) == 2
    assert capsys.readouterr().err == "d2ops diff: s3://data/datasets/none/: no manifest.json (not a dataset version)\n"
    assert main(["diff", "s3://data/datasets/pets/v1/", "s3://no-such-bucket/v1/"]) == 2
    assert capsys.readouterr().err == "d2ops diff: s3://no-such-bucket/v1/manifest.json: NoSuchBucket\n"


def snapshot_run(s3: Any, run_id: str, prefix: str, entries: list[Any], *, artifacts: str = "artifacts",
                 data: str = "data") -> None:
    """What validation leaves for a run: its inventory and its snapshot (the files the diff reads)."""
    from d2ops_core import s3_layout
    from d2ops_core.validation.inventory import inventory_bytes

    s3.put_object(Bucket=artifacts, Key=s3_layout.inventory_key(run_id), Body=inventory_bytes(entries))
    for entry in entries:
        if entry.key.endswith(".json"):  # images: the inventory's sha256 is all the diff needs of them
            s3.copy_object(Bucket=artifacts, Key=s3_layout.snapshot_prefix(run_id) + entry.key,
                           CopySource={"Bucket": data, "Key": prefix + entry.key, "VersionId": entry.version_id})


def test_runs_read_from_inventory_and_snapshot_and_fall_back_to_pinned_versions(
        s3_versions: Any, versions: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from d2ops_core import s3_layout
    from d2ops_core.dataset_diff_s3 import index_run

    s3, entries_a, entries_b = s3_versions
    snapshot_run(s3, "champ", "datasets/pets/v1/", entries_a)
    snapshot_run(s3, "new", "datasets/pets/v2/", entries_b)
    local = diff_of(*versions)
    assert main(["diff", "s3://artifacts/runs/champ/", "s3://artifacts/runs/new/", "--json"]) == 1
    from_runs = DatasetDiff.model_validate_json(capsys.readouterr().out)
    assert from_runs.images == local.images and from_runs.classes == local.classes
    assert from_runs.a.source == "run snapshot" and from_runs.a.run_id == "champ"
    assert from_runs.a.inventory_digest and from_runs.a.inventory_digest.startswith("sha256:")

    # The champion's snapshot expired and its train.json was overwritten since: the pinned version is read.
    for entry in entries_a:
        s3.delete_object(Bucket="artifacts", Key=s3_layout.snapshot_prefix("champ") + entry.key)
    s3.put_object(Bucket="data", Key="datasets/pets/v1/annotations/train.json", Body=b'{"images": []}')
    index = index_run(s3, "artifacts", "champ", dataset_bucket="data", dataset_prefix="datasets/pets/v1/")
    assert index.side.source == "dataset prefix (pinned by the run's inventory)"
    assert "snapshot has expired" in index.notes[0]
    assert index.side.images == 7 and index.side.instances == 8

    # A run older than inventories: its dataset prefix as it is now, said so.
    old = index_run(s3, "artifacts", "older", dataset_bucket="data", dataset_prefix="datasets/pets/v2/")
    assert old.side.source == "dataset prefix (no inventory)" and "has no inventory" in old.notes[0]


def test_d2ops_status_shows_the_diff_in_one_line(versions: tuple[Path, Path]) -> None:
    from d2ops.commands.status import format_run

    summary = DatasetDiffSummary.of(diff_of(*versions), uri="s3://art/runs/r/dataset-diff.json")
    lines = format_run({"run_id": "r", "status": "FAILED", "timeline": [],
                        "dataset_diff": summary.model_dump(mode="json")})
    [line] = [line for line in lines if line.startswith("  data ")]
    assert line == f"  data      {summary.line()} (s3://art/runs/r/dataset-diff.json)"
    failed = format_run({"run_id": "r", "status": "RUNNING", "timeline": [],
                         "dataset_diff": {"error": "DiffTimeout: the diff ran past its time budget"}})
    assert "  data      data diff not computed: DiffTimeout: the diff ran past its time budget" in failed
