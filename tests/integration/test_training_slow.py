"""A longer, better-converged training run (`make test-training-slow`; left out of `make test`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops import synth
from d2ops_core.cpu_profile import TORCHVISION_CPU_PROFILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The CPU profile for longer: 400 iterations on more images (docs/training.md, "Calibration").
CONVERGED = TORCHVISION_CPU_PROFILE | {"max_iter": "400", "checkpoint_period": "100", "log_period": "50"}


def test_longer_run_converges(tmp_path: Path) -> None:
    dataset = tmp_path / "shapes"
    synth.generate(dataset, images=260, size=128, seed=5)  # 195 train / 65 val
    proc = subprocess.run([sys.executable, "-m", "d2ops", "train-local", str(dataset), str(tmp_path / "out"),
                           "--hyperparameters", json.dumps(CONVERGED)], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bbox_AP50"] >= 0.95 and summary["bbox_AP"] >= 0.7, summary
