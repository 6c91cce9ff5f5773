"""Label Studio results -> COCO boxes, annotator agreement, and the new dataset version's writer (no server here:
tests/integration/test_label_studio.py runs the round trip against a real Label Studio)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from PIL import Image

from d2ops import synth
from d2ops.labelling.documents import SELECTION_FILE, SelectionError, read_selection
from d2ops.labelling.labelstudio import (
    Box,
    BoxControl,
    LabelledImage,
    LabellingError,
    boxes_of,
    check_project_classes,
    disagreement,
)
from d2ops.labelling.new_version import (
    InvalidVersion,
    next_version,
    open_base,
    upload_version,
    write_version,
)
from d2ops_core.validation.split import draws_val

CONTROL = BoxControl(from_name="label", to_name="image", data_key="image")
CLASSES = ["square", "disc", "triangle"]


def rect(x: float, y: float, w: float, h: float, label: str = "disc", **extra: Any) -> dict[str, Any]:
    value = {"x": x, "y": y, "width": w, "height": h, "rotation": 0, "rectanglelabels": [label], **extra}
    return {"from_name": "label", "to_name": "image", "type": "rectanglelabels", "original_width": 200,
            "original_height": 100, "value": value}


def test_boxes_are_percent_of_the_upright_image_converted_to_pixels() -> None:
    # catches: percent taken as pixels, x scaled by the height, or boxes not clipped to the image
    boxes = boxes_of([rect(10, 20, 25, 50), rect(90, 90, 20, 20, "square")], CONTROL, CLASSES, 200, 100, "t")
    assert boxes == (Box("disc", (20.0, 20.0, 50.0, 50.0)), Box("square", (180.0, 90.0, 20.0, 10.0)))


def test_regions_of_other_controls_are_ignored_but_a_polygon_is_refused_naming_the_task() -> None:
    comment = {"from_name": "notes", "to_name": "image", "type": "textarea", "value": {"text": ["blurry"]}}
    assert boxes_of([comment], CONTROL, CLASSES, 200, 100, "t") == ()
    polygon = {"from_name": "poly", "to_name": "image", "type": "polygonlabels",
               "value": {"points": [[1, 1], [5, 1], [1, 5]], "polygonlabels": ["disc"]}}
    with pytest.raises(LabellingError, match="task 7 annotation 3: a polygonlabels region where a box"):
        boxes_of([polygon], CONTROL, CLASSES, 200, 100, "task 7 annotation 3")


@pytest.mark.parametrize(("region", "message"), [
    (rect(1, 1, 5, 5, rotation=30), "rotated by 30"),
    (rect(1, 1, 5, 5, "car"), r"labelled \['car'\], not one of"),
    ({**rect(1, 1, 5, 5), "original_width": 100, "original_height": 200}, "drawn on a 100x200 image"),
    (rect(100, 1, 5, 5), "no size inside the image"),
])
def test_boxes_that_cannot_be_coco_are_refused(region: dict[str, Any], message: str) -> None:
    with pytest.raises(LabellingError, match=message):
        boxes_of([region], CONTROL, CLASSES, 200, 100, "task 1")


def test_annotators_agree_on_matching_boxes_and_disagree_on_count_or_class() -> None:
    a = [Box("disc", (10, 10, 40, 40)), Box("square", (60, 10, 20, 20))]
    assert disagreement(a, [Box("square", (61, 10, 20, 20)), Box("disc", (12, 10, 40, 40))]) is None
    assert disagreement(a, a[:1]) == "2 boxes vs 1"  # catches: a missed box counted as agreement
    assert disagreement(a, [Box("square", (10, 10, 40, 40)), a[1]]) is not None  # same place, other class
    assert disagreement(a, [Box("disc", (30, 30, 40, 40)), a[1]]) is not None  # IoU 0.22 < 0.5


def test_project_labels_must_be_exactly_the_dataset_classes() -> None:
    parsed = {"label": {"type": "RectangleLabels", "to_name": ["image"], "inputs": [{"value": "image"}],
                        "labels": ["square", "disc"]}}
    with pytest.raises(LabellingError, match=r"missing \['triangle'\], not a dataset class \[\]"):
        check_project_classes("p", parsed, CLASSES)
    with pytest.raises(LabellingError, match="PolygonLabels 'poly'; d2ops needs exactly one RectangleLabels"):
        check_project_classes("p", {"poly": {"type": "PolygonLabels", "labels": CLASSES}}, CLASSES)
    parsed["label"]["labels"] = ["triangle", "disc", "square"]
    assert check_project_classes("p", parsed, CLASSES) == CONTROL


def test_next_version_counts_up() -> None:
    assert [next_version(v) for v in ("v1", "v09", "2024-07", "data")] == ["v2", "v10", "2024-08", "data-2"]


def _labelled(count: int, seed: int, size: int = 64) -> list[LabelledImage]:
    out = []
    for i in range(count):
        buf = io.BytesIO()
        Image.new("RGB", (size, size), (seed * 40 % 256, i * 50 % 256, 90)).save(buf, "PNG")
        data = buf.getvalue()
        out.append(LabelledImage(task_id=i + 1, sha256=hashlib.sha256(data).hexdigest(), data=data, extension="png",
                                 width=size, height=size, boxes=(Box("disc", (4.0, 4.0, 20.0, 20.0)),),
                                 annotation_id=i + 1))
    return out


def test_a_base_with_a_derived_split_gets_new_images_in_train_and_the_pipeline_draws_their_side(
        tmp_path: Path) -> None:
    base = tmp_path / "v1"
    synth.generate(base, images=16, seed=1, size=64)
    train = json.loads((base / "annotations" / "train.json").read_text())
    val = json.loads((base / "annotations" / "val.json").read_text())
    train["images"] += val["images"]
    train["annotations"] += val["annotations"]
    (base / "annotations" / "train.json").write_text(json.dumps(train))
    (base / "annotations" / "val.json").unlink()
    manifest = json.loads((base / "manifest.json").read_text())
    del manifest["val"]
    (base / "manifest.json").write_text(json.dumps(manifest))
    written = write_version(open_base(base), _labelled(6, seed=2), tmp_path / "v2", version="v2")
    assert written.report is not None and written.report.valid, written.report and written.report.describe()
    assert not (tmp_path / "v2" / "annotations" / "val.json").exists()  # catches: a derived split frozen into a file
    doc = json.loads((tmp_path / "v2" / "annotations" / "train.json").read_text())
    assert len(doc["images"]) == 16 + 6 and written.added_train == 6
    assert len({im["id"] for im in doc["images"]}) == 22  # catches: new ids colliding with the base's
    assert written.report.derived_split is not None


def test_a_base_with_a_val_file_gets_each_new_image_on_its_content_drawn_side(tmp_path: Path) -> None:
    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    labelled = _labelled(12, seed=3)
    expect_val = {x.sha256 for x in labelled if draws_val("shapes", x.sha256)}
    assert 0 < len(expect_val) < 12  # both sides exercised
    written = write_version(open_base(base), labelled, tmp_path / "v2", version="v2")
    val = json.loads((tmp_path / "v2" / "annotations" / "val.json").read_text())
    got_val = {im["file_name"].split("/")[-1].split(".")[0] for im in val["images"]
               if im["file_name"].startswith("labelled/")}
    assert got_val == expect_val and written.added_val == len(expect_val)  # catches: any other split rule


def test_an_image_the_base_already_has_is_not_added_twice(tmp_path: Path) -> None:
    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    data = (base / "images" / "train" / "000000.jpg").read_bytes()
    again = LabelledImage(task_id=9, sha256=hashlib.sha256(data).hexdigest(), data=data, extension="jpg", width=64,
                          height=64, boxes=(), annotation_id=1)
    written = write_version(open_base(base), [again, *_labelled(1, seed=4)], tmp_path / "v2", version="v2")
    assert written.already_in_base == ["task 9: train/000000.jpg"] and written.added_train + written.added_val == 1


def test_an_invalid_new_version_is_never_written(tmp_path: Path) -> None:
    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    wrong = _labelled(1, seed=5)[0]
    wrong = LabelledImage(**{**wrong.__dict__, "width": 65})  # the annotation says 65 px, the file has 64
    with pytest.raises(InvalidVersion, match="IMAGE_SIZE_MISMATCH") as caught:
        write_version(open_base(base), [wrong], tmp_path / "v2", version="v2")
    assert not caught.value.report.valid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]  # catches: a half-written or invalid version left
    (tmp_path / "v2").mkdir()
    with pytest.raises(LabellingError, match="already exists"):  # catches: overwriting a version
        write_version(open_base(base), _labelled(1, seed=5), tmp_path / "v2", version="v2")


def test_upload_puts_the_manifest_last_under_datasets_name_version(tmp_path: Path) -> None:
    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    written = write_version(open_base(base), _labelled(2, seed=6), tmp_path / "v2", version="v2")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        order: list[str] = []

        class Recording:
            def __getattr__(self, name: str) -> Any:
                return getattr(s3, name)

            def upload_file(self, path: str, bucket: str, key: str) -> None:
                order.append(key)
                s3.upload_file(path, bucket, key)

        uri = upload_version(Recording(), written, "s3://data")
        assert uri == "s3://data/datasets/shapes/v2/"
        assert order[-1] == "datasets/shapes/v2/manifest.json" and len(order) == len(set(order))  # catches: early
        assert len(order) == sum(1 for p in (tmp_path / "v2").rglob("*") if p.is_file())
        with pytest.raises(LabellingError, match="is already a dataset version"):  # catches: overwriting one
            upload_version(s3, written, "s3://data")


def test_an_upload_that_did_not_finish_is_finished_over_and_its_leftovers_removed(tmp_path: Path) -> None:
    # catches: a retry refused for good after an interrupted upload (the prefix has objects but no manifest), and
    # a file of the unfinished attempt left in the version the manifest then declares
    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    written = write_version(open_base(base), _labelled(2, seed=6), tmp_path / "v2", version="v2")
    prefix = "datasets/shapes/v2/"
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        s3.put_object(Bucket="data", Key=prefix + "images/labelled/from-the-first-attempt.jpg", Body=b"old")
        s3.put_object(Bucket="data", Key=prefix + "annotations/train.json", Body=b"{")  # cut short
        said: list[str] = []
        upload_version(s3, written, "s3://data", said.append)
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix=prefix)["Contents"]}
        files = {prefix + p.relative_to(written.path).as_posix() for p in written.path.rglob("*") if p.is_file()}
        assert keys == files
        assert s3.get_object(Bucket="data", Key=prefix + "annotations/train.json")["Body"].read() == \
            (written.path / "annotations" / "train.json").read_bytes()
        assert "holds 2 objects but no manifest.json" in said[0] and "removed 1 the unfinished upload" in said[-1]


def test_a_failed_upload_is_one_line_that_says_no_run_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # catches: a botocore error during --upload reaching the user as a traceback, or without what to do next
    from d2ops.cli import main
    from tests.fixtures.moto_server import moto_server

    base = tmp_path / "v1"
    synth.generate(base, images=6, seed=1, size=64)
    coco = _coco_of_one_labelled_image(tmp_path)
    with moto_server() as url:
        for name, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)
        code = main(["label", "import", "--from", "coco", str(coco), "--dataset", str(base), "--out",
                     str(tmp_path / "v2"), "--upload", "s3://no-such-data-bucket"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("d2ops label import: error")]
    assert code == 1 and len(errors) == 1
    assert errors[0].startswith(f"d2ops label import: error: uploading {tmp_path / 'v2'} to s3://no-such-data-bucket:"
                                " S3: ") and "NoSuchBucket" in errors[0]
    assert errors[0].endswith("no run started (the manifest goes last): import again with a new --out to finish the "
                              "upload")


def test_coco_out_and_back_in_makes_the_next_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CVAT's path: d2ops label export --to coco, corrected boxes in the COCO file, d2ops label import --from coco."""
    from d2ops.cli import main
    from tests.fixtures.labelling import captured_images, write_selection

    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=96)
    captured = captured_images(tmp_path / "capture", 4, seed=16)
    shas = write_selection(tmp_path / "selection", captured)
    assert main(["label", "export", "--to", "coco", str(tmp_path / "cvat"), "--selection",
                 str(tmp_path / "selection")]) == 0
    doc = json.loads((tmp_path / "cvat" / "annotations.json").read_text())
    assert len(doc["images"]) == 4 and len(doc["annotations"]) == sum(len(b) for _, b in captured)
    # A labeller corrects the model's boxes (shifted 1 px) back to the truth, as CVAT would export them,
    # and leaves image 4 without boxes; the tool renumbers the categories (matched by name).
    renumber = {c["id"]: c["id"] + 10 for c in doc["categories"]}
    truth: list[dict[str, Any]] = []
    for image, (_, boxes) in zip(doc["images"][:3], captured[:3], strict=True):
        for name, bbox in boxes:
            cid = next(c["id"] for c in doc["categories"] if c["name"] == name)
            truth.append({"id": len(truth) + 1, "image_id": image["id"], "category_id": renumber[cid],
                          "bbox": bbox, "area": bbox[2] * bbox[3], "iscrowd": 0})
    doc["annotations"] = truth
    doc["categories"] = [{**c, "id": renumber[c["id"]]} for c in doc["categories"]]
    (tmp_path / "cvat" / "annotations.json").write_text(json.dumps(doc))
    code = main(["label", "import", "--from", "coco", str(tmp_path / "cvat" / "annotations.json"), "--dataset",
                 str(base), "--out", str(tmp_path / "v2")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "(1 images without boxes left out)" in err  # catches: an unlabelled image imported as a negative
    train = json.loads((tmp_path / "v2" / "annotations" / "train.json").read_text())
    val = json.loads((tmp_path / "v2" / "annotations" / "val.json").read_text())
    cat = {c["name"]: c["id"] for c in train["categories"]}
    added = {im["file_name"]: (d, im) for d in (train, val) for im in d["images"]
             if im["file_name"].startswith("labelled/")}
    assert sorted(added) == sorted(f"labelled/{s}.jpg" for s in shas[:3])
    for sha, (_, boxes) in zip(shas[:3], captured[:3], strict=True):
        d, im = added[f"labelled/{sha}.jpg"]
        got = sorted((a["category_id"], a["bbox"]) for a in d["annotations"] if a["image_id"] == im["id"])
        # catches: categories mapped by the tool's ids instead of by name
        assert got == sorted((cat[n], [round(v, 2) for v in b]) for n, b in boxes)


def test_coco_import_refuses_a_category_that_is_not_a_class(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from d2ops.cli import main

    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    (tmp_path / "images").mkdir()
    (tmp_path / "coco.json").write_text(json.dumps({"images": [], "annotations": [],
                                                    "categories": [{"id": 1, "name": "car"}]}))
    code = main(["label", "import", "--from", "coco", str(tmp_path / "coco.json"), "--dataset", str(base),
                 "--out", str(tmp_path / "v2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "categories[0] 'car' is not one of the dataset's classes" in err[0]
    assert not (tmp_path / "v2").exists()


def test_a_base_in_s3_is_copied_down_whole(tmp_path: Path) -> None:
    from d2ops.labelling.new_version import download_base

    base = tmp_path / "v1"
    synth.generate(base, images=8, seed=1, size=64)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            s3.upload_file(str(path), "data", f"datasets/shapes/v1/{path.relative_to(base).as_posix()}")
        s3.put_object(Bucket="data", Key="datasets/shapes/v10/manifest.json", Body=b"{}")  # a sibling, not ours
        copied = download_base(s3, "s3://data/datasets/shapes/v1", tmp_path / "down")
        # catches: a prefix match that pulls in v10's files, or files dropped on the way down
        assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*") if p.is_file()) == \
            sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
        assert open_base(copied).classes == {"square": 1, "disc": 2, "triangle": 3}
        with pytest.raises(LabellingError, match=r"no manifest\.json there"):
            download_base(s3, "s3://data/datasets/shapes/v9/", tmp_path / "none")


CHAMPION_RUN = "shapes_v1_0123456789abcdef"


def _artifacts_with_a_champion(s3: Any, bucket: str, base: Path, *, champion: bool = True) -> None:
    """``bucket`` after a deployment: champion.json and the champion run's snapshot of ``base`` (a bucket per test:
    the in-process moto server's state outlives the server)."""
    from d2ops_core import s3_layout
    from d2ops_core.champion import CHAMPION_KEY

    s3.create_bucket(Bucket=bucket)
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket,
                       s3_layout.snapshot_prefix(CHAMPION_RUN) + path.relative_to(base).as_posix())
    if champion:
        record = {"run_id": CHAMPION_RUN, "endpoint_name": "d2ops", "model_package_arn": "arn:mp", "model_name": "m",
                  "dataset": {"bucket": "data-changed", "prefix": "datasets/shapes/v1/", "name": "shapes",
                              "version": "v1", "manifest_key": "datasets/shapes/v1/manifest.json",
                              "manifest_version": "1"},
                  "model_data": f"s3://{bucket}/model.tar.gz", "endpoint_config_name": "c",
                  "primary_metric": "bbox_AP", "primary_value": 0.7, "evaluation_uri": f"s3://{bucket}/e.json",
                  "gate": {"decision": "approved", "approval_status": "Approved", "reason": "better"},
                  "promoted_at": "2026-05-01T00:00:00Z"}
        s3.put_object(Bucket=bucket, Key=CHAMPION_KEY, Body=json.dumps(record).encode())


@contextlib.contextmanager
def offline_artifacts(monkeypatch: pytest.MonkeyPatch, base: Path, bucket: str, *, champion: bool = True,
                      work_dir: Path | None = None) -> Iterator[Any]:
    """A moto server's S3 as the offline runtime's artifacts bucket (``bucket``, holding the champion's snapshot
    of ``base``) for commands that open it (d2ops.commands.artifacts_bucket); yields the S3 client."""
    from d2ops.commands import artifacts_bucket
    from tests.fixtures.moto_server import moto_server

    with moto_server() as url:
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
        _artifacts_with_a_champion(s3, bucket, base, champion=champion)

        @contextlib.contextmanager
        def offline(asked: Path) -> Iterator[tuple[Any, str, str]]:
            assert work_dir is None or asked == work_dir
            yield s3, bucket, "d2ops"

        monkeypatch.setattr(artifacts_bucket, "offline", offline)
        yield s3


def _coco_of_one_labelled_image(tmp_path: Path) -> Path:
    image = Image.new("RGB", (64, 64), (90, 90, 90))
    (tmp_path / "labelled" / "images").mkdir(parents=True)
    image.save(tmp_path / "labelled" / "images" / "a.jpg")
    document = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "area": 400,
                                 "iscrowd": 0}],
                "categories": [{"id": 1, "name": "square"}]}
    (tmp_path / "labelled" / "coco.json").write_text(json.dumps(document))
    return tmp_path / "labelled" / "coco.json"


def test_without_dataset_the_base_is_the_champions_training_snapshot(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # catches: the base read from the data bucket's (mutable) prefix instead of the champion's snapshot, or
    # --dataset still required
    from d2ops.cli import main

    base = tmp_path / "v1"
    synth.generate(base, images=10, seed=1, size=64)
    coco = _coco_of_one_labelled_image(tmp_path)
    with offline_artifacts(monkeypatch, base, "artifacts-snapshot", work_dir=tmp_path / "state") as s3:
        s3.create_bucket(Bucket="data-changed")  # the prefix the champion was uploaded to, changed since: not the base
        s3.put_object(Bucket="data-changed", Key="datasets/shapes/v1/images/changed.jpg", Body=b"later")
        (tmp_path / "state").mkdir()
        code = main(["label", "import", "--from", "coco", str(coco), "--work-dir", str(tmp_path / "state"),
                     "--out", str(tmp_path / "v2")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"base: the champion's training snapshot, run {CHAMPION_RUN} (shapes/v1)" in err
    v2 = tmp_path / "v2"
    assert json.loads((v2 / "manifest.json").read_text())["version"] == "v2"
    names = {p.relative_to(v2 / "images").as_posix() for p in (v2 / "images").rglob("*") if p.is_file()}
    base_names = {p.relative_to(base / "images").as_posix() for p in (base / "images").rglob("*") if p.is_file()}
    assert base_names < names and "changed.jpg" not in names
    assert len(names - base_names) == 1 and next(iter(names - base_names)).startswith("labelled/")


def test_without_dataset_and_without_a_champion_the_error_is_one_line(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # catches: a None champion dereferenced (a traceback), or an offline runtime started in a directory the user
    # never made
    from d2ops.cli import main

    base = tmp_path / "v1"
    synth.generate(base, images=6, seed=1, size=64)
    coco = _coco_of_one_labelled_image(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["label", "import", "--from", "coco", str(coco), "--work-dir", str(tmp_path / "none"),
              "--out", str(tmp_path / "v2")])
    assert stopped.value.code == 2 and not (tmp_path / "none").exists()
    assert "--work-dir" in capsys.readouterr().err
    with offline_artifacts(monkeypatch, base, "artifacts-no-champion", champion=False):
        code = main(["label", "import", "--from", "coco", str(coco), "--work-dir", str(tmp_path),
                     "--out", str(tmp_path / "v2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [
        "d2ops label import: error: s3://artifacts-no-champion: no champion yet (no model has been deployed), so no "
        "snapshot to build on; name the base with --dataset DIR_OR_S3_URI"]
    assert not (tmp_path / "v2").exists()


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads recurses once per level: a RecursionError, not a ValueError


@pytest.mark.parametrize(("categories", "problem"), [
    ({"1": "square"}, "'categories' is not a list"),
    ([1], r"categories\[0\] is not a COCO category"),
    ([{"id": "1", "name": "square"}], r"categories\[0\] is not a COCO category"),
    ([{"id": 1}], r"categories\[0\] is not a COCO category"),
], ids=["a-dict", "a-number", "a-string-id", "no-name"])
def test_a_base_whose_categories_are_not_coco_is_one_error_naming_the_file(tmp_path: Path, categories: Any,
                                                                          problem: str) -> None:
    # catches: a TypeError / KeyError / ValueError traceback from a hand-made base's train.json
    base = tmp_path / "v1"
    synth.generate(base, images=4, seed=1, size=64)
    train = base / "annotations" / "train.json"
    document = json.loads(train.read_text())
    document["categories"] = categories
    train.write_text(json.dumps(document))
    with pytest.raises(LabellingError, match=rf"train\.json: {problem}"):
        open_base(base)


def test_json_nested_too_deep_is_one_error_naming_the_file_wherever_it_is(tmp_path: Path) -> None:
    # catches: RecursionError (not a ValueError) escaping json.loads from the base, a COCO import or a selection
    from d2ops.labelling.coco_files import read_coco_labels

    base = tmp_path / "v1"
    synth.generate(base, images=4, seed=1, size=64)
    (base / "annotations" / "train.json").write_text(DEEP)
    with pytest.raises(LabellingError, match=r"train\.json: not readable COCO JSON"):
        open_base(base)
    (tmp_path / "coco.json").write_text(DEEP)
    with pytest.raises(LabellingError, match=r"coco\.json: not readable COCO JSON"):
        read_coco_labels(tmp_path / "coco.json", tmp_path, ["square"])
    (tmp_path / "selection").mkdir()
    (tmp_path / "selection" / SELECTION_FILE).write_text(DEEP)
    with pytest.raises(SelectionError, match=r"selection\.json: not JSON \(.*recursion limit"):
        read_selection(tmp_path / "selection")


@pytest.mark.parametrize(("file_name", "problem"), [
    ("../secret.jpg", "contains '..'"),
    ("/etc/passwd", "is absolute"),
    ("link/outside.jpg", "leads outside the images directory"),
], ids=["dot-dot", "absolute", "symlink"])
def test_a_coco_file_name_outside_the_images_directory_is_refused(tmp_path: Path, file_name: str,
                                                                  problem: str) -> None:
    # catches: a COCO export from elsewhere copying any image the user can read into the version (and, with
    # --upload, into the data bucket)
    from d2ops.labelling.coco_files import read_coco_labels

    images = tmp_path / "export" / "images"
    images.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(outside / "outside.jpg")
    Image.new("RGB", (32, 32), (200, 10, 10)).save(tmp_path / "export" / "secret.jpg")
    (images / "link").symlink_to(outside, target_is_directory=True)
    document = {"images": [{"id": 1, "file_name": file_name, "width": 32, "height": 32}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 8, 8]}],
                "categories": [{"id": 1, "name": "square"}]}
    (tmp_path / "export" / "coco.json").write_text(json.dumps(document))
    with pytest.raises(LabellingError, match=rf"images\[0\] file_name '{file_name}' {problem}"):
        read_coco_labels(tmp_path / "export" / "coco.json", images, ["square"])
