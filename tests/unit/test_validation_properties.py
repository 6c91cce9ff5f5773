"""Property-based tests: no document, manifest or image bytes make the validator raise.

Hypothesis generates and mutates COCO documents (values of every JSON type at every field,
huge integers, NaN/Infinity, byte-level damage: truncation, stray bytes, BOMs, deep nesting,
duplicate keys), manifests and image files, and feeds them to each entry point: the split
checker, ``validate_local`` and the validate Lambda's service function (on moto S3). Each must
return a report whose issues all carry known codes -- never an exception, never CHECK_FAILED
(the safety net that would hide a bug), and the report must serialize to JSON.

Examples are bounded and derandomized so the suite stays fast (seconds per test) and repeatable.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from PIL import Image

from d2ops import synth
from d2ops_core import images as rule
from d2ops_core.validation import Code, ValidationReport, validate_local
from d2ops_core.validation.coco import check_split
from d2ops_core.validation.manifest import parse_manifest
from d2ops_core.validation.report import DatasetName, ImageCheck, IssueLog
from d2ops_core.validation.sources import _probe
from tests.fixtures.pipeline import support

support.function_path("validate_dataset")
from validate_dataset.models import ValidateDatasetEvent  # noqa: E402
from validate_dataset.service import report_key, validate_dataset  # noqa: E402

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
FEW = settings(FAST, max_examples=20)
KNOWN = set(Code)

# ---------------------------------------------------------------------------------------------
# strategies

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["\ud800", "../x.jpg", "/etc/passwd", "train/000000.jpg", "", "NaN"]),
)
JSON_VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
FIELDS = {  # numeric fields twice: they are where number handling can go wrong
    "images": ["id", "file_name", "width", "height", "width", "height"],
    "annotations": ["id", "image_id", "category_id", "bbox", "area", "iscrowd", "segmentation", "bbox", "bbox",
                    "area", "segmentation"],
    "categories": ["id", "name", "supercategory"],
}
# Raw JSON put where a value goes (json.dumps cannot write most of these): what crashed validators.
HOSTILE_VALUES = [b"NaN", b"-Infinity", b"Infinity", b"1e999", b"-1e400", b"9" * 5000, b"1" * 400, b"-" + b"7" * 400,
                  b"1" * 400 + b".5", b"[" * 3000 + b"]" * 3000, b'{"a": 1, "a": [NaN]}', b'"\\ud800"',
                  b"[1e308, 1e308, 1e308, 1e308]", b"[NaN, NaN, NaN, NaN]", b"[0, 0, " + b"1" * 400 + b", 5]",
                  b"18446744073709551616", b'"NaN"', b"[[1, 2, 3, 4, NaN, 6]]", b'{"size": [' + b"9" * 30 + b', 1], '
                  b'"counts": [1]}', b'{"size": [16, 24], "counts": [' + b"1" * 30 + b"]}"]
PLACEHOLDER = 123456.789
TOKENS = [b"NaN", b"-Infinity", b"Infinity", b"1e999", b"-1e400", b"9" * 5000, b"1" * 400 + b".5", b"\xef\xbb\xbf",
          b"\xff\xfe", b"\x00", b"[" * 3000, b"{" * 50, b'"', b"\\", b",", b"}", b"]", b'"\\ud800"', b"\"images\": [],",
          b"\"bbox\": [1e308, 1e308, 1e308, 1e308],", b"0" * 400]


@st.composite
def mutated_document(draw: st.DrawFn, base: dict[str, Any], damage: bool = True) -> bytes:
    """``base`` with a few fields set to arbitrary or hostile JSON (or deleted), then, with ``damage``, byte edits."""
    doc = json.loads(json.dumps(base))
    hostile: list[bytes] = []
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from([*FIELDS, "annotations", "annotations", None]))
        if section is None:
            key = draw(st.sampled_from([*FIELDS, "info", "licenses"]))
            if draw(st.booleans()):
                doc.pop(key, None)
            else:
                doc[key] = draw(JSON_VALUES)
            continue
        items = doc.get(section)
        if not isinstance(items, list) or not items:
            continue
        item = items[draw(st.integers(0, len(items) - 1))]
        if not isinstance(item, dict):
            continue
        key = draw(st.sampled_from(FIELDS[section]) | st.text(max_size=4))
        choice = draw(st.integers(0, 5))
        if choice == 0:
            item.pop(key, None)
        elif choice <= 2:  # a hostile raw value, written in after json.dumps
            hostile.append(draw(st.sampled_from(HOSTILE_VALUES)))
            item[key] = PLACEHOLDER + len(hostile)
            if key == "bbox" and draw(st.booleans()):
                item[key] = [1.0, 2.0, PLACEHOLDER + len(hostile), 4.0]
        elif key == "bbox" and draw(st.booleans()):
            item[key] = draw(st.lists(LEAVES, min_size=4, max_size=4))
        else:
            item[key] = draw(JSON_VALUES)
    text = json.dumps(doc).encode("utf-8", "surrogatepass")
    for n, value in enumerate(hostile, 1):
        text = text.replace(repr(PLACEHOLDER + n).encode(), value)
    data = bytearray(text)
    for _ in range(draw(st.integers(1, 3)) if damage else 0):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["insert", "delete", "truncate", "flip"]))
        if edit == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(max_size=8))
        elif edit == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif edit == "truncate":
            del data[at:]
        elif at < len(data):
            data[at] ^= draw(st.integers(1, 255))
    return bytes(data)


@st.composite
def mutated_image(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        edit = draw(st.sampled_from(["flip", "truncate", "insert", "splice"]))
        if edit == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif edit == "truncate":
            del data[at:]
        elif edit == "insert":
            data[at:at] = draw(st.binary(max_size=16))
        else:  # another format's magic in front: WebP, GIF, TIFF, EPS, BMP
            data[:4] = draw(st.sampled_from([b"RIFF", b"GIF8", b"II*\x00", b"%!PS", b"BM\x00\x00"]))
    return bytes(data)


def _image(fmt: str, orientation: int = 1) -> bytes:
    image = Image.new("RGB", (24, 16), (200, 30, 30))
    buffer = io.BytesIO()
    if fmt == "MPO":
        image.save(buffer, "MPO", save_all=True, append_images=[image.resize((12, 8))])
        return buffer.getvalue()
    exif = Image.Exif()
    exif[rule.EXIF_ORIENTATION] = orientation
    image.save(buffer, fmt, exif=exif)
    return buffer.getvalue()


ORIGINAL_IMAGES = [_image("JPEG"), _image("PNG"), _image("JPEG", 6), _image("PNG", 8), _image("MPO")]

# ---------------------------------------------------------------------------------------------
# checks


def assert_report_is_sound(report: ValidationReport) -> None:
    issues = report.errors + report.warnings
    assert {i.code for i in issues} <= KNOWN
    assert set(report.issue_counts) <= {str(c) for c in KNOWN}
    assert Code.CHECK_FAILED not in report.issue_counts, [i.message for i in report.errors]
    json.loads(report.model_dump_json())  # writable: no lone surrogate or other unencodable text


def report_of(log: IssueLog) -> ValidationReport:
    return ValidationReport.build(source="generated", log=log, manifest=None, dataset=DatasetName(), splits={},
                                  images=ImageCheck(mode="skipped"), seconds=0.0)


@pytest.fixture(scope="module")
def base_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("props") / "ds"
    synth.generate(root, images=6, seed=3, size=32)
    return root


@pytest.fixture(scope="module")
def base_train(base_dataset: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((base_dataset / "annotations/train.json").read_text())
    return doc


def test_the_split_checker_never_raises(base_train: dict[str, Any]) -> None:
    @settings(FAST, max_examples=150)
    @given(data=mutated_document(base_train, damage=False), task=st.sampled_from(["detection",
                                                                                 "instance_segmentation"]))
    def check(data: bytes, task: str) -> None:
        log = IssueLog()
        check_split(data, "train", "annotations/train.json", log, task=task)
        assert_report_is_sound(report_of(log))

    check()


def test_the_split_checker_never_raises_on_damaged_bytes(base_train: dict[str, Any]) -> None:
    @FAST
    @given(data=mutated_document(base_train), task=st.sampled_from(["detection", "instance_segmentation"]))
    def check(data: bytes, task: str) -> None:
        log = IssueLog()
        check_split(data, "train", "annotations/train.json", log, task=task)
        assert_report_is_sound(report_of(log))

    check()


def test_arbitrary_json_documents_never_raise() -> None:
    @FAST
    @given(doc=JSON_VALUES)
    def check(doc: Any) -> None:
        log = IssueLog()
        check_split(json.dumps(doc).encode("utf-8", "surrogatepass"), "val", "annotations/val.json", log)
        assert_report_is_sound(report_of(log))

    check()


def test_manifests_never_raise() -> None:
    base = {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json"}

    @FAST
    @given(extra=st.dictionaries(st.sampled_from(["name", "version", "train", "val", "images", "task", "training",
                                                  "gate", "format", "x"]), JSON_VALUES, max_size=3),
           tail=st.sampled_from([b"", b"NaN", b"\xff", b"[" * 5000, b"\x00"]))
    def check(extra: dict[str, Any], tail: bytes) -> None:
        raw = json.dumps({**base, **extra}).encode("utf-8", "surrogatepass") + tail
        _, problems = parse_manifest(raw)
        assert {code for code, _, _ in problems} <= KNOWN

    check()


def test_image_bytes_are_accepted_or_rejected_never_raise() -> None:
    @FAST
    @given(data=mutated_image(ORIGINAL_IMAGES))
    def check(data: bytes) -> None:
        probe = _probe(io.BytesIO(data), "images/x.jpg", decode=True)
        assert (probe.error is None) == (probe.size is not None)
        try:
            image = rule.load_rgb(data, verify=True)
        except rule.ImageRejected as exc:
            assert exc.reason in {"empty", "unsupported_format", "too_large", "bad_shape", "corrupt"}
            assert probe.error is not None, f"the validator accepted what the rule refuses: {exc}"
        else:
            assert image.mode == "RGB" and probe.error is None and probe.size == image.size

    check()


def _dataset_copy(base: Path, target: Path, train: bytes, manifest: bytes | None, image: bytes | None) -> None:
    shutil.copytree(base, target)
    (target / "annotations/train.json").write_bytes(train)
    if manifest is not None:
        (target / "manifest.json").write_bytes(manifest)
    if image is not None:
        first = sorted((target / "images").rglob("*.jpg"))[0]
        first.write_bytes(image)


MANIFESTS = st.one_of(st.none(), st.sampled_from([
    b'{"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json", "gate": '
    b'{"min_map": NaN}}',
    b'{"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json", "x": '
    + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json", "training": '
    b'{"max_iter": ' + b"9" * 5000 + b"}}",
    b'{"name": "\\ud800", "version": "v1", "format": "coco", "train": "annotations/train.json"}',
    b'\xef\xbb\xbf{"name": "shapes"}', b"", b"[]", b'{"name": "shapes", "name": "other"}',
]))


def test_validate_local_never_raises(base_dataset: Path, base_train: dict[str, Any]) -> None:
    @FEW
    @given(train=mutated_document(base_train, damage=False) | mutated_document(base_train), manifest=MANIFESTS,
           image=st.none() | mutated_image(ORIGINAL_IMAGES))
    def check(train: bytes, manifest: bytes | None, image: bytes | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "ds"
            _dataset_copy(base_dataset, root, train, manifest, image)
            assert_report_is_sound(validate_local(root))

    check()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("s3")
        for bucket in ("data", "artifacts"):
            client.create_bucket(Bucket=bucket)
        yield client


def test_the_lambda_service_always_writes_a_report(s3: Any, base_dataset: Path,
                                                   base_train: dict[str, Any]) -> None:
    prefix = "datasets/shapes/v1/"
    for path in base_dataset.rglob("*"):
        if path.is_file():
            s3.put_object(Bucket="data", Key=prefix + path.relative_to(base_dataset).as_posix(),
                          Body=path.read_bytes())
    first_image = sorted(p.relative_to(base_dataset).as_posix() for p in base_dataset.rglob("*.jpg"))[0]
    original_image = (base_dataset / first_image).read_bytes()
    original_manifest = (base_dataset / "manifest.json").read_bytes()
    runs = iter(range(10_000))

    @FEW
    @given(train=mutated_document(base_train, damage=False) | mutated_document(base_train), manifest=MANIFESTS,
           image=st.none() | mutated_image(ORIGINAL_IMAGES))
    def check(train: bytes, manifest: bytes | None, image: bytes | None) -> None:
        s3.put_object(Bucket="data", Key=prefix + "annotations/train.json", Body=train)
        s3.put_object(Bucket="data", Key=prefix + "manifest.json", Body=manifest or original_manifest)
        s3.put_object(Bucket="data", Key=prefix + first_image, Body=image or original_image)
        event = ValidateDatasetEvent(bucket="data", prefix=prefix, run_id=f"prop-{next(runs)}")
        summary = validate_dataset(event, s3, "artifacts")
        stored = s3.get_object(Bucket="artifacts", Key=report_key(event.run_id))["Body"].read()
        report = ValidationReport.model_validate_json(stored)
        assert_report_is_sound(report)
        assert summary.valid == report.valid and summary.error_count == report.error_count
        assert all(i.code in {str(c) for c in KNOWN} for i in summary.first_errors)

    check()
