"""Issue 21: every image checked, pinned to its listed version, snapshotted, and merged back (moto S3).

The validate service lists once and either checks every image inline or writes the Distributed Map's
items; the check_images Lambda checks a batch; summarize_images merges the ResultWriter's files (AWS's
format: a manifest naming result files, each a JSON array of child records whose Output is a string).
The Map itself is helper A's interpreter; here its ResultWriter output is written the way Step
Functions writes it, from the real batch Lambda's returns.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from PIL import Image

from d2ops import synth
from d2ops_core import s3_layout
from d2ops_core.validation import Code, ValidationReport, validate_local
from d2ops_core.validation.inventory import ImageBatchResult, ImageItem, inventory_digest, read_inventory
from d2ops_core.validation.merge import ImageChecksIncomplete
from d2ops_core.validation.sources import S3Source
from tests.fixtures.pipeline import support

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "datasets/shapes/v1/"
IMAGE_CODES = {Code.IMAGE_UNREADABLE, Code.IMAGE_SIZE_MISMATCH, Code.IMAGE_EXTENSION_MISMATCH,
               Code.IMAGE_FORMAT_UNSUPPORTED, Code.IMAGE_MISSING, Code.SPLIT_OVERLAP, Code.OBJECT_CHANGED}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    monkeypatch.setenv("ARTIFACTS_BUCKET", "artifacts")
    with support.image_check_buckets(monkeypatch) as client:
        yield client


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    synth.generate(root, images=8, seed=1, size=48)
    return root


def upload(s3: Any, root: Path, bucket: str = "data", prefix: str = PREFIX) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")
    for path in [*files, root / "manifest.json"]:
        s3.put_object(Bucket=bucket, Key=prefix + path.relative_to(root).as_posix(), Body=path.read_bytes())


def service() -> Any:
    return importlib.import_module("validate_dataset.service")


def event(run_id: str) -> Any:
    models = importlib.import_module("validate_dataset.models")
    return models.ValidateDatasetEvent(bucket="data", prefix=PREFIX, run_id=run_id)


def items_of(s3: Any, run_id: str) -> list[ImageItem]:
    body = s3.get_object(Bucket="artifacts", Key=s3_layout.image_items_key(run_id))["Body"].read()
    return [ImageItem.model_validate_json(line) for line in body.splitlines() if line.strip()]


def check_batch(items: list[ImageItem], run_id: str) -> ImageBatchResult:
    """The check_images Lambda's handler on one batch, as the Map invokes it."""
    handler = importlib.import_module("check_images.handler")
    context = SimpleNamespace(function_name="check_images", memory_limit_in_mb=1024, aws_request_id="req-1",
                              invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:check_images")
    batch = {"BatchInput": {"bucket": "data", "prefix": PREFIX, "run_id": run_id},
             "Items": [item.model_dump(mode="json") for item in items]}
    return ImageBatchResult.model_validate(handler.handler(batch, context))


def output(batch: ImageBatchResult, i: int) -> str:
    """A child's Output string: the Lambda's return, or (odd children) the lambda:invoke envelope around it."""
    if i % 2:
        return json.dumps({"ExecutedVersion": "$LATEST", "Payload": batch.model_dump(mode="json"),
                           "SdkHttpMetadata": {"HttpStatusCode": 200}, "StatusCode": 200}, ensure_ascii=False)
    return batch.model_dump_json()


def write_result_writer(s3: Any, run_id: str, batches: list[ImageBatchResult], per_file: int = 2,
                        failed: bool = False) -> dict[str, str]:
    """What Step Functions' ResultWriter leaves: <prefix>/<map run id>/manifest.json and SUCCEEDED_<n>.json."""
    prefix = f"{s3_layout.image_results_prefix(run_id)}/0a1b2c3d-map-run"
    files = []
    for n in range(0, len(batches), per_file):
        records = [{"ExecutionArn": f"arn:aws:states:us-east-1:123456789012:execution:sm/map:{i}",
                    "Input": json.dumps({"Items": []}), "InputDetails": {"Included": True},
                    "Name": f"child-{i}", "Output": output(batch, i), "OutputDetails": {"Included": True},
                    "RedriveCount": 0, "RedriveStatus": "NOT_REDRIVABLE", "Status": "SUCCEEDED",
                    "StartDate": "2026-11-26T20:00:00.000Z", "StopDate": "2026-11-26T20:00:01.000Z"}
                   for i, batch in enumerate(batches[n:n + per_file], n)]
        body = json.dumps(records, ensure_ascii=False).encode()
        key = f"{prefix}/SUCCEEDED_{n // per_file}.json"
        s3.put_object(Bucket="artifacts", Key=key, Body=body)
        files.append({"Key": key, "Size": len(body)})
    manifest = {"DestinationBucket": "artifacts", "MapRunArn": "arn:aws:states:us-east-1:123456789012:mapRun:sm/m:1",
                "ResultFiles": {"FAILED": [{"Key": f"{prefix}/FAILED_0.json", "Size": 2}] if failed else [],
                                "PENDING": [], "SUCCEEDED": files}}
    s3.put_object(Bucket="artifacts", Key=f"{prefix}/manifest.json", Body=json.dumps(manifest).encode())
    return {"Bucket": "artifacts", "Key": f"{prefix}/manifest.json"}


def summarize(s3: Any, run_id: str, details: dict[str, str]) -> Any:
    models = importlib.import_module("validate_dataset.models")
    return service().summarize_images(models.SummarizeImagesEvent(bucket="data", prefix=PREFIX, run_id=run_id,
                                                                   result_writer=details), s3, "artifacts")


def through_the_map(s3: Any, run_id: str, *, batch_size: int = 3) -> tuple[Any, Any]:
    """Validate with no inline images, check every batch, merge: (pending summary, final summary)."""
    pending = service().validate_dataset(event(run_id), s3, "artifacts", inline_limit=0)
    assert pending.images_pending and pending.valid and pending.inventory_digest is None
    assert pending.image_results_prefix == s3_layout.image_results_prefix(run_id)  # the Map's ResultWriter Prefix
    items = items_of(s3, run_id)
    batches = [check_batch(items[i:i + batch_size], run_id) for i in range(0, len(items), batch_size)]
    return pending, summarize(s3, run_id, write_result_writer(s3, run_id, batches))


def image_issues(report: ValidationReport) -> list[tuple[str, str | None, str | None, str]]:
    return [(str(i.code), i.file, i.path, i.message) for i in [*report.errors, *report.warnings]
            if i.code in IMAGE_CODES]


def stored_report(s3: Any, run_id: str) -> ValidationReport:
    body = s3.get_object(Bucket="artifacts", Key=s3_layout.validation_report_key(run_id))["Body"].read()
    return ValidationReport.model_validate_json(body)


def jpeg(size: tuple[int, int], orientation: int | None = None, color: str = "red") -> bytes:
    buf = io.BytesIO()
    image = Image.new("RGB", size, color)
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    image.save(buf, format="JPEG", exif=exif.tobytes())
    return buf.getvalue()


def png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, "blue").save(buf, format="PNG")
    return buf.getvalue()


