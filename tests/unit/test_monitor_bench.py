"""``make bench-monitor`` at a small size (the full size runs only through the target): both sides judge the
same unshifted window, read every record, and the last line is the figures' JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from d2ops.bench import monitor


def test_the_bench_measures_both_sides_on_the_same_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Mutations caught: a side reading fewer records than were written, or the window judged against a baseline
    # of other traffic (the verdict would not be ok).
    assert monitor.main(["--workdir", str(tmp_path), "--records", "120", "--windows", "1", "--size", "64x48"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["bench"] == "monitor" and figures["records_per_window"] == 120
    assert figures["verdict"] == figures["baseline_verdict"] == "ok"
    assert figures["windows_per_s"] > 0 and figures["baseline_windows_per_s"] > 0
    assert figures["peak_rss_mb"] > 0 and figures["baseline_peak_rss_mb"] > 0
    assert figures["ratio"] == pytest.approx(figures["windows_per_s"] / figures["baseline_windows_per_s"], rel=1e-2)
