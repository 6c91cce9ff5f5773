"""`make bench-validate` at a tiny scale: it runs both sides and ends with one JSON line of figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from d2ops.bench.cocogen import write_coco_like
from d2ops_core.validation import validate_local


def test_bench_runs_end_to_end_and_prints_its_figures(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "d2ops.bench.validate", "--workdir", str(tmp_path),
                           "--images", "400", "--instances", "3000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"seconds", "baseline_seconds", "ratio", "peak_rss_mb", "baseline_peak_rss_mb", "whole_file_seconds",
            "whole_file_peak_rss_mb", "ratio_vs_whole_file"} <= set(figures)
    assert figures["whole_file_seconds"] > 0 and figures["whole_file_peak_rss_mb"] > 0
    assert figures["valid"] is True and figures["instances"] == 3000
    assert figures["seconds"] > 0 and figures["baseline_seconds"] > 0
    # The ratio is the unrounded seconds' quotient; the JSON rounds each figure to 3 decimals, so the
    # printed seconds bound it only to within that rounding (a 0.05 s baseline moves it by 0.01).
    half = 0.0005
    seconds, baseline = figures["seconds"], figures["baseline_seconds"]
    low, high = (seconds - half) / (baseline + half), (seconds + half) / max(baseline - half, 1e-9)
    assert low - half <= figures["ratio"] <= high + half
    assert not (tmp_path / "dataset").exists()  # generated files are removed unless --keep


def test_generated_file_is_valid_coco_with_the_requested_shape(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_coco_like(root / "annotations/train.json", images=50, instances=400, seed=3)
    write_coco_like(root / "annotations/val.json", images=5, instances=40, seed=4, folder="val/")
    (root / "manifest.json").write_text(json.dumps({"name": "b", "version": "v1", "format": "coco",
                                                    "train": "annotations/train.json"}))
    doc = json.loads((root / "annotations/train.json").read_text())
    assert (len(doc["images"]), len(doc["annotations"]), len(doc["categories"])) == (50, 400, 80)
    assert sum(a["iscrowd"] for a in doc["annotations"]) == 4  # 1% crowd RLEs
    report = validate_local(root, check_images=False)
    assert report.error_count == 0, report.describe()
