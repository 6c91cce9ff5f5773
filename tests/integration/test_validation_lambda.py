"""The validate_dataset Lambda and validate_s3 against a real S3 API (moto's server on loopback).

The handler runs unmodified in-process and reaches S3 through boto3 and AWS_ENDPOINT_URL,
exactly as the offline runtime runs it.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from PIL import Image

from d2ops import synth
from d2ops_core import pipeline_metrics as pm
from d2ops_core.validation import Code, DatasetUnreadable, ValidationReport, validate_s3
from tests.fixtures.emf import emf_metrics, total
from tests.fixtures.moto_server import moto_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events/validate_dataset"
ARTIFACTS = "d2ops-artifacts-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url, pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "ARTIFACTS_BUCKET": ARTIFACTS,
            "POWERTOOLS_SERVICE_NAME": "validate_dataset", "POWERTOOLS_TRACE_DISABLED": "true",
            "MIN_MAP": "0.30", "MAX_REGRESSION": "0.01",  # the stack's gate (template.yaml)
        }.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.syspath_prepend(str(ROOT / "functions/validate_dataset"))
        yield url


@pytest.fixture(scope="module")
def s3(s3_endpoint: str) -> Any:
    client = boto3.client("s3")
    client.create_bucket(Bucket=ARTIFACTS)
    return client


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3ds") / "ds"
    synth.generate(root, images=16, seed=2, size=64)
    return root


def ensure_bucket(s3: Any, bucket: str) -> None:
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)


def upload(s3: Any, root: Path, bucket: str, prefix: str, *, skip: tuple[str, ...] = ()) -> None:
    ensure_bucket(s3, bucket)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")
    for path in [*files, root / "manifest.json"]:  # the manifest goes last, as the contract says
        rel = path.relative_to(root).as_posix()
        if rel not in skip and path.exists():
            s3.put_object(Bucket=bucket, Key=prefix + rel, Body=path.read_bytes())


def lambda_context() -> Any:
    # The Lambda runtime's context object cannot exist here; these are the attributes Powertools reads.
    return SimpleNamespace(function_name="validate_dataset", memory_limit_in_mb=1024, aws_request_id="req-1",
                           invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:validate_dataset")


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


@pytest.fixture(scope="module")
def handler_module(s3: Any) -> Any:
    # Reloaded: the offline runtime may have imported it in this process already, and Powertools reads
    # POWERTOOLS_SERVICE_NAME (the `service` dimension) when the module creates its Metrics.
    return importlib.reload(importlib.import_module("validate_dataset.handler"))


def test_handler_validates_the_sample_event_and_stores_the_report(s3: Any, dataset: Path, handler_module: Any,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    event = load_event("valid.json")
    upload(s3, dataset, event["bucket"], event["prefix"])
    summary = handler_module.handler(event, lambda_context())

    assert summary["valid"] is True and summary["error_count"] == 0 and summary["first_errors"] == []
    assert summary["dataset"] == {"name": "shapes", "version": "v1"}
    assert summary["counts"]["train_images"] + summary["counts"]["val_images"] == 16
    assert summary["manifest"] == {"task": "detection", "training": {}}
    key = f"runs/{event['run_id']}/validation/report.json"
    assert summary["report_uri"] == f"s3://{ARTIFACTS}/{key}"
    assert len(json.dumps(summary)) < 4096  # stays a small state payload
    report = ValidationReport.model_validate_json(s3.get_object(Bucket=ARTIFACTS, Key=key)["Body"].read())
    # every image checked inline (16 <= INLINE_IMAGE_LIMIT), copied into the snapshot, in the inventory
    assert report.valid and report.images.mode == "all" and report.images.probed == 16
    assert summary["images_pending"] is False and summary["image_count"] == 16
    assert summary["snapshot_uri"] == f"s3://{ARTIFACTS}/runs/{event['run_id']}/dataset/"
    inventory = s3.get_object(Bucket=ARTIFACTS, Key=f"runs/{event['run_id']}/inventory.jsonl")["Body"].read()
    assert summary["inventory_digest"] == "sha256:" + hashlib.sha256(inventory).hexdigest()
    keys = [json.loads(line)["key"] for line in inventory.splitlines()]
    assert keys == sorted(keys) and len(keys) == 16 + 3 and "manifest.json" in keys
    copies = s3.list_objects_v2(Bucket=ARTIFACTS, Prefix=f"runs/{event['run_id']}/dataset/")["Contents"]
    assert sorted(o["Key"].split("/dataset/", 1)[1] for o in copies) == keys
    assert report.splits["train"].instances == summary["counts"]["train_instances"]
    # CloudWatch metrics as EMF on stdout (d2ops_core.pipeline_metrics names).
    out = capsys.readouterr().out
    assert (total(out, pm.DATASETS_VALIDATED), total(out, pm.DATASETS_REJECTED)) == (1, 0)
    assert total(out, pm.IMAGES_VALIDATED, service="validate_dataset") == 16
    assert total(out, pm.INSTANCES_VALIDATED) == sum(s.instances for s in report.splits.values()) > 0
    assert total(out, pm.DATASET_ERRORS) == 0


def test_handler_reports_invalid_data_as_a_normal_result(s3: Any, dataset: Path, handler_module: Any,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    broken = tmp_path / "ds"
    shutil.copytree(dataset, broken)
    doc = json.loads((broken / "annotations/train.json").read_text())
    for ann in doc["annotations"][:8]:
        ann["bbox"][2] = -1
    (broken / "annotations/train.json").write_text(json.dumps(doc))
    (broken / "images/train/000001.jpg").write_bytes(b"\xff\xd8\xff garbage")
    event = {**load_event("valid.json"), "prefix": "datasets/shapes/v2/", "run_id": "shapes-v2-broken"}
    (broken / "manifest.json").write_text(json.dumps({**json.loads((broken / "manifest.json").read_text()),
                                                      "version": "v2"}))
    upload(s3, broken, event["bucket"], event["prefix"])
    summary = handler_module.handler(event, lambda_context())

    assert summary["valid"] is False and summary["error_count"] == 9
    assert len(summary["first_errors"]) == 5
    assert summary["first_errors"][0] == {
        "code": "BBOX_NON_POSITIVE_SIZE", "location": "annotations/train.json:annotations[0].bbox[2]",
        "message": summary["first_errors"][0]["message"]}
    report = json.loads(s3.get_object(Bucket=ARTIFACTS, Key="runs/shapes-v2-broken/validation/report.json")["Body"]
                        .read())
    errors = {c: n for c, n in report["issue_counts"].items() if c in {e["code"] for e in report["errors"]}}
    assert errors == {"BBOX_NON_POSITIVE_SIZE": 8, "IMAGE_UNREADABLE": 1}
    out = capsys.readouterr().out
    assert (total(out, pm.DATASETS_VALIDATED), total(out, pm.DATASETS_REJECTED)) == (1, 1)
    by_code = {dims[pm.ERROR_CODE]: value for name, dims, value in emf_metrics(out) if name == pm.DATASET_ERRORS}
    assert by_code == errors


def test_handler_raises_named_errors_for_a_missing_manifest_and_bucket(s3: Any, handler_module: Any) -> None:
    event = load_event("no_manifest.json")
    ensure_bucket(s3, event["bucket"])  # the bucket exists, the dataset version does not
    with pytest.raises(Exception) as missing:
        handler_module.handler(event, lambda_context())
    assert type(missing.value).__name__ == "DatasetNotFound"
    with pytest.raises(Exception) as unreadable:
        handler_module.handler({**event, "bucket": "no-such-bucket-here"}, lambda_context())
    assert type(unreadable.value).__name__ == "DatasetUnreadable"


def test_handler_rejects_a_malformed_event(handler_module: Any) -> None:
    with pytest.raises(Exception, match="run_id"):
        handler_module.handler({"bucket": "b-b-b", "prefix": "datasets/x/v1/", "run_id": "bad id!"}, lambda_context())


def count_calls(client: Any) -> Counter[str]:
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.s3.*", lambda model, **_: calls.update([model.name]))
    return calls


def test_s3_validation_lists_once_and_reads_every_image_once(s3: Any, tmp_path: Path) -> None:
    root = tmp_path / "many"
    synth.generate(root, images=24, seed=4, size=48, name="many")
    upload(s3, root, "data-many", "datasets/many/v1/")
    client = boto3.client("s3")
    calls = count_calls(client)
    report = validate_s3(client, "data-many", "datasets/many/v1/")
    assert report.valid, report.describe()
    assert calls["ListObjectVersions"] == 1  # one listing (a page per 1000 objects), never a request per image
    assert calls["ListObjectsV2"] == 0
    # the manifest, the two annotation files, then one pinned GET per image; no HEAD per image
    assert calls["GetObject"] == 1 + 2 + 24
    assert calls["HeadObject"] == 0
    assert report.images.probed == 24 and report.images.referenced == 24


def test_s3_validation_catches_missing_images_wrong_sizes_and_a_prefix_mismatch(s3: Any, dataset: Path) -> None:
    prefix = "datasets/other/v7/"
    upload(s3, dataset, "data-checks", prefix, skip=("images/train/000002.jpg",))
    buf = io.BytesIO()
    Image.new("RGB", (64, 40)).save(buf, format="PNG")
    s3.put_object(Bucket="data-checks", Key=prefix + "images/train/000003.jpg", Body=buf.getvalue())
    report = validate_s3(boto3.client("s3"), "data-checks", prefix)
    codes = {i.code: i for i in report.errors}
    assert codes[Code.MANIFEST_PREFIX_MISMATCH].file == "manifest.json"
    assert codes[Code.IMAGE_MISSING].path == "images[2].file_name"
    assert "64x40" in codes[Code.IMAGE_SIZE_MISMATCH].message
    assert report.images.missing == 1
    assert report.images.mode == "all"


def test_s3_images_are_decoded_in_full(s3: Any, dataset: Path) -> None:
    prefix = "datasets/shapes/v1/"
    upload(s3, dataset, "data-exif", prefix)
    buf = io.BytesIO()
    # A 100 kB ICC profile before the frame header: the image size is not in the first 64 kB.
    Image.new("RGB", (64, 64)).save(buf, format="JPEG", icc_profile=b"\0" * 100_000)
    s3.put_object(Bucket="data-exif", Key=prefix + "images/train/000000.jpg", Body=buf.getvalue())
    truncated = (dataset / "images/train/000001.jpg").read_bytes()[:400]  # header intact, image data cut
    s3.put_object(Bucket="data-exif", Key=prefix + "images/train/000001.jpg", Body=truncated)
    client = boto3.client("s3")
    calls = count_calls(client)
    report = validate_s3(client, "data-exif", prefix)
    [error] = report.errors
    assert (error.code, error.path) == (Code.IMAGE_UNREADABLE, "images[1]"), report.describe()
    assert "cannot decode" in error.message
    assert report.images.decoded == report.images.probed == report.images.referenced - 1
    assert calls["GetObject"] == 1 + 2 + report.images.referenced  # one GET per image, no second read


def test_s3_unreadable_bucket_raises(s3: Any) -> None:
    with pytest.raises(DatasetUnreadable, match="NoSuchBucket"):
        validate_s3(boto3.client("s3"), "missing-bucket-xyz", "datasets/a/v1/")


def test_s3_malformed_manifest_is_an_invalid_result(s3: Any, dataset: Path, handler_module: Any) -> None:
    event = {**load_event("valid.json"), "prefix": "datasets/shapes/v4/", "run_id": "shapes-v4-typo"}
    upload(s3, dataset, event["bucket"], event["prefix"], skip=("manifest.json",))
    s3.put_object(Bucket=event["bucket"], Key=event["prefix"] + "manifest.json",
                  Body=json.dumps({"name": "shapes", "version": "v4", "format": "coco",
                                   "train": "annotations/train.json", "training": {"max_iters": 10}}).encode())
    summary = handler_module.handler(event, lambda_context())
    assert summary["valid"] is False and summary["manifest"] is None
    assert summary["dataset"] == {"name": "shapes", "version": "v4"}
    assert summary["first_errors"] == [{"code": "MANIFEST_KEY_UNKNOWN", "location": "manifest.json:training.max_iters",
                                        "message": summary["first_errors"][0]["message"]}]


def test_cli_validates_an_s3_uri_in_another_process(s3: Any, dataset: Path, s3_endpoint: str) -> None:
    import os
    import subprocess

    upload(s3, dataset, "data-cli", "datasets/shapes/v1/")
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint}
    proc = subprocess.run([sys.executable, "-m", "d2ops", "validate", "s3://data-cli/datasets/shapes/v1/", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["valid"] and report["images"]["probed"] == 16 and report["source"].startswith("s3://data-cli/")
    proc = subprocess.run([sys.executable, "-m", "d2ops", "validate", "s3://no-such-bucket-cli/datasets/x/v1/"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "cannot read the dataset" in proc.stderr and "NoSuchBucket" in proc.stderr