def break_dataset(root: Path) -> None:
    """A truncated JPEG, a wrong size, an EXIF-rotated wrong size, a PNG named .jpg, a non-ASCII key, a
    val image with a train image's bytes under another name."""
    images = root / "images"
    (images / "train/000001.jpg").write_bytes((images / "train/000001.jpg").read_bytes()[:300])
    (images / "train/000002.jpg").write_bytes(jpeg((64, 40)))
    (images / "train/000003.jpg").write_bytes(jpeg((40, 48), orientation=6))  # upright 48x40, declared 48x48
    (images / "train/000004.jpg").write_bytes(png((48, 48)))
    train = json.loads((root / "annotations/train.json").read_text())
    (images / "train/000000.jpg").rename(images / "train/café ü 0.jpg")
    train["images"][0]["file_name"] = "train/café ü 0.jpg"
    (root / "annotations/train.json").write_text(json.dumps(train, ensure_ascii=False))
    shutil.copyfile(images / "train/000005.jpg", images / "val/000006.jpg")


def test_the_batch_path_reports_what_the_local_validator_reports(s3: Any, dataset: Path) -> None:
    """Same codes, locations and messages from the Map as from `d2ops validate DIR`, over several result files.

    Catches: a batch rule that differs from the local one (one rule, one place), locations lost in the
    merge, result files after the first ignored, Output read as an object instead of a JSON string.
    """
    break_dataset(dataset)
    local = validate_local(dataset)
    upload(s3, dataset)
    _, final = through_the_map(s3, "run-bad", batch_size=2)
    merged = stored_report(s3, "run-bad")

    expected = image_issues(local)
    assert {c for c, *_ in expected} >= {"IMAGE_UNREADABLE", "IMAGE_SIZE_MISMATCH", "IMAGE_EXTENSION_MISMATCH",
                                         "SPLIT_OVERLAP"}
    assert image_issues(merged) == expected
    assert merged.issue_counts == local.issue_counts and not final.valid
    assert final.error_count == local.error_count and final.images_pending is False
    rotated = next(m for c, _, p, m in expected if c == "IMAGE_SIZE_MISMATCH" and "000003" in m)
    assert "after its EXIF orientation is applied" in rotated
    overlap = [(f, p, m) for c, f, p, m in expected if c == "SPLIT_OVERLAP"]
    assert overlap == [("annotations/val.json", "images[0].file_name",
                        f"images/val/000006.jpg has the same content as train's images/train/000005.jpg (sha256 "
                        f"{hashlib.sha256((dataset / 'images/val/000006.jpg').read_bytes()).hexdigest()[:16]}...)")]
    assert merged.images.mode == local.images.mode == "all"
    assert (merged.images.probed, merged.images.decoded) == (local.images.probed, local.images.decoded)


