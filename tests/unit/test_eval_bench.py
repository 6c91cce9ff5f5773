"""`make bench-eval` at a tiny scale: both sides run, agree on the 12 stats, and it ends with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from d2ops.bench.eval import write_detections


def test_bench_runs_end_to_end_and_both_evaluations_agree(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "d2ops.bench.eval", "--workdir", str(tmp_path / "bench"),
                           "--images", "60", "--instances", "400", "--detections-per-image", "20"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["detections"] == 60 * 20
    assert figures["seconds"] > 0 and figures["baseline_seconds"] > 0
    assert abs(figures["ratio"] - figures["seconds"] / figures["baseline_seconds"]) < 0.01
    assert len(figures["stats"]) == len(figures["baseline_stats"]) == 12
    assert 0.05 < figures["stats"][0] < 0.95  # a real mix of hits and misses, not a degenerate 0 or 1
    assert figures["max_abs_stat_diff"] < 1e-4 and figures["reported_vs_stats_diff"] < 1e-9
    # the gated evaluation: both models matched and the bootstrap run, timed against pycocotools' COCOeval,
    # and the old pycocotools matching kept as the matching step's baseline, with identical matches
    assert figures["gated_seconds"] >= figures["gated_matching_seconds"] + figures["gated_bootstrap_seconds"] - 0.01
    assert abs(figures["gated_ratio"] - figures["gated_seconds"] / figures["baseline_seconds"]) < 0.01
    assert figures["gated_resamples"] == 1000 and figures["gated_interval"][0] <= figures["gated_interval"][1]
    assert 0 < figures["matching_seconds"] < figures["gated_matching_seconds"]
    assert figures["matching_baseline_seconds"] > 0 and figures["matching_identical"] is True
    assert not (tmp_path / "bench").exists()  # generated files are removed unless --keep


def test_detections_cover_every_image_with_valid_boxes(tmp_path: Path) -> None:
    gt = {"images": [{"id": i} for i in (1, 2, 3)], "categories": [{"id": 7}, {"id": 9}],
          "annotations": [{"image_id": 1, "category_id": 7, "bbox": [10.0, 10.0, 50.0, 40.0]}]}
    assert write_detections(gt, tmp_path / "dt.json", per_image=5, seed=0) == 15
    results = json.loads((tmp_path / "dt.json").read_text())
    assert {r["image_id"] for r in results} == {1, 2, 3}
    assert all(r["category_id"] in (7, 9) and r["bbox"][2] >= 1 and r["bbox"][3] >= 1 and 0 <= r["score"] <= 1
               for r in results)
