"""A local endpoint (TorchServe or Ray Serve) on loopback, configured exactly like the serving image.

It runs the image's own entry point, read from containers/serving/Dockerfile (ENTRYPOINT with
``serve`` appended, as SageMaker runs it; see ``d2ops.local.container_entry``) as a subprocess with
the environment pointed at a local model, 127.0.0.1 and its own ports, so the configuration,
the model archive and the readiness ``/ping`` are those of the endpoint in AWS.
``backend`` (or ``D2OPS_SERVING_BACKEND`` in ``environment``, as CreateModel's container Environment
sets it) picks the server, as in the image. Each endpoint has its own work directory (model store,
logs, temp files, the server's pid file), so two can run side by side: start the new one on
another port, wait for it to be healthy, move traffic, stop the old one (blue/green).

    with LocalEndpoint("runs/x/model.tar.gz", port=8080) as endpoint:
        requests.post(endpoint.invocations_url, data=jpeg, headers={"Content-Type": "image/jpeg"})
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from d2ops.local import container_entry
from model_code.serving import backends, process  # standard library only: no torch in the CLI

MODEL_NAME = "model"  # model_code.serving.launch.MODEL_NAME (not imported: d2ops does not import torch)


class LocalServingError(Exception):
    """The local endpoint could not start, did not become healthy in time, or the model is unusable."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free right now (all held open together, so none repeats)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


class LocalEndpoint:
    """TorchServe or Ray Serve serving one model on ``127.0.0.1:port``; a context manager that always cleans up.

    ``backend``: ``torchserve`` or ``ray-serve``; None takes the one ``environment`` names, else TorchServe.
    """

    def __init__(self, model_path: Path | str, port: int = 0, *, batch_size: int | None = None,
                 max_batch_delay_ms: int | None = None, workers: int | None = None,
                 startup_timeout: float = 180.0, workdir: Path | str | None = None, host: str = "127.0.0.1",
                 environment: Mapping[str, str] | None = None, backend: str | None = None) -> None:
        self.model_path = Path(model_path).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.container_env = dict(environment or {})  # as CreateModel's container Environment sets it
        try:
            self.backend: backends.Backend = (backends.parse_backend(backend, "backend") if backend is not None
                                              else backends.backend_from_env(self.container_env))
        except ValueError as exc:
            raise LocalServingError(str(exc)) from exc
        self.settings = {"D2OPS_BATCH_SIZE": batch_size, "D2OPS_MAX_BATCH_DELAY_MS": max_batch_delay_ms,
                         "D2OPS_WORKERS": workers}
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="d2ops-serve-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ping_url(self) -> str:
        return f"{self.url}/ping"

    @property
    def invocations_url(self) -> str:
        return f"{self.url}/invocations"

    @property
    def predictions_url(self) -> str:
        return f"{self.url}/predictions/{MODEL_NAME}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    @property
    def logs_dir(self) -> Path:
        """The server's own logs: TorchServe's ts_log.log, model_log.log, access_log.log; Ray's session logs
        (``serve/`` holds the proxy's and the replicas' request logs). ``log_path`` has both servers' stdout."""
        if self.backend == "ray-serve":
            return self.workdir / "ray" / "session_latest" / "logs"
        return self.workdir / "logs"

    def environment(self) -> dict[str, str]:
        env = {**container_entry.host_environment(), **self.container_env}
        management, metrics, grpc_inference, grpc_management = free_ports(4)
        env.update({  # model_code is an installed package: no PYTHONPATH, as in the image
            "D2OPS_MODEL_PATH": str(self.model_path),
            "D2OPS_SERVING_WORKDIR": str(self.workdir), "D2OPS_BIND_HOST": self.host,
            "SAGEMAKER_BIND_TO_PORT": str(self.port), "D2OPS_MANAGEMENT_PORT": str(management),
            "D2OPS_METRICS_PORT": str(metrics), "D2OPS_GRPC_INFERENCE_PORT": str(grpc_inference),
            "D2OPS_GRPC_MANAGEMENT_PORT": str(grpc_management), "D2OPS_STARTUP_TIMEOUT": str(self.startup_timeout),
            "PYTHONUNBUFFERED": "1", backends.BACKEND_ENV: self.backend,
            "D2OPS_STOP_WITH_PARENT": "1",  # a server outlives no d2ops process that was killed without stopping it
        })
        env.update({k: str(v) for k, v in self.settings.items() if v is not None})
        return env

    def ping(self, timeout: float = 2.0) -> int | None:
        """/ping's status code, or None while nothing listens on the port."""
        return process.ping(self.ping_url, timeout)

    def start(self) -> LocalEndpoint:
        if self.proc is not None:
            raise LocalServingError(f"endpoint on port {self.port} is already started")
        if not self.model_path.exists():
            raise LocalServingError(f"{self.model_path}: no such model directory or model.tar.gz")
        if self.ping() is not None:
            raise LocalServingError(f"port {self.port} on {self.host} is already in use")
        try:
            command = container_entry.image_command("serving")
        except container_entry.EntryError as exc:
            raise LocalServingError(f"serving image entry: {exc}") from exc
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(command, cwd=self.workdir, env=self.environment(), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float) -> float:
        try:
            return process.wait_healthy(self.ping_url, self.proc, timeout, name="serving")
        except process.HealthWaitError as exc:
            raise LocalServingError(f"{exc}:\n{self.log_tail()}") from exc

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 45.0) -> None:
        """SIGTERM the entry point (it stops the server's process group: TorchServe's Java and workers, or Ray's
        driver, GCS, raylet and replicas); SIGKILL both after ``timeout``."""
        if self.proc is not None:
            server_pgid = self._server_pgid()
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.signal_group(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            if server_pgid is not None:  # only does anything if the entry point could not clean up
                process.signal_group(server_pgid, signal.SIGKILL)
            process.signal_group(self.proc.pid, signal.SIGKILL)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _server_pgid(self) -> int | None:
        try:
            return int((self.workdir / backends.PID_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

