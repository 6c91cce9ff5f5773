"""`d2ops validate`: exit codes, readable output, --json, --no-images."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops import synth
from d2ops.cli import main


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "ds"
    synth.generate(root, images=40, seed=9, size=64)
    return root


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "d2ops", "validate", *args], capture_output=True, text=True,
                          timeout=120)


def test_valid_dataset_exits_0_with_a_readable_summary(dataset: Path) -> None:
    proc = validate(str(dataset))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("VALID shapes/v1: 0 errors")
    assert "checking train annotations" in proc.stderr  # progress goes to stderr


def test_invalid_dataset_exits_1_and_json_has_the_full_report(dataset: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    doc = json.loads((root / "annotations/val.json").read_text())
    doc["annotations"][3]["category_id"] = 77
    (root / "annotations/val.json").write_text(json.dumps(doc))
    proc = validate(str(root), "--json", "--quiet")
    assert proc.returncode == 1
    assert proc.stderr == ""
    report = json.loads(proc.stdout)
    assert report["valid"] is False
    [error] = report["errors"]
    assert error["code"] == "ANNOTATION_CATEGORY_UNKNOWN"
    assert error["location"] == "annotations/val.json:annotations[3].category_id"


def test_missing_or_malformed_manifest_is_invalid_not_a_crash(dataset: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    (root / "manifest.json").unlink()
    assert main(["validate", str(root), "--quiet"]) == 1
    (root / "manifest.json").write_text('{"name": "shapes", ')
    assert main(["validate", str(root), "--quiet"]) == 1


def test_no_images_validates_annotations_before_images_are_uploaded(dataset: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    shutil.rmtree(root / "images")
    assert main(["validate", str(root), "--no-images", "--quiet"]) == 0
    assert "image files: skipped" in capsys.readouterr().out
    assert main(["validate", str(root), "--quiet"]) == 1


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert validate(str(tmp_path / "nowhere")).returncode == 2
    (tmp_path / "file.json").write_text("{}")
    proc = validate(str(tmp_path / "file.json"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    assert validate().returncode == 2
    assert validate("s3:///prefix/").returncode == 2
    proc = validate("s3://bucket/prefix/", "--image-sample", "3")  # gone with issue 21: every image is checked
    assert proc.returncode == 2 and "--image-sample" in proc.stderr
