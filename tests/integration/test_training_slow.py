"""A longer, better-converged training run (`make test-training-slow`; left out of `make test`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops import synth

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONVERGED = {"model": "fasterrcnn_resnet18_fpn", "max_iter": "400", "ims_per_batch": "4", "base_lr": "0.02",
             "warmup_iters": "50", "min_size": "128", "max_size": "128", "rpn_pre_nms_train": "600",
             "rpn_post_nms_train": "300", "rpn_pre_nms_test": "300", "rpn_post_nms_test": "100",
             "num_workers": "0", "checkpoint_period": "100", "log_period": "50"}


def test_longer_run_converges(tmp_path: Path) -> None:
    dataset = tmp_path / "shapes"
    synth.generate(dataset, images=260, size=128, seed=5)  # 195 train / 65 val
    proc = subprocess.run([sys.executable, "-m", "d2ops", "train-local", str(dataset), str(tmp_path / "out"),
                           "--hyperparameters", json.dumps(CONVERGED)], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bbox_AP50"] >= 0.95 and summary["bbox_AP"] >= 0.7, summary
