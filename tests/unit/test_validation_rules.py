"""One broken dataset per rule: each starts from a valid synthetic version and breaks one thing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from d2ops import synth
from d2ops_core.validation import Code, Thresholds, ValidationReport, validate_local

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base") / "ds"
    synth.generate(root, images=48, seed=5, size=64)
    return root


@pytest.fixture
def ds(base: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(base, root)
    return root


def edit(root: Path, rel: str, change: Callable[[Doc], object]) -> None:
    path = root / rel
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))  # allow_nan: Python writes NaN, which the validator must handle


def train(change: Callable[[Doc], None]) -> Callable[[Path], object]:
    return lambda root: edit(root, "annotations/train.json", change)


def val(change: Callable[[Doc], None]) -> Callable[[Path], object]:
    return lambda root: edit(root, "annotations/val.json", change)


def manifest(change: Callable[[Doc], None]) -> Callable[[Path], object]:
    return lambda root: edit(root, "manifest.json", change)


def issues(report: ValidationReport, code: Code) -> list[Any]:
    return [i for i in report.errors + report.warnings if i.code == code]


def test_the_valid_base_has_no_issues_and_correct_statistics(ds: Path) -> None:
    report = validate_local(ds)
    assert report.valid, report.describe()
    assert report.error_count == report.warning_count == 0, report.describe()
    doc = json.loads((ds / "annotations/train.json").read_text())
    s = report.splits["train"]
    assert (s.images, s.instances, s.categories) == (len(doc["images"]), len(doc["annotations"]), 3)
    per_class = {c.id: c for c in s.per_class}
    for cat in (1, 2, 3):
        anns = [a for a in doc["annotations"] if a["category_id"] == cat]
        assert per_class[cat].instances == len(anns)
        assert per_class[cat].images == len({a["image_id"] for a in anns})
        sizes = per_class[cat].box_sizes
        assert sizes.small + sizes.medium + sizes.large == len(anns)
        assert sizes.small == sum(a["area"] < 32**2 for a in anns)
    assert report.images.mode == "all" and report.images.decoded == report.images.referenced == 48
    assert report.dataset.name == "shapes" and report.manifest is not None and report.manifest.task == "detection"


def _first(doc: Doc, key: str, index: int = 0) -> Doc:
    item: Doc = doc[key][index]
    return item


def _set(key: str, index: int, field: str, value: Any) -> Callable[[Doc], None]:
    return lambda doc: _first(doc, key, index).__setitem__(field, value)


def _del(key: str, index: int, field: str) -> Callable[[Doc], None]:
    return lambda doc: _first(doc, key, index).pop(field)


def _drop_category_annotations(cat: int) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        doc["annotations"] = [a for a in doc["annotations"] if a["category_id"] != cat]
    return change


def _keep_of_category(cat: int, n: int) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        of_cat = [a for a in doc["annotations"] if a["category_id"] == cat]
        doc["annotations"] = [a for a in doc["annotations"] if a["category_id"] != cat] + of_cat[:n]
    return change


def _drop_image_annotations(doc: Doc) -> None:
    first_image = doc["images"][0]["id"]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != first_image]


def _duplicate(key: str) -> Callable[[Doc], None]:
    return lambda doc: doc[key].append(dict(doc[key][0]))


def _bbox(value: Any) -> Callable[[Doc], None]:
    return _set("annotations", 2, "bbox", value)


def _write(rel: str, data: bytes) -> Callable[[Path], object]:
    return lambda root: (root / rel).write_bytes(data)


def _rle(size: list[int], counts: list[int]) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        ann = doc["annotations"][1]
        ann.update(iscrowd=1, segmentation={"size": size, "counts": counts})
    return change


def _val_uses_train_file(root: Path) -> None:
    name = json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]
    edit(root, "annotations/val.json", _set("images", 0, "file_name", name))


def _dangling_train_link(root: Path) -> None:
    (root / "annotations/train.json").unlink()
    (root / "annotations/train.json").symlink_to(root / "nowhere.json")


def _prepend(rel: str, data: bytes) -> Callable[[Path], object]:
    return lambda root: (root / rel).write_bytes(data + (root / rel).read_bytes())


def _reencode(rel: str, encoding: str) -> Callable[[Path], object]:
    return lambda root: (root / rel).write_bytes((root / rel).read_text().encode(encoding))


def _truncate(rel: str, size: int) -> Callable[[Path], object]:
    return lambda root: (root / rel).write_bytes((root / rel).read_bytes()[:size])


def _latin1_category_name(root: Path) -> None:
    path = root / "annotations/train.json"
    doc = json.loads(path.read_text())
    doc["categories"][0]["name"] = "caf\u00e9"
    path.write_bytes(json.dumps(doc, ensure_ascii=False).encode("latin-1"))


def _unlink_first_image(root: Path) -> None:
    (root / "images" / json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]).unlink()


def _corrupt_first_image(root: Path) -> None:
    path = root / "images" / json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]
    path.write_bytes(path.read_bytes()[: 400])  # header intact, entropy-coded data cut short


def _garbage_first_image(root: Path) -> None:
    path = root / "images" / json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]
    path.write_bytes(b"not an image at all")


def _resize_first_image(root: Path) -> None:
    path = root / "images" / json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]
    Image.new("RGB", (80, 64)).save(path)


def _first_image(root: Path) -> Path:
    return root / "images" / json.loads((root / "annotations/train.json").read_text())["images"][0]["file_name"]


def _save_first_image_as(fmt: str) -> Callable[[Path], object]:
    return lambda root: Image.open(_first_image(root)).convert("RGB").save(_first_image(root), format=fmt)


def _damage_first_image_png(root: Path) -> None:
    path = _first_image(root)
    Image.open(path).convert("RGB").save(path, format="PNG")
    data = bytearray(path.read_bytes())
    start = data.find(b"IDAT")
    length = int.from_bytes(data[start - 4:start], "big")
    data[start + 4 + length - 6] ^= 0xFF  # the zlib trailer: Pillow alone decodes this without complaint
    path.write_bytes(bytes(data))


def _link_first_image_outside(root: Path) -> None:
    path = _first_image(root)
    outside = root.parent / "elsewhere.jpg"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def _raw(rel: str, change: Callable[[Doc], None], token: str) -> Callable[[Path], object]:
    """Write a document with ``change`` applied, then put ``token`` where the number 123456.789 is."""
    def write(root: Path) -> None:
        doc = json.loads((root / rel).read_text())
        change(doc)
        (root / rel).write_text(json.dumps(doc).replace("123456.789", token))
    return write


def _deep_unknown_key(doc: Doc) -> None:
    doc["info"] = 123456.789


DEEP = "[" * 100_000 + "]" * 100_000


# (id, breaker, code, file, path) -- path None means "no JSON path", ... means "not asserted"
CASES: list[tuple[str, Callable[[Path], object], Code, str | None, Any]] = [
    ("manifest missing", lambda r: (r / "manifest.json").unlink(), Code.MANIFEST_MISSING, "manifest.json", None),
    ("manifest not json", _write("manifest.json", b"{name: shapes"), Code.JSON_MALFORMED, "manifest.json", None),
    ("manifest key missing", manifest(lambda d: d.pop("train")), Code.MANIFEST_KEY_MISSING, "manifest.json", "train"),
    ("manifest unknown key", manifest(lambda d: d.update(trian="x")), Code.MANIFEST_KEY_UNKNOWN, "manifest.json",
     "trian"),
    ("manifest unknown nested key", manifest(lambda d: d.update(training={"max_iters": 5})),
     Code.MANIFEST_KEY_UNKNOWN, "manifest.json", "training.max_iters"),
    ("manifest value out of bounds", manifest(lambda d: d.update(training={"max_iter": 0})),
     Code.MANIFEST_VALUE_INVALID, "manifest.json", "training.max_iter"),
    ("manifest wrong type", manifest(lambda d: d.update(gate={"min_map": "high"})), Code.MANIFEST_VALUE_INVALID,
     "manifest.json", "gate.min_map"),
    ("manifest format", manifest(lambda d: d.update(format="voc")), Code.MANIFEST_VALUE_INVALID, "manifest.json",
     "format"),
    ("manifest path traversal", manifest(lambda d: d.update(train="../other/train.json")),
     Code.MANIFEST_VALUE_INVALID, "manifest.json", "train"),
    ("manifest names a missing val", lambda r: (r / "annotations/val.json").unlink(), Code.MANIFEST_PATH_MISSING,
     "manifest.json", "val"),
    ("manifest names a missing train", manifest(lambda d: d.update(train="annotations/training.json")),
     Code.MANIFEST_PATH_MISSING, "manifest.json", "train"),
    ("no images uploaded", lambda r: shutil.rmtree(r / "images"), Code.MANIFEST_PATH_MISSING, "manifest.json",
     "images"),
    ("annotations unreadable", _dangling_train_link, Code.FILE_UNREADABLE, "annotations/train.json", None),
    ("annotations not json", _write("annotations/train.json", b'{"images": [\n  {"id": 1,,}]}'),
     Code.JSON_MALFORMED, "annotations/train.json", None),
    ("annotations empty file", _write("annotations/val.json", b""), Code.JSON_MALFORMED, "annotations/val.json",
     None),
    ("manifest with a BOM", _prepend("manifest.json", b"\xef\xbb\xbf"), Code.JSON_MALFORMED, "manifest.json", None),
    ("annotations with a BOM", _prepend("annotations/train.json", b"\xef\xbb\xbf"), Code.JSON_MALFORMED,
     "annotations/train.json", None),
    ("annotations in UTF-16", _reencode("annotations/val.json", "utf-16"), Code.JSON_MALFORMED,
     "annotations/val.json", None),
    ("annotations in Latin-1", _latin1_category_name, Code.JSON_MALFORMED, "annotations/train.json", None),
    ("annotations truncated", _truncate("annotations/train.json", 700), Code.JSON_MALFORMED,
     "annotations/train.json", None),
    ("top-level key missing", train(lambda d: d.pop("categories")), Code.KEY_MISSING, "annotations/train.json",
     None),
    ("annotation key missing", train(_del("annotations", 3, "bbox")), Code.KEY_MISSING, "annotations/train.json",
     "annotations[3]"),
    ("image key missing", val(_del("images", 1, "file_name")), Code.KEY_MISSING, "annotations/val.json", "images[1]"),
    ("wrong type of id", train(_set("images", 2, "id", "3")), Code.WRONG_TYPE, "annotations/train.json",
     "images[2].id"),
    ("wrong type of category name", train(_set("categories", 1, "name", 7)), Code.WRONG_TYPE,
     "annotations/train.json", "categories[1].name"),
    ("wrong container type", train(lambda d: d.update(annotations={"0": {}})), Code.WRONG_TYPE,
     "annotations/train.json", "annotations"),
    ("duplicate image id", train(_duplicate("images")), Code.DUPLICATE_IMAGE_ID, "annotations/train.json", ...),
    ("duplicate annotation id", train(_duplicate("annotations")), Code.DUPLICATE_ANNOTATION_ID,
     "annotations/train.json", ...),
    ("duplicate category id", val(_duplicate("categories")), Code.DUPLICATE_CATEGORY_ID, "annotations/val.json",
     "categories[3].id"),
    ("duplicate category name", val(_set("categories", 1, "name", "square")), Code.DUPLICATE_CATEGORY_NAME,
     "annotations/val.json", "categories[1].name"),
    ("non-positive image size", train(_set("images", 4, "width", 0)), Code.IMAGE_DIMENSIONS_INVALID,
     "annotations/train.json", "images[4]"),
    ("file_name with ..", train(_set("images", 0, "file_name", "../../etc/passwd")), Code.FILE_NAME_UNSAFE,
     "annotations/train.json", "images[0].file_name"),
    ("absolute file_name", train(_set("images", 1, "file_name", "/etc/passwd")), Code.FILE_NAME_UNSAFE,
     "annotations/train.json", "images[1].file_name"),
    ("backslash file_name", train(_set("images", 1, "file_name", "train\\000001.jpg")), Code.FILE_NAME_UNSAFE,
     "annotations/train.json", "images[1].file_name"),
    ("file_name with a . segment", train(_set("images", 2, "file_name", "train/./000002.jpg")),
     Code.FILE_NAME_UNSAFE, "annotations/train.json", "images[2].file_name"),
    ("file_name with //", val(_set("images", 0, "file_name", "val//000000.jpg")), Code.FILE_NAME_UNSAFE,
     "annotations/val.json", "images[0].file_name"),
    ("unknown image_id", train(_set("annotations", 5, "image_id", 99999)), Code.ANNOTATION_IMAGE_UNKNOWN,
     "annotations/train.json", "annotations[5].image_id"),
    ("unknown category_id", val(_set("annotations", 0, "category_id", 42)), Code.ANNOTATION_CATEGORY_UNKNOWN,
     "annotations/val.json", "annotations[0].category_id"),
    ("bbox of three numbers", train(_bbox([1, 2, 3])), Code.BBOX_MALFORMED, "annotations/train.json",
     "annotations[2].bbox"),
    ("bbox with a string", train(_bbox([1, 2, "3", 4])), Code.BBOX_MALFORMED, "annotations/train.json",
     "annotations[2].bbox"),
    ("bbox NaN (Python's json writes NaN)", train(_bbox([1.0, 2.0, float("nan"), 4.0])), Code.BBOX_NOT_FINITE,
     "annotations/train.json", "annotations[2].bbox[2]"),
    ("bbox infinite", train(_bbox([1.0, float("inf"), 3.0, 4.0])), Code.BBOX_NOT_FINITE, "annotations/train.json",
     "annotations[2].bbox[1]"),
    ("bbox zero width", train(_bbox([1, 2, 0, 4])), Code.BBOX_NON_POSITIVE_SIZE, "annotations/train.json",
     "annotations[2].bbox[2]"),
    ("bbox negative height", train(_bbox([1, 2, 3, -4])), Code.BBOX_NON_POSITIVE_SIZE, "annotations/train.json",
     "annotations[2].bbox[3]"),
    ("bbox outside the image", train(_bbox([50, 50, 20, 10])), Code.BBOX_OUTSIDE_IMAGE, "annotations/train.json",
     "annotations[2].bbox"),
    ("negative area", train(_set("annotations", 1, "area", -3.0)), Code.AREA_NEGATIVE, "annotations/train.json",
     "annotations[1].area"),
    ("area larger than its box", train(_set("annotations", 1, "area", 64 * 64.0)), Code.AREA_INCONSISTENT,
     "annotations/train.json", "annotations[1].area"),
    ("iscrowd 2", train(_set("annotations", 0, "iscrowd", 2)), Code.ISCROWD_INVALID, "annotations/train.json",
     "annotations[0].iscrowd"),
    ("segmentation a string", train(_set("annotations", 0, "segmentation", "mask")), Code.SEGMENTATION_MALFORMED,
     "annotations/train.json", "annotations[0].segmentation"),
    ("polygon with a string", train(_set("annotations", 0, "segmentation", [[1, 2, 3, "4", 5, 6]])),
     Code.SEGMENTATION_MALFORMED, "annotations/train.json", "annotations[0].segmentation[0][3]"),
    ("polygon of odd length", train(_set("annotations", 0, "segmentation", [[1, 2, 3, 4, 5, 6, 7]])),
     Code.POLYGON_MALFORMED, "annotations/train.json", "annotations[0].segmentation[0]"),
    ("polygon of two points", val(_set("annotations", 1, "segmentation", [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4]])),
     Code.POLYGON_MALFORMED, "annotations/val.json", "annotations[1].segmentation[1]"),
    ("RLE of another size", train(_rle([32, 64], [2048])), Code.RLE_SIZE_MISMATCH, "annotations/train.json",
     "annotations[1].segmentation.size"),
    ("RLE counts not covering the image", train(_rle([64, 64], [100, 50])), Code.RLE_SIZE_MISMATCH,
     "annotations/train.json", "annotations[1].segmentation.counts"),
    ("empty val split", val(lambda d: d.update(annotations=[])), Code.SPLIT_EMPTY, "annotations/val.json", None),
    ("val category never in train", train(_drop_category_annotations(3)), Code.CATEGORY_NOT_IN_TRAIN,
     "annotations/val.json", "categories[2]"),
    ("val category renamed", val(_set("categories", 0, "name", "box")), Code.CATEGORY_MISMATCH,
     "annotations/val.json", "categories[0]"),
    ("image file missing", _unlink_first_image, Code.IMAGE_MISSING, "annotations/train.json",
     "images[0].file_name"),
    ("image file empty", lambda r: (r / "images/train/000000.jpg").write_bytes(b""), Code.IMAGE_UNREADABLE,
     "annotations/train.json", "images[0].file_name"),
    ("image file truncated", _corrupt_first_image, Code.IMAGE_UNREADABLE, "annotations/train.json", "images[0]"),
    ("image file not an image", _garbage_first_image, Code.IMAGE_FORMAT_UNSUPPORTED, "annotations/train.json",
     "images[0]"),
    ("a WebP named .jpg", _save_first_image_as("WEBP"), Code.IMAGE_FORMAT_UNSUPPORTED, "annotations/train.json",
     "images[0]"),
    ("a GIF named .jpg", _save_first_image_as("GIF"), Code.IMAGE_FORMAT_UNSUPPORTED, "annotations/train.json",
     "images[0]"),
    ("a PNG damaged near its end", _damage_first_image_png, Code.IMAGE_UNREADABLE, "annotations/train.json",
     "images[0]"),
    ("declared too large", train(_set("images", 0, "width", 600_000)), Code.IMAGE_TOO_LARGE,
     "annotations/train.json", "images[0]"),
    ("declared too narrow", train(_set("images", 0, "width", 64 * 21)), Code.IMAGE_SHAPE_UNSUPPORTED,
     "annotations/train.json", "images[0]"),
    ("image linked from outside the dataset", _link_first_image_outside, Code.LINK_OUTSIDE_DATASET,
     "images/train/000000.jpg", None),
    ("400-digit integer in a bbox", _raw("annotations/train.json", _bbox([1, 2, 123456.789, 4]), "1" * 400),
     Code.NUMBER_OUT_OF_RANGE, "annotations/train.json", "annotations[2].bbox[2]"),
    ("5000-digit integer as a width", _raw("annotations/train.json", _set("images", 3, "width", 123456.789),
                                           "9" * 5000), Code.NUMBER_OUT_OF_RANGE, "annotations/train.json",
     "images[3].width"),
    ("annotation id beyond 64 bits", train(_set("annotations", 3, "id", 2**64)), Code.NUMBER_OUT_OF_RANGE,
     "annotations/train.json", "annotations[3].id"),
    ("deep nesting under an unknown key", _raw("annotations/train.json", _deep_unknown_key, DEEP),
     Code.JSON_TOO_DEEP, "annotations/train.json", None),
    ("image of another size", _resize_first_image, Code.IMAGE_SIZE_MISMATCH, "annotations/train.json", "images[0]"),
    # warnings
    ("image without annotations", train(_drop_image_annotations), Code.IMAGE_WITHOUT_ANNOTATIONS,
     "annotations/train.json", "images[0]"),
    ("class with few instances", train(_keep_of_category(2, 2)), Code.CLASS_FEW_INSTANCES, "annotations/train.json",
     "categories[1]"),
    ("class missing in val", val(_drop_category_annotations(2)), Code.CLASS_MISSING_IN_VAL, "annotations/val.json",
     None),
    ("tiny box", train(lambda d: d["annotations"][4].update(bbox=[5, 5, 3, 9], area=20)), Code.BOX_TINY,
     "annotations/train.json", "annotations[4].bbox"),
    ("duplicate file_name", train(lambda d: d["images"][1].update(file_name=d["images"][0]["file_name"])),
     Code.DUPLICATE_FILE_NAME, "annotations/train.json", "images[1].file_name"),
    ("image in both splits", _val_uses_train_file, Code.SPLIT_OVERLAP, "annotations/val.json",
     "images[0].file_name"),
    ("a PNG named .jpg", _save_first_image_as("PNG"), Code.IMAGE_EXTENSION_MISMATCH, "annotations/train.json",
     "images[0].file_name"),
]


@pytest.mark.parametrize(("breaker", "code", "file", "path"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rule_reports_its_code_and_location(ds: Path, breaker: Callable[[Path], object], code: Code,
                                                  file: str | None, path: Any) -> None:
    breaker(ds)
    report = validate_local(ds, limits=Thresholds(few_instances=3))
    found = issues(report, code)
    assert found, f"{code} not reported:\n{report.describe()}"
    issue = found[0]
    assert issue.file == file
    if path is not ...:
        assert issue.path == path, issue
    assert issue.message
    if issue.severity == "warning":
        assert report.valid, f"a warning alone must not reject the dataset:\n{report.describe()}"
    else:
        assert not report.valid


def test_every_code_is_exercised() -> None:
    """A new code needs a broken dataset that triggers it: in CASES or in a test of its own below."""
    own_tests = {Code.CLASS_IMBALANCE, Code.SEGMENTATION_MISSING, Code.MANIFEST_PREFIX_MISMATCH, Code.CHECK_FAILED}
    own_tests.add(Code.OBJECT_CHANGED)  # needs S3 versions: tests/unit/test_validation_snapshot.py
    # the stack-limit codes need stack limits: tests/unit/test_pipeline_gate_limits.py exercises them
    own_tests |= {c for c in Code if c.endswith("_STACK")}
    assert {case[2] for case in CASES} | own_tests == set(Code)


def test_a_manifest_naming_another_dataset_than_its_prefix(ds: Path) -> None:
    from d2ops_core.validation.dataset import validate_source
    from d2ops_core.validation.sources import LocalSource

    report = validate_source(LocalSource(ds), check_images=False, expected=("shapes", "v2"))
    [issue] = issues(report, Code.MANIFEST_PREFIX_MISMATCH)
    assert issue.file == "manifest.json" and "shapes/v1" in issue.message and "datasets/shapes/v2/" in issue.message
    assert not report.valid


def test_class_imbalance_is_a_warning(ds: Path) -> None:
    edit(ds, "annotations/train.json", _keep_of_category(3, 1))
    report = validate_local(ds, limits=Thresholds(imbalance_ratio=5, few_instances=1))
    [warning] = issues(report, Code.CLASS_IMBALANCE)
    assert "'triangle'" in warning.message and report.valid


def test_instance_segmentation_requires_masks(ds: Path) -> None:
    edit(ds, "manifest.json", lambda d: d.update(task="instance_segmentation"))
    edit(ds, "annotations/val.json", _del("annotations", 2, "segmentation"))
    report = validate_local(ds)
    [issue] = issues(report, Code.SEGMENTATION_MISSING)
    assert issue.path == "annotations[2]" and not report.valid
    # the same annotation is fine for plain detection
    edit(ds, "manifest.json", lambda d: d.update(task="detection"))
    assert validate_local(ds).valid


def test_exif_rotation_is_taken_into_account(ds: Path) -> None:
    path = ds / "images/train/000000.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees: loaders that honour EXIF see a 64x80 image
    Image.new("RGB", (80, 64)).save(path, exif=exif)
    [issue] = issues(validate_local(ds), Code.IMAGE_SIZE_MISMATCH)
    assert "EXIF" in issue.message and "64x80" in issue.message


def test_no_images_mode_checks_annotations_only(ds: Path) -> None:
    shutil.rmtree(ds / "images")
    report = validate_local(ds, check_images=False)
    assert report.valid and report.images.mode == "skipped"


def test_a_big_broken_file_makes_a_bounded_report(ds: Path) -> None:
    def break_all(doc: Doc) -> None:
        anns = doc["annotations"]
        doc["annotations"] = [dict(anns[i % len(anns)], id=i, bbox=[0, 0, -1, 1]) for i in range(2500)]

    edit(ds, "annotations/train.json", break_all)
    report = validate_local(ds, check_images=False)
    assert report.issue_counts[Code.BBOX_NON_POSITIVE_SIZE] == 2500
    assert len(issues(report, Code.BBOX_NON_POSITIVE_SIZE)) == 100
    assert report.issues_truncated and report.error_count >= 2500
    assert len(report.model_dump_json()) < 200_000


def test_overflowing_numbers_are_non_finite_and_the_file_is_still_checked(ds: Path) -> None:
    path = ds / "annotations/train.json"
    doc = json.loads(path.read_text())
    doc["annotations"][2]["bbox"][1] = 123456.0
    doc["annotations"][5]["iscrowd"] = 7
    path.write_text(json.dumps(doc).replace("123456.0", "1e999"))
    report = validate_local(ds)
    assert {(i.code, i.path) for i in report.errors} == {(Code.ISCROWD_INVALID, "annotations[5].iscrowd"),
                                                          (Code.BBOX_NOT_FINITE, "annotations[2].bbox[1]")}


@pytest.mark.parametrize(("breaker", "expected"), [
    (_prepend("annotations/train.json", b"\xef\xbb\xbf"), "byte-order mark (BOM)"),
    (_reencode("annotations/train.json", "utf-16"), "is UTF-16"),
    (_reencode("annotations/train.json", "utf-16-le"), "looks like UTF-16 or UTF-32"),
    (_latin1_category_name, "not valid UTF-8: byte 0xe9 at line 1, column"),
    (_truncate("annotations/train.json", 700), "ends in the middle of the document after 700 bytes"),
], ids=["bom", "utf-16", "utf-16 without bom", "latin-1", "truncated"])
def test_encoding_and_truncation_errors_say_what_is_wrong(ds: Path, breaker: Callable[[Path], object],
                                                          expected: str) -> None:
    breaker(ds)
    [issue] = issues(validate_local(ds, check_images=False), Code.JSON_MALFORMED)
    assert expected in issue.message, issue.message


def test_utf8_errors_are_located_across_chunk_boundaries() -> None:
    from d2ops_core.validation.encoding import utf8_problem

    # a two-byte character split across the 1 MiB decoding chunks is valid; a stray byte after it is found
    text = b'{"k": "' + b"a" * ((1 << 20) - 8) + "\u00e9".encode() + b'x\nyy\xff"}'
    assert utf8_problem(text[:-4] + b'"}') is None
    problem = utf8_problem(text)
    assert problem is not None and f"byte {len(text) - 3}" in problem and "line 2, column 3" in problem, problem


def test_structural_errors_name_line_and_column(ds: Path) -> None:
    (ds / "annotations/train.json").write_text('{"images": [\n  {"id": 1,,}]}')
    [issue] = issues(validate_local(ds), Code.JSON_MALFORMED)
    assert "line 2, column 12" in issue.message


def test_every_split_and_rule_is_checked_in_one_run(ds: Path) -> None:
    """Several independent problems are all reported, not just the first."""
    edit(ds, "annotations/train.json", lambda d: (d["annotations"][0].update(iscrowd=3),
                                                   d["images"][1].update(file_name="/abs.jpg")))
    edit(ds, "annotations/val.json", _set("annotations", 0, "bbox", [1, 2, 0, 4]))
    report = validate_local(ds)
    assert {Code.ISCROWD_INVALID, Code.FILE_NAME_UNSAFE, Code.BBOX_NON_POSITIVE_SIZE} <= {i.code for i in report.errors}


def test_links_inside_the_dataset_are_followed(ds: Path) -> None:
    shutil.move(ds / "images", ds / "pictures")
    (ds / "images").symlink_to(ds / "pictures", target_is_directory=True)
    report = validate_local(ds)
    assert report.valid and report.images.decoded == 48, report.describe()


def test_links_out_of_the_dataset_are_refused_not_followed(ds: Path, tmp_path: Path) -> None:
    shutil.move(ds / "images", tmp_path / "pictures")
    (ds / "images").symlink_to(tmp_path / "pictures", target_is_directory=True)
    (ds / "annotations/secrets.json").symlink_to("/etc/passwd")
    report = validate_local(ds)
    found = {(i.file, i.message.split(" links to ")[1]) for i in issues(report, Code.LINK_OUTSIDE_DATASET)}
    assert found == {("images", f"{tmp_path / 'pictures'}, outside the dataset directory: not followed"),
                     ("annotations/secrets.json", "/etc/passwd, outside the dataset directory: not followed")}
    assert report.images.probed == 0 and not report.valid


def test_a_link_loop_is_listed_once(ds: Path) -> None:
    from d2ops_core.validation.sources import LocalSource

    # a link back to an ancestor: os.walk alone lists the tree again at every level until ELOOP
    # (two such links: 2^40 times)
    (ds / "images/train/up").symlink_to(ds / "images", target_is_directory=True)
    files = LocalSource(ds).list_files()
    assert not [rel for rel in files if "/up/" in rel]
    report = validate_local(ds)
    assert report.valid and report.images.decoded == 48, report.describe()


def test_a_missing_image_names_a_file_that_differs_only_in_case_or_normalization(ds: Path) -> None:
    doc = json.loads((ds / "annotations/train.json").read_text())
    first, second = doc["images"][0]["file_name"], doc["images"][1]["file_name"]
    upper = first.replace(".jpg", ".JPG")
    (ds / "images" / first).rename(ds / "images" / upper)
    nfd = "train/cafe\u0301.jpg"  # what macOS writes for the name the annotations spell in NFC
    (ds / "images" / second).rename(ds / "images" / nfd)
    edit(ds, "annotations/train.json", _set("images", 1, "file_name", "train/caf\u00e9.jpg"))
    messages = [i.message for i in issues(validate_local(ds), Code.IMAGE_MISSING)]
    assert messages == [f"images/{first} was not uploaded (images/{upper} differs only in letter case or "
                        "Unicode normalization)",
                        f"images/train/caf\u00e9.jpg was not uploaded (images/{nfd} differs only in letter case or "
                        "Unicode normalization)"]


def test_images_over_the_limit_are_refused_without_being_decoded(ds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from d2ops_core import images as rule
    path = ds / "images/train/000000.jpg"
    Image.new("RGB", (64, 64)).save(path, format="JPEG")
    decoded: list[str] = []
    real_load = Image.Image.load

    def counting_load(self: Image.Image) -> Any:
        decoded.append(getattr(self, "filename", "") or "?")
        return real_load(self)

    monkeypatch.setattr(Image.Image, "load", counting_load)
    monkeypatch.setattr(rule, "MAX_PIXELS", 64 * 64 - 1)
    report = validate_local(ds, check_images=True)
    [issue] = issues(report, Code.IMAGE_TOO_LARGE)[:1]
    assert issue.path == "images[0]" and "64x64" in issue.message, issue
    assert report.images.decoded == 0 and decoded == [], "an image over the limit was decoded"


def test_a_check_that_crashes_rejects_its_file_and_the_report_is_still_made(ds: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from d2ops_core.validation import dataset

    def broken(*_: Any, **__: Any) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(dataset, "check_split", broken)
    report = validate_local(ds)
    assert {(i.code, i.file) for i in report.errors} == {(Code.CHECK_FAILED, "annotations/train.json"),
                                                        (Code.CHECK_FAILED, "annotations/val.json")}
    assert "ZeroDivisionError: a bug" in report.errors[0].message and not report.valid


# --- hostile documents (issue 10): explicit cases beside the Hypothesis properties -----------------------------

_DOC = ('{"images": [{"id": 1, "file_name": "NaN.jpg", "width": 64, "height": 48}],\n'
        ' "categories": [{"id": 1, "name": "say \\"NaN\\", Infinity 1e999", "id": 1}],\n'
        ' "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 40], "area": 1200}]}')


def _check(text: str) -> tuple[Any, dict[str, int], list[Any]]:
    from d2ops_core.validation.coco import check_split
    from d2ops_core.validation.report import IssueLog

    log = IssueLog()
    result = check_split(text.encode(), "train", "annotations/train.json", log)
    return result, dict(log.counts), log.kept


def test_nan_stays_on_the_fast_decoder_and_strings_are_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_slow_path(*_: Any, **__: Any) -> None:
        raise AssertionError("Python's json decoded the document")

    monkeypatch.setattr(json, "loads", no_slow_path)
    monkeypatch.setattr(json.JSONDecoder, "decode", no_slow_path)
    result, counts, kept = _check(_DOC.replace('"bbox": [1, 2, 30, 40], "area": 1200',
                                               '"bbox": [1, NaN, 30, 40], "area": -Infinity'))
    assert counts == {Code.BBOX_NOT_FINITE: 1, Code.AREA_NEGATIVE: 1}, kept
    assert [(i.code, i.path) for i in kept] == [(Code.BBOX_NOT_FINITE, "annotations[0].bbox[1]"),
                                                (Code.AREA_NEGATIVE, "annotations[0].area")]
    # tokens inside strings (after an escaped quote too) are not rewritten
    assert result.images[0].file_name == "NaN.jpg" and result.categories == {1: 'say "NaN", Infinity 1e999'}


@pytest.mark.parametrize(("value", "code", "path"), [
    ("Infinity", Code.WRONG_TYPE, "images[0].width"),
    ("1e999", Code.WRONG_TYPE, "images[0].width"),
    ("NaN", Code.WRONG_TYPE, "images[0].width"),
    ("9" * 5000, Code.NUMBER_OUT_OF_RANGE, "images[0].width"),
    ("-" + "9" * 400, Code.NUMBER_OUT_OF_RANGE, "images[0].width"),
    ("9223372036854775808", Code.NUMBER_OUT_OF_RANGE, "images[0].width"),
    ("1" * 400 + ".5", Code.WRONG_TYPE, "images[0].width"),
])
def test_non_finite_and_huge_numbers_get_a_code_and_the_rest_is_checked(value: str, code: Code, path: str) -> None:
    text = _DOC.replace('"width": 64', f'"width": {value}').replace('"bbox": [1, 2, 30, 40]', '"bbox": [1, 2, 30, -4]')
    _, counts, kept = _check(text)
    assert counts.get(code) == 1 and counts.get(Code.BBOX_NON_POSITIVE_SIZE) == 1, kept
    [issue] = [i for i in kept if i.code == code]
    assert issue.path == path and len(issue.message) < 200, issue


def test_duplicate_keys_take_the_last_value_like_every_json_reader() -> None:
    _, counts, kept = _check(_DOC.replace('"id": 1, "image_id"', '"id": "one", "id": 1, "image_id"'))
    assert counts == {}, kept


def test_syntax_errors_after_a_patched_token_point_into_the_original_file() -> None:
    text = _DOC.replace('"bbox": [1, 2, 30, 40]', '"bbox": [1, NaN, Infinity, 4]').replace('"area": 1200',
                                                                                         '"area" 1200')
    _, counts, kept = _check(text)
    assert counts == {Code.JSON_MALFORMED: 1}
    line = text.splitlines()[2]
    assert f"line 3, column {line.index(' 1200') + 2}" in kept[0].message, kept[0].message


def test_deep_nesting_is_too_deep_not_a_crash() -> None:
    _, counts, kept = _check(_DOC[:-1] + ', "info": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert counts == {Code.JSON_TOO_DEEP: 1} and kept[0].file == "annotations/train.json"


def test_only_tokens_outside_strings_are_rewritten() -> None:
    from d2ops_core.validation.coco import _patch_non_standard

    strings = ",".join(['"NaN \\\\\\" Infinity 1e999"'] * 5000)  # three backslashes before a quote: escaped
    text = ('{"info": [' + strings + ', NaN, "x", 1e999, ' + "7" * 2000 + ', "-Infinity", -Infinity, '
            '"\\\\\\\\", NaN]}')
    patched, shifts = _patch_non_standard(text.encode(), numbers=True)
    decoded = json.loads(bytes(patched))["info"]
    assert decoded[:5000] == ['NaN \\" Infinity 1e999'] * 5000  # a backslash, then a quote
    assert decoded[5000:] == ["\x00NaN", "x", "\x00Infinity", "\x00BIG", "-Infinity", "\x00-Infinity", "\\\\",
                              "\x00NaN"]  # the string of two backslashes ends at its quote
    assert len(shifts) == 5
    # an unterminated string: nothing after its opening quote is rewritten
    assert bytes(_patch_non_standard(b'[NaN, "NaN', numbers=False)[0]) == b'["\\u0000NaN", "NaN'