def test_a_valid_version_through_the_map_gets_its_snapshot_and_inventory(s3: Any, dataset: Path) -> None:
    """The final summary's digest is the stored inventory's; every listed object is in the snapshot, tagged.

    Catches: inventory unsorted or missing the image hashes, a digest of something else, copies untagged
    (the lifecycle rule would never expire them), a non-ASCII key mangled on the way through JSON.
    """
    images = dataset / "images/train"
    (images / "000000.jpg").rename(images / "ünï 0.jpg")
    train = json.loads((dataset / "annotations/train.json").read_text())
    train["images"][0]["file_name"] = "train/ünï 0.jpg"
    (dataset / "annotations/train.json").write_text(json.dumps(train))
    upload(s3, dataset)
    pending, final = through_the_map(s3, "run-ok")
    assert pending.image_items_bucket == "artifacts" and pending.image_items_key == s3_layout.image_items_key("run-ok")
    assert final.valid and final.image_count == 8 and final.snapshot_uri == "s3://artifacts/runs/run-ok/dataset/"
    data = s3.get_object(Bucket="artifacts", Key=s3_layout.inventory_key("run-ok"))["Body"].read()
    assert final.inventory_digest == inventory_digest(data)
    entries = list(read_inventory(data.splitlines()))
    keys = [e.key for e in entries]
    assert keys == sorted(keys) and "images/train/ünï 0.jpg" in keys and "annotations/val.json" in keys
    for entry in entries:
        original = (dataset / entry.key).read_bytes()
        assert entry.sha256 == hashlib.sha256(original).hexdigest() and entry.version_id
        copy = s3.get_object(Bucket="artifacts", Key=f"runs/run-ok/dataset/{entry.key}")
        assert copy["Body"].read() == original
        tags = s3.get_object_tagging(Bucket="artifacts", Key=f"runs/run-ok/dataset/{entry.key}")["TagSet"]
        assert tags == [{"Key": "d2ops-snapshot", "Value": "true"}]
    assert stored_report(s3, "run-ok").valid


def test_an_image_overwritten_after_listing_never_reaches_the_snapshot(s3: Any, dataset: Path) -> None:
    """A new version put between validation's listing and the batch: the listed bytes are checked and copied.

    Catches: reads or copies without the listed VersionId (the new, unvalidated bytes would be copied).
    """
    upload(s3, dataset)
    service().validate_dataset(event("run-race"), s3, "artifacts", inline_limit=0)
    items = items_of(s3, "run-race")
    target = items[0].key
    original = (dataset / target).read_bytes()
    s3.put_object(Bucket="data", Key=PREFIX + target, Body=jpeg((48, 48), color="green"))  # mid-way
    result = check_batch(items, "run-race")
    assert result.issues == []
    [checked] = [c for c in result.images if c.entry.key == target]
    assert checked.copied and checked.entry.sha256 == hashlib.sha256(original).hexdigest()
    assert s3.get_object(Bucket="artifacts", Key=f"runs/run-race/dataset/{target}")["Body"].read() == original


def test_a_deleted_version_is_object_changed_naming_the_key(s3: Any, dataset: Path) -> None:
    """The listed version deleted for good before its batch: OBJECT_CHANGED on the key, no copy, run rejected.

    Catches: a vanished object reported as an unreadable image at an annotation location (or not at all).
    """
    upload(s3, dataset)
    service().validate_dataset(event("run-gone"), s3, "artifacts", inline_limit=0)
    items = items_of(s3, "run-gone")
    gone = items[1]
    s3.delete_object(Bucket="data", Key=PREFIX + gone.key, VersionId=gone.version_id)
    result = check_batch(items, "run-gone")
    [issue] = result.issues
    assert (issue.code, issue.file, issue.path) == (Code.OBJECT_CHANGED, gone.key, None)
    assert gone.key in issue.message
    assert not next(c for c in result.images if c.entry.key == gone.key).copied
    final = summarize(s3, "run-gone", write_result_writer(s3, "run-gone", [result]))
    assert not final.valid and final.error_codes == {"OBJECT_CHANGED": 1} and final.snapshot_uri is None


