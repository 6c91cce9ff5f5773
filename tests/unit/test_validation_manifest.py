"""The manifest schema, its documentation, and the codes' documentation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops_core.validation import Code, Manifest, manifest_json_schema
from d2ops_core.validation.codes import MEANINGS
from d2ops_core.validation.manifest import parse_manifest, unsafe_relative_path

ROOT = Path(__file__).resolve().parents[2]
BASE = {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json"}


def test_defaults_apply_and_optional_keys_are_typed() -> None:
    m = Manifest.model_validate(BASE)
    assert (m.val, m.images, m.task, m.gate) == ("annotations/val.json", "images/", "detection", None)
    full = Manifest.model_validate({**BASE, "task": "instance_segmentation",
                                    "training": {"model": "mask_rcnn_R_50_FPN_3x", "max_iter": 3000,
                                                 "ims_per_batch": 16, "base_lr": 0.02, "seed": 7},
                                    "gate": {"min_map": 0.5, "max_regression": 0.01}})
    assert full.optional_settings() == {
        "task": "instance_segmentation", "gate": {"min_map": 0.5, "max_regression": 0.01},
        "training": {"model": "mask_rcnn_R_50_FPN_3x", "max_iter": 3000, "ims_per_batch": 16, "base_lr": 0.02,
                     "seed": 7}}


@pytest.mark.parametrize(("doc", "code", "path"), [
    ({**BASE, "training": {"max_iter": "500"}}, Code.MANIFEST_VALUE_INVALID, "training.max_iter"),  # strict types
    ({**BASE, "training": {"base_lr": 1.5}}, Code.MANIFEST_VALUE_INVALID, "training.base_lr"),
    ({**BASE, "gate": {"min_map": 50}}, Code.MANIFEST_VALUE_INVALID, "gate.min_map"),  # a fraction, not percent
    ({**BASE, "gate": {"min_mAP": 0.5}}, Code.MANIFEST_KEY_UNKNOWN, "gate.min_mAP"),
    ({**BASE, "task": "segmentation"}, Code.MANIFEST_VALUE_INVALID, "task"),
    ({**BASE, "name": "my dataset"}, Code.MANIFEST_VALUE_INVALID, "name"),
    ({**BASE, "images": "/data/images"}, Code.MANIFEST_VALUE_INVALID, "images"),
    ({**BASE, "images": "./images/"}, Code.MANIFEST_VALUE_INVALID, "images"),  # S3 keys are literal
    ({k: v for k, v in BASE.items() if k != "format"}, Code.MANIFEST_KEY_MISSING, "format"),
])
def test_bad_manifests_name_the_key(doc: dict[str, object], code: Code, path: str) -> None:
    manifest, problems = parse_manifest(json.dumps(doc).encode())
    assert manifest is None
    assert (code, path) in {(c, p) for c, _, p in problems}, problems


def test_non_object_and_oversized_manifests() -> None:
    assert parse_manifest(b"[1, 2]")[1][0][0] == Code.MANIFEST_VALUE_INVALID
    assert parse_manifest(b"{" * 10)[1][0][0] == Code.JSON_MALFORMED
    assert parse_manifest(b" " * 70_000)[1][0][0] == Code.FILE_UNREADABLE


def test_published_schema_is_current() -> None:
    published = json.loads((ROOT / "docs/manifest.schema.json").read_text())
    # regenerate with: python -m d2ops_core.validation.schema > docs/manifest.schema.json
    assert published == manifest_json_schema()


def test_schema_export_command_prints_the_schema() -> None:
    proc = subprocess.run([sys.executable, "-m", "d2ops_core.validation.schema"], capture_output=True, text=True,
                          check=True)
    assert json.loads(proc.stdout) == manifest_json_schema()


def test_every_code_is_documented_with_its_severity() -> None:
    text = (ROOT / "docs/dataset-format.md").read_text()
    assert set(MEANINGS) == set(Code)
    for code in Code:
        assert f"`{code}`" in text, f"{code} is not in docs/dataset-format.md"


@pytest.mark.parametrize("value", ["s3://bucket/annotations/val.json", "https://example.com/val.json",
                                   "file:///etc/passwd", "file:/etc/passwd"])
def test_a_url_is_named_as_a_url_not_told_to_normalise(value: str) -> None:
    """A URL got "is not normalized (write 's3:/bucket/...')": advice that makes it no better."""
    manifest, problems = parse_manifest(json.dumps({**BASE, "val": value}).encode())
    assert manifest is None
    assert [(code, path) for code, _, path in problems] == [(Code.MANIFEST_VALUE_INVALID, "val")]
    assert "is a URL; write a path relative to the dataset root" in problems[0][1]
    assert unsafe_relative_path(value) is not None and "URL" in str(unsafe_relative_path(value))
    assert unsafe_relative_path("images/c:d.jpg") is None  # a colon later in a name is no scheme
