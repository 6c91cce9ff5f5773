"""`d2ops serve` as a user runs it: a Mask R-CNN model.tar.gz, masks on request, Ctrl-C, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

from d2ops.local.serving import free_port
from model_code.serving.backends import BACKENDS
from tests.fixtures.serving.support import cached_artifact, png_bytes

pytestmark = pytest.mark.integration


# What each server runs besides Python: TorchServe's Java frontend, Ray's raylet.
SERVER_PROGRAM = {"torchserve": "java", "ray-serve": "raylet"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_d2ops_serve_answers_with_masks_and_stops_cleanly_on_ctrl_c(tmp_path, backend):
    port = free_port()
    model = cached_artifact(has_masks=True, pack=True)
    proc = subprocess.Popen([sys.executable, "-m", "d2ops", "serve", str(model), "--port", str(port),
                             "--backend", backend],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line:
                break
        assert f"listening on http://127.0.0.1:{port}" in "".join(lines), "".join(lines)
        assert requests.get(f"http://127.0.0.1:{port}/ping", timeout=5).status_code == 200
        attributes = "score_threshold=0;max_detections=2;masks=true"
        r = requests.post(f"http://127.0.0.1:{port}/invocations", data=png_bytes(), timeout=60,
                          headers={"Content-Type": "image/png", "X-Amzn-SageMaker-Custom-Attributes": attributes})
        assert r.status_code == 200, r.text
        dets = r.json()["detections"]
        assert len(dets) == 2 and all(d["mask"]["size"] == [120, 160] for d in dets)
        workdir = next(line.split("logs in ")[1].rstrip(")\n") for line in lines if "logs in " in line)
        group = [p for p in psutil.process_iter(["cmdline"]) if workdir in " ".join(p.info["cmdline"] or [])]
        assert any(SERVER_PROGRAM[backend] in " ".join(p.info["cmdline"]) for p in group)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out
        assert "SIGINT: stopping" in out
        left = [p.pid for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"left behind: {left}"
        assert not os.path.exists(workdir)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/ping", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