def test_an_unversioned_object_overwritten_after_listing_is_object_changed(s3: Any, dataset: Path) -> None:
    """Without versions the ETag pins the object: If-Match fails on the new bytes.

    Catches: GETs without If-Match (the overwritten bytes would be checked as if they had been listed).
    """
    s3.create_bucket(Bucket="plain")
    upload(s3, dataset, bucket="plain")
    source = S3Source(s3, "plain", PREFIX)
    source.list_files()
    assert source.entry("manifest.json").version_id is None and source.entry("manifest.json").etag
    s3.put_object(Bucket="plain", Key=PREFIX + "images/train/000001.jpg", Body=jpeg((48, 48), color="green"))
    probe = source.probe_image("images/train/000001.jpg")
    assert probe.reason == "changed" and "images/train/000001.jpg" in (probe.error or "")
    assert source.probe_image("images/train/000002.jpg").error is None


def test_an_annotation_file_deleted_after_listing_is_object_changed(s3: Any, dataset: Path) -> None:
    """The inline path reads annotations pinned too: val.json's listed version deleted between the listing
    and its read (an S3 client hook deletes it just before the GET) rejects the run naming the file.

    Catches: annotation reads without the listed VersionId (the file would just read as missing/other bytes).
    """
    upload(s3, dataset)
    client = boto3.client("s3")
    key = PREFIX + "annotations/val.json"

    def delete_listed_version(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key") == key and params.get("VersionId"):
            s3.delete_object(Bucket="data", Key=key, VersionId=params["VersionId"])

    client.meta.events.register("before-parameter-build.s3.GetObject", delete_listed_version)
    summary = service().validate_dataset(event("run-ann"), client, "artifacts", inline_limit=100)
    assert not summary.valid and summary.error_codes.get("OBJECT_CHANGED") == 1
    [issue] = [i for i in stored_report(s3, "run-ann").errors if i.code is Code.OBJECT_CHANGED]
    assert issue.file == "annotations/val.json" and "annotations/val.json" in issue.message
    assert summary.snapshot_uri is None


def test_inline_fast_path_checks_and_copies_every_image(s3: Any, dataset: Path) -> None:
    """Up to INLINE_IMAGE_LIMIT images the validate Lambda finishes alone: final summary, snapshot, inventory."""
    upload(s3, dataset)
    summary = service().validate_dataset(event("run-inline"), s3, "artifacts", inline_limit=8)
    assert summary.valid and not summary.images_pending and summary.image_count == 8
    data = s3.get_object(Bucket="artifacts", Key=s3_layout.inventory_key("run-inline"))["Body"].read()
    assert summary.inventory_digest == inventory_digest(data) and len(data.splitlines()) == 8 + 3
    copied = s3.list_objects_v2(Bucket="artifacts", Prefix="runs/run-inline/dataset/")["KeyCount"]
    assert copied == 8 + 3
    # one image over the limit: the Map's items instead, nothing checked inline
    summary = service().validate_dataset(event("run-map"), s3, "artifacts", inline_limit=7)
    assert summary.images_pending and summary.inventory_uri is None and len(items_of(s3, "run-map")) == 8
    assert s3.list_objects_v2(Bucket="artifacts", Prefix="runs/run-map/dataset/images/")["KeyCount"] == 0


def test_a_derived_val_through_the_map_is_the_split_the_local_validator_and_the_trainer_derive(
        s3: Any, tmp_path: Path) -> None:
    """A train-only version past the inline limit: the split is keyed on the images' SHA-256s, which only the
    batches compute, so the summarize step derives it (from the snapshot's train file) and records the same
    split, statistics and warnings as `d2ops validate DIR` and the trainer's model_code.dataset_version.

    Catches: the Map path recording no split (or one keyed on something else), the derived sides' statistics
    or cross-split warnings lost in the merge.
    """
    from model_code.dataset_version import open_dataset_version, read_coco
    from tests.unit.test_validation_split import train_only

    root = train_only(tmp_path / "ds", images=24, seed=5)
    local = validate_local(root)
    assert local.valid and local.derived_split is not None, local.describe()
    upload(s3, root)
    pending = service().validate_dataset(event("run-derived"), s3, "artifacts", inline_limit=0)
    assert pending.images_pending and pending.derived_split is None
    assert stored_report(s3, "run-derived").derived_split_pending
    items = items_of(s3, "run-derived")
    batches = [check_batch(items[i:i + 5], "run-derived") for i in range(0, len(items), 5)]
    final = summarize(s3, "run-derived", write_result_writer(s3, "run-derived", batches))
    merged = stored_report(s3, "run-derived")
    assert final.valid and final.derived_split == merged.derived_split == local.derived_split
    assert not merged.derived_split_pending
    assert merged.splits == local.splits and merged.issue_counts == local.issue_counts
    version = open_dataset_version(root)
    val_names = sorted(im["file_name"] for im in read_coco(version.val_json)["images"])
    assert merged.derived_split is not None
    assert merged.derived_split.val_digest == hashlib.sha256("\n".join(val_names).encode()).hexdigest()


def test_invalid_annotations_are_not_handed_to_the_map(s3: Any, dataset: Path) -> None:
    """A version rejected on its annotations gets a final (invalid) summary, no items and no snapshot."""
    train = json.loads((dataset / "annotations/train.json").read_text())
    train["annotations"][0]["bbox"][2] = -1
    (dataset / "annotations/train.json").write_text(json.dumps(train))
    upload(s3, dataset)
    summary = service().validate_dataset(event("run-rej"), s3, "artifacts", inline_limit=0)
    assert not summary.valid and not summary.images_pending and summary.snapshot_uri is None
    assert s3.list_objects_v2(Bucket="artifacts", Prefix="runs/run-rej/dataset/")["KeyCount"] == 0


def test_a_batch_result_stays_within_the_state_payload_limit(s3: Any) -> None:
    """50 items at worst (1,000-character keys, two entries each, all corrupt): under 256 KB.

    Catches: uncapped messages or per-image payloads that would make Step Functions fail the Map.
    """
    long_dir = "d" * 900
    items = []
    for i in range(50):
        key = f"images/{long_dir}/{i:05d}-{'x' * 60}.jpg"
        s3.put_object(Bucket="data", Key=PREFIX + key, Body=b"\xff\xd8\xff" + b"\x00" * 5000)
        head = s3.head_object(Bucket="data", Key=PREFIX + key)
        locations = [{"file": "annotations/train.json", "split": "train", "index": i, "width": 48, "height": 48},
                     {"file": "annotations/val.json", "split": "val", "index": i, "width": 48, "height": 48}]
        items.append(ImageItem.model_validate({"key": key, "version_id": head["VersionId"],
                                               "etag": head["ETag"].strip('"'), "size": 5003,
                                               "locations": locations}))
    result = check_batch(items, "run-big")
    assert len(result.issues) == 100 and all(i.code is Code.IMAGE_UNREADABLE for i in result.issues)
    assert len(result.model_dump_json().encode()) < 256 * 1024


def test_merge_refuses_incomplete_results(s3: Any, dataset: Path) -> None:
    """A FAILED result file or a batch missing from the results: ImageChecksIncomplete, never a valid summary."""
    upload(s3, dataset)
    service().validate_dataset(event("run-inc"), s3, "artifacts", inline_limit=0)
    items = items_of(s3, "run-inc")
    batches = [check_batch(items[i:i + 4], "run-inc") for i in range(0, len(items), 4)]
    with pytest.raises(ImageChecksIncomplete, match="failed"):
        summarize(s3, "run-inc", write_result_writer(s3, "run-inc", batches, failed=True))
    with pytest.raises(ImageChecksIncomplete, match="4 image files, the Map was given 8"):
        summarize(s3, "run-inc", write_result_writer(s3, "run-inc", batches[:1]))


def test_result_files_are_parsed_as_a_stream_whatever_the_chunking() -> None:
    """A result file read in chunks that cut strings, numbers and UTF-8 characters gives the same records.

    Catches: a parser that loses or merges elements at chunk borders, or decodes UTF-8 per chunk.
    """
    from d2ops_core.validation.merge import iter_json_array

    records = [{"Output": json.dumps({"images": [], "issues": []}), "Name": "ünï-é", "n": 12345}, [1, 2.5e3], "x"]
    data = json.dumps(records, ensure_ascii=False).encode()
    for size in (1, 2, 3, 7, len(data)):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        assert list(iter_json_array(chunks, "f")) == records
    assert list(iter_json_array([b" [ ] "], "f")) == []
    for bad, words in ((b'{"a": 1}', "not a JSON array"), (b"[1, 2", "ends before"), (b"[1] 2", "after"),
                       (b"[1, }", "malformed")):
        with pytest.raises(ValueError, match=words):
            list(iter_json_array([bad], "f"))


def test_the_merge_keeps_the_first_issues_of_each_code_whatever_the_batch_order() -> None:
    """With more issues than the cap, the kept ones are the first by file and entry index, counted all.

    Catches: keeping the first batches to finish (the report would differ from run to run and from
    the local validator's).
    """
    from d2ops_core.validation.images import merge_image_issues
    from d2ops_core.validation.report import Issue, IssueLog

    def issue(index: int) -> Issue:
        return Issue(code=Code.IMAGE_UNREADABLE, severity="error", message=f"m{index}", file="a.json",
                     path=f"images[{index}]")

    for order in ([5, 3, 11, 0, 2], [0, 2, 3, 5, 11], [11, 5, 3, 2, 0]):
        log = IssueLog(cap=3)
        merge_image_issues(log, (issue(i) for i in order))
        assert [i.path for i in log.kept] == ["images[0]", "images[2]", "images[3]"]
        assert log.counts[Code.IMAGE_UNREADABLE] == 5


def test_the_summarize_handler_takes_the_maps_output_and_counts_the_run_once(
        s3: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Both handlers as Step Functions calls them: validate (pending, no metrics yet), the Map's batches,
    then summarize with ``ResultWriterDetails`` (the validation metrics once, with the final verdict).

    Catches: a pending summary counted as a validated dataset (every large version counted twice), the
    summarize event not accepting the Map's output shape, metrics lost from the second handler.
    """
    from d2ops_core import pipeline_metrics as pm
    from tests.fixtures.emf import total

    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "validate_dataset")
    monkeypatch.setenv("MIN_MAP", "0.3")
    monkeypatch.setenv("MAX_REGRESSION", "0.01")
    monkeypatch.setenv("INLINE_IMAGE_LIMIT", "2")
    context = SimpleNamespace(function_name="validate_dataset", memory_limit_in_mb=1024, aws_request_id="req-1",
                              invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:validate_dataset")
    validate = importlib.reload(importlib.import_module("validate_dataset.handler"))
    upload(s3, dataset)
    run = {"bucket": "data", "prefix": PREFIX, "run_id": "run-handlers"}
    pending = validate.handler(run, context)
    assert pending["images_pending"] is True and pending["image_count"] == 8
    assert pending["image_check_concurrency"] == 100
    assert pending["image_items_key"] == s3_layout.image_items_key(run["run_id"])
    assert total(capsys.readouterr().out, pm.DATASETS_VALIDATED) == 0
    items = items_of(s3, "run-handlers")
    details = write_result_writer(s3, "run-handlers", [check_batch(items[:5], "run-handlers"),
                                                       check_batch(items[5:], "run-handlers")])
    summarize_handler = importlib.reload(importlib.import_module("validate_dataset.summarize_images"))
    final = summarize_handler.handler({**run, "result_writer": details}, context)
    assert final["valid"] is True and final["images_pending"] is False and final["inventory_digest"]
    out = capsys.readouterr().out
    assert (total(out, pm.DATASETS_VALIDATED), total(out, pm.DATASETS_REJECTED)) == (1, 0)
    assert total(out, pm.IMAGES_VALIDATED) == 8


def test_without_reading_images_overlap_is_by_name(dataset: Path) -> None:
    """`d2ops validate --no-images`: a val entry naming a train file is still SPLIT_OVERLAP, an error.

    Catches: the overlap check lost when no image bytes are read (it was content-only).
    """
    val = json.loads((dataset / "annotations/val.json").read_text())
    train = json.loads((dataset / "annotations/train.json").read_text())
    val["images"][1]["file_name"] = train["images"][2]["file_name"]
    (dataset / "annotations/val.json").write_text(json.dumps(val))
    report = validate_local(dataset, check_images=False)
    [issue] = [i for i in report.errors if i.code is Code.SPLIT_OVERLAP]
    assert (issue.file, issue.path) == ("annotations/val.json", "images[1].file_name")
    assert issue.message == f"images/{train['images'][2]['file_name']} is in train too"
    assert validate_local(dataset).has(Code.SPLIT_OVERLAP)  # and by content when the images are read


def test_a_file_changed_before_its_copy_is_not_handed_to_the_map(s3: Any, dataset: Path) -> None:
    """The manifest's listed version deleted just before its copy into the snapshot (a client hook): the
    summary is final and invalid (OBJECT_CHANGED), never images_pending with a run that cannot be valid.
    """
    upload(s3, dataset)
    client = boto3.client("s3")
    key = PREFIX + "manifest.json"

    def delete_listed_version(params: dict[str, Any], **_: Any) -> None:
        source = str(params.get("CopySource"))  # botocore has made the dict "bucket/key?versionId=..." by now
        if source.startswith(f"data/{key}?versionId="):
            s3.delete_object(Bucket="data", Key=key, VersionId=source.split("?versionId=", 1)[1])

    client.meta.events.register("before-parameter-build.s3.CopyObject", delete_listed_version)
    summary = service().validate_dataset(event("run-copy"), client, "artifacts", inline_limit=0)
    assert not summary.valid and not summary.images_pending and summary.error_codes == {"OBJECT_CHANGED": 1}
    assert summary.inventory_digest is not None and summary.snapshot_uri is None


def test_the_summarize_sample_event_is_valid_input(s3: Any) -> None:
    """`sam local invoke SummarizeImagesFunction -e events/validate_dataset/summarize_images.json` parses."""
    models = importlib.import_module("validate_dataset.models")
    sample = models.SummarizeImagesEvent.model_validate_json((ROOT / "events/validate_dataset/summarize_images.json")
                                                             .read_bytes())
    assert sample.run_id == support.RUN_ID
    assert sample.result_writer.Key.startswith(s3_layout.image_results_prefix(support.RUN_ID) + "/")


def test_an_image_over_16_mb_is_hashed_whole_and_judged_by_its_header(s3: Any) -> None:
    """Of a 17 MB PNG the first 16 MB are judged (header only, not decoded) and every byte is hashed.

    Catches: a hash of the first 16 MB only (the inventory would not pin the file's content).
    """
    import struct
    import zlib

    from d2ops_core.validation.sources import FULL_DECODE_BYTES

    small = png((48, 48))
    payload = b"\0" * (FULL_DECODE_BYTES + 1_000_000)
    chunk = struct.pack(">I", len(payload)) + b"prVt" + payload
    chunk += struct.pack(">I", zlib.crc32(b"prVt" + payload) & 0xFFFFFFFF)
    big = small[:-12] + chunk + small[-12:]  # after the pixels, before IEND
    s3.put_object(Bucket="data", Key=PREFIX + "images/big.png", Body=big)
    source = S3Source(s3, "data", PREFIX)
    source.list_files()
    probe = source.probe_image("images/big.png")
    assert probe.error is None and probe.size == (48, 48) and not probe.decoded
    assert probe.sha256 == hashlib.sha256(big).hexdigest()
    assert source.entry("images/big.png").sha256 == probe.sha256


def test_a_refused_snapshot_copy_fails_the_batch_naming_the_copy(s3: Any, dataset: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot bucket cannot be written (here: it does not exist): the batch raises DatasetUnreadable,
    which fails the Map (no tolerated failures), rather than passing images that were never copied."""
    from d2ops_core.validation import DatasetUnreadable

    upload(s3, dataset)
    service().validate_dataset(event("run-nocopy"), s3, "artifacts", inline_limit=0)
    items = items_of(s3, "run-nocopy")
    monkeypatch.setenv("ARTIFACTS_BUCKET", "no-such-snapshot-bucket")
    with pytest.raises(DatasetUnreadable, match=r"cannot copy s3://data/.* to s3://no-such-snapshot-bucket/.*NoSuchBucket"):
        check_batch(items[:2], "run-nocopy")


def _explain(s3: Any, run_id: str, error: str = "States.ExceedToleratedFailureThreshold") -> None:
    models = importlib.import_module("validate_dataset.models")
    service().summarize_images(models.SummarizeImagesEvent(
        bucket="data", prefix=PREFIX, run_id=run_id,
        map_error={"Error": error, "Cause": "The specified tolerated failure threshold was exceeded"}), s3, "artifacts")


def _failed_map_run(s3: Any, run_id: str, name: str, error: str, message: str, when: str = "1") -> None:
    """A failed Map Run's ResultWriter files: one FAILED child record with a Lambda error's Cause."""
    prefix = f"{s3_layout.image_results_prefix(run_id)}/{name}"
    cause = json.dumps({"errorMessage": message, "errorType": error, "requestId": "r", "stackTrace": ["  File x"]})
    record = {"ExecutionArn": f"arn:aws:states:us-east-1:123456789012:express:sm/ImageChecks:{name}", "Name": name,
              "Input": "{}", "InputDetails": {"Included": True}, "Status": "FAILED", "Error": error, "Cause": cause,
              "StartDate": "2026-11-26T20:00:00.000Z", "StopDate": "2026-11-26T20:00:01.000Z"}
    s3.put_object(Bucket="artifacts", Key=f"{prefix}/FAILED_0.json", Body=json.dumps([record]).encode())
    manifest = {"DestinationBucket": "artifacts", "MapRunArn": f"arn:aws:states:::mapRun:sm/ImageChecks:{name}",
                "ResultFiles": {"FAILED": [{"Key": f"{prefix}/FAILED_0.json", "Size": 10}], "PENDING": [],
                                "SUCCEEDED": []}}
    s3.put_object(Bucket="artifacts", Key=f"{prefix}/manifest.json", Body=json.dumps(manifest).encode())


def test_a_failed_map_is_explained_by_its_first_failed_batch(s3: Any) -> None:
    """The Map's own error says only that the threshold was exceeded: the step raises the failed batch's
    error, from the newest Map Run's FAILED file; a batch that could not read the data is DatasetUnreadable.

    Catches: the Map's generic Cause passed on; an older Map Run (a redrive's predecessor) read instead of
    the newest; the Lambda's stack trace in the message; a refusal to read the data reported as a crash.
    """
    from d2ops_core.validation import DatasetUnreadable

    service_module = service()
    with pytest.raises(service_module.ImageChecksFailed, match="before writing any result"):
        _explain(s3, "run-x")
    _failed_map_run(s3, "run-x", "z-old-run", "ImageCheckCrashed", "an older failure")
    time.sleep(0.05)  # LastModified orders the Map Runs (names are UUIDs): keep them apart
    _failed_map_run(s3, "run-x", "a-new-run", "MemoryError", "out of memory in batch 7")
    with pytest.raises(service_module.ImageChecksFailed) as failed:
        _explain(s3, "run-x")
    message = str(failed.value)
    assert "MemoryError: out of memory in batch 7" in message and "File x" not in message, message
    assert "a-new-run/manifest.json" in message
    _failed_map_run(s3, "run-y", "m", "DatasetUnreadable", "access denied reading s3://data/datasets/a.jpg")
    with pytest.raises(DatasetUnreadable, match=re.escape("access denied reading s3://data/datasets/a.jpg")):
        _explain(s3, "run-y")


def test_results_are_held_to_the_items_the_map_was_given(s3: Any, dataset: Path) -> None:
    """A result naming another image or another version, a passed image missing from the snapshot, or a
    manifest outside the run's results prefix is refused: the counts balancing is not enough.

    Catches: a merge that only counts answers (a batch skipping A and reporting B passes), that takes the
    version from the batch's word, that ignores `copied`, or that reads results from wherever it is told.
    """
    upload(s3, dataset)
    service().validate_dataset(event("run-f"), s3, "artifacts", inline_limit=0)
    items = items_of(s3, "run-f")
    batches = [check_batch(items[i:i + 4], "run-f") for i in range(0, len(items), 4)]
    assert all(image.copied for batch in batches for image in batch.images)

    def tampered(change: Any) -> list[ImageBatchResult]:
        first = batches[0].images[0]
        images = [first.model_copy(update=change(first)), *batches[0].images[1:]]
        return [batches[0].model_copy(update={"images": images}), *batches[1:]]

    renamed = tampered(lambda im: {"entry": im.entry.model_copy(update={"key": "images/elsewhere.jpg"})})
    with pytest.raises(ImageChecksIncomplete, match=re.escape("images/elsewhere.jpg, which was not an item")):
        summarize(s3, "run-f", write_result_writer(s3, "run-f", renamed))
    other_version = tampered(lambda im: {"entry": im.entry.model_copy(update={"version_id": "v-forged"})})
    with pytest.raises(ImageChecksIncomplete, match="at version v-forged"):
        summarize(s3, "run-f", write_result_writer(s3, "run-f", other_version))
    not_copied = tampered(lambda im: {"copied": False})
    with pytest.raises(ImageChecksIncomplete, match="not in the run's snapshot"):
        summarize(s3, "run-f", write_result_writer(s3, "run-f", not_copied))
    elsewhere = write_result_writer(s3, "run-other", batches)  # another run's results
    with pytest.raises(ImageChecksIncomplete, match="expected under"):
        summarize(s3, "run-f", elsewhere)
    assert summarize(s3, "run-f", write_result_writer(s3, "run-f", batches)).valid  # the honest results pass
