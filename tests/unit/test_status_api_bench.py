"""`make bench-status-api` at a tiny scale: both modes answer every request and it ends with its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_runs_both_modes_against_moto_and_reports_the_ratio() -> None:
    proc = subprocess.run([sys.executable, "-m", "d2ops.bench.status_api", "--requests", "4"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr  # a non-200 answer ends the bench with a message
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["requests"] == 4
    per_request, reused = figures["per_request_clients"], figures["reused_clients"]
    assert per_request["seconds"] > 0 and reused["seconds"] > 0
    # The printed seconds are rounded to milliseconds: a few ms for 4 requests makes that a few per cent.
    assert figures["speedup"] == pytest.approx(per_request["seconds"] / reused["seconds"], rel=0.05)


def test_bench_refuses_fewer_requests_than_one_round() -> None:
    proc = subprocess.run([sys.executable, "-m", "d2ops.bench.status_api", "--requests", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--requests must be at least 2" in proc.stderr
