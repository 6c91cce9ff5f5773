"""Run Ray Serve as one supervised process group: the entry point's side of ``ray_serve_app``.

The Ray driver (``python -m model_code.serving.ray_serve_app``) starts Ray's GCS, raylet, agents,
the Serve controller, its HTTP proxy and the replicas; all of them stay in the driver's process
group, so :meth:`launch.ServerProcess.stop` ends every one. No Ray import here: the TorchServe path
never loads it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from model_code.serving import launch

# The TorchServe configuration holds the limits both servers apply (one place for each fact).
REQUEST_BYTES_PROPERTY = "max_request_size"
RESPONSE_TIMEOUT_PROPERTY = "default_response_timeout"
QUEUE_PROPERTY = "job_queue_size"
# Ray's object store holds request bodies in flight (up to 16 MiB each); Ray's minimum is 75 MiB.
OBJECT_STORE_BYTES = 256 * 1024 * 1024
# Ray's Unix sockets live in <temp>/session_<date>_<pid>/sockets/: about 70 characters below the temp
# dir, and a socket path may not exceed 107 bytes. A deeper work dir gets a short temp dir instead.
MAX_TEMP_DIR_CHARS = 36
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # never report usage to Anyscale
    "RAY_AUTH_MODE": "disabled",  # a one-node instance inside one container; a host's token mode must not leak in
    # A replica given no GPU by Ray keeps the host's devices visible, so device.py decides (and refuses
    # to serve on CPU where a GPU is required) instead of Ray hiding them behind CUDA_VISIBLE_DEVICES="".
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",  # every replica's lines reach the logs as they are
    "RAY_COLOR_PREFIX": "0",  # plain "(ServeReplica:...)" prefixes in CloudWatch, no terminal colour codes
    "PYTHONUNBUFFERED": "1",
}


def temp_dir(workdir: Path) -> tuple[Path, bool]:
    """Ray's temp dir (sessions, sockets, logs) and whether it is outside ``workdir`` (then removed at stop)."""
    inside = workdir / "ray"
    if len(str(inside)) <= MAX_TEMP_DIR_CHARS:
        return inside, False
    return Path(tempfile.mkdtemp(prefix="d2ops-ray-")), True


class RayServeProcess(launch.ServerProcess):
    """The Ray driver serving the artifact in ``model_dir`` on ``host:port``."""

    name = "Ray Serve"
    leader_first = True  # the driver shuts Serve and Ray down itself; stragglers are killed after

    def __init__(self, model_dir: Path, workdir: Path, *, host: str, port: int, ping_url: str,
                 settings: launch.BatchSettings, config: Mapping[str, str],
                 stdout: IO[bytes] | int | None = None) -> None:
        super().__init__(workdir, ping_url, stdout=stdout)
        self.model_dir = model_dir
        self.host = host
        self.port = port
        self.settings = settings
        self.config = config
        workdir.mkdir(parents=True, exist_ok=True)
        self.temp, self._own_temp = temp_dir(workdir)
        if not self._own_temp:
            self.temp.mkdir(parents=True, exist_ok=True)
        link = workdir / "ray"
        if self._own_temp and not link.exists():
            link.symlink_to(self.temp, target_is_directory=True)  # so the logs are found under the work dir

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "ray" / "session_latest" / "logs"

    def command(self) -> list[str]:
        c = self.config
        return [sys.executable, "-m", "model_code.serving.ray_serve_app", "--model-dir", str(self.model_dir),
                "--host", self.host, "--port", str(self.port), "--temp-dir", str(self.temp),
                "--batch-size", str(self.settings.batch_size),
                "--max-batch-delay-ms", str(self.settings.max_batch_delay_ms), "--workers", str(self.settings.workers),
                "--max-request-bytes", c.get(REQUEST_BYTES_PROPERTY, str(16 * 1024 * 1024)),
                "--max-ongoing-requests", c.get(QUEUE_PROPERTY, "256"),
                "--request-timeout-s", c.get(RESPONSE_TIMEOUT_PROPERTY, "60"),
                "--object-store-bytes", str(OBJECT_STORE_BYTES)]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # never join another cluster
        env.update(RAY_ENV)
        env["TMPDIR"] = str(self.temp)
        return env
