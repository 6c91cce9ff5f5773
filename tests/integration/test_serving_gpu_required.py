"""A server that needs a GPU but cannot use CUDA stays unhealthy, through the real TorchServe and Ray Serve.

This machine has no GPU, so ``D2OPS_REQUIRE_GPU=true`` stands in for a GPU host whose torch
needs a newer driver (model_code.serving.device decides the same way for both; its unit tests
cover the GPU-host case): TorchServe's worker ``initialize`` refuses, or the Ray Serve replica's
loader does; no worker becomes ready, and ``/ping`` keeps answering 503 instead of turning
healthy on CPU.
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
from model_code.serving.backends import BACKENDS
from tests.fixtures.serving.support import CATEGORY_IDS, CLASS_NAMES, server_log

pytestmark = pytest.mark.integration


class _Tiny(torch.nn.Module):
    """Never run: the worker refuses before loading it. Small, so the test costs the server's start only."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
                for _ in images]


@pytest.mark.parametrize("backend", BACKENDS)
def test_required_gpu_without_cuda_keeps_ping_unhealthy(tmp_path: Path, backend: str) -> None:
    meta = artifact.ArtifactMetadata(framework="torchvision", task="detection", model="tiny",
                                     class_names=CLASS_NAMES, category_ids=CATEGORY_IDS)
    model_dir = artifact.save_artifact(tmp_path / "model", torch.jit.script(_Tiny()), meta)
    endpoint = LocalEndpoint(model_dir, workdir=tmp_path / "serve", startup_timeout=180, backend=backend)
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
                assert endpoint.proc.poll() is None, server_log(endpoint)[-3000:]
                try:
                    r = requests.get(endpoint.ping_url, timeout=5)
                    answers.append((r.status_code, r.text))
                except (requests.ConnectionError, requests.Timeout):
                    pass  # not listening yet, or a loaded machine answered late: neither is a 200
                if refused_at is None and "GpuUnavailableError" in server_log(endpoint):
                    refused_at = time.monotonic()
                # Keep watching a while after the worker refused: TorchServe retries it, /ping must stay 503.
                # (Catches a Ray replica whose failed load left /ping answering 200, or routing to a CPU model.)
                if refused_at is not None and time.monotonic() - refused_at > 5:
                    break
                time.sleep(0.25)
        finally:
            endpoint.stop()
    logs = server_log(endpoint)
    assert refused_at is not None, f"the worker never refused the CPU:\n{logs[-3000:]}"
    assert answers, "TorchServe never answered /ping"
    codes = [code for code, _ in answers]
    # Ray Serve's proxy may answer 404 for a moment before the app's route reaches it (never a 200).
    routed = codes[codes.index(503):] if backend == "ray-serve" and 503 in codes else codes
    assert set(codes) - set(routed) <= {404} and all(code == 503 for code in routed), codes
    assert "no worker ready" in answers[-1][1]
    # The entry point says why once, up front, in one line; the worker logs the same reason.
    assert "d2ops serving: error: a GPU is required (D2OPS_REQUIRE_GPU=true) but CUDA is unusable" in logs
    assert "Refusing to serve on CPU" in logs
    assert "model runs on cpu" not in logs
