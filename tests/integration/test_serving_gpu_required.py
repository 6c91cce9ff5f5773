"""A server that needs a GPU but cannot use CUDA stays unhealthy, through the real TorchServe.

This machine has no GPU, so ``D2OPS_REQUIRE_GPU=true`` stands in for a GPU host whose torch
needs a newer driver (model_code.serving.device decides the same way for both; its unit tests
cover the GPU-host case): the worker's ``initialize`` refuses, no worker becomes ready, and
``/ping`` keeps answering 503 instead of turning healthy on CPU.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import requests
import torch

from d2ops.local.container_entry import image_command
from d2ops.local.serving import LocalEndpoint
from model_code import artifact
from tests.fixtures.serving.support import CATEGORY_IDS, CLASS_NAMES

pytestmark = pytest.mark.integration


def _logs(endpoint: LocalEndpoint) -> str:
    files = [endpoint.log_path, *sorted(endpoint.logs_dir.glob("*.log"))] if endpoint.logs_dir.is_dir() else [
        endpoint.log_path]
    return "\n".join(f.read_text(errors="replace") for f in files if f.is_file())


class _Tiny(torch.nn.Module):
    """Never run: the worker refuses before loading it. Small, so the test costs TorchServe's start only."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
                for _ in images]


def test_required_gpu_without_cuda_keeps_ping_unhealthy(tmp_path: Path) -> None:
    meta = artifact.ArtifactMetadata(framework="torchvision", task="detection", model="tiny",
                                     class_names=CLASS_NAMES, category_ids=CATEGORY_IDS)
    model_dir = artifact.save_artifact(tmp_path / "model", torch.jit.script(_Tiny()), meta)
    endpoint = LocalEndpoint(model_dir, workdir=tmp_path / "serve", startup_timeout=180)
    env = endpoint.environment()
    env["D2OPS_REQUIRE_GPU"] = "true"
    endpoint.workdir.mkdir(parents=True)
    answers: list[tuple[int, str]] = []
    refused_at: float | None = None
    with endpoint.log_path.open("ab") as log:
        # The image's declared entry, as LocalEndpoint.start runs it, minus its wait for health.
        endpoint.proc = subprocess.Popen(image_command("serving"), cwd=endpoint.workdir, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:
                assert endpoint.proc.poll() is None, _logs(endpoint)[-3000:]
                try:
                    r = requests.get(endpoint.ping_url, timeout=5)
                    answers.append((r.status_code, r.text))
                except (requests.ConnectionError, requests.Timeout):
                    pass  # not listening yet, or a loaded machine answered late: neither is a 200
                if refused_at is None and "GpuUnavailableError" in _logs(endpoint):
                    refused_at = time.monotonic()
                # Keep watching a while after the worker refused: TorchServe retries it, /ping must stay 503.
                if refused_at is not None and time.monotonic() - refused_at > 5:
                    break
                time.sleep(0.25)
        finally:
            endpoint.stop()
    logs = _logs(endpoint)
    assert refused_at is not None, f"the worker never refused the CPU:\n{logs[-3000:]}"
    assert answers, "TorchServe never answered /ping"
    assert all(code == 503 for code, _ in answers), sorted({code for code, _ in answers})
    assert "no worker ready" in answers[-1][1]
    # The entry point says why once, up front, in one line; the worker logs the same reason.
    assert "d2ops serving: error: a GPU is required (D2OPS_REQUIRE_GPU=true) but CUDA is unusable" in logs
    assert "Refusing to serve on CPU" in logs
    assert "model runs on cpu" not in logs
