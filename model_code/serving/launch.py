"""Package a model artifact for TorchServe and run TorchServe as one supervised process group.

One home for how TorchServe is started, shared by the serving image's entry point
(``model_code.serving.entrypoint``) and the local endpoints of ``d2ops.local.serving``:

1. :func:`prepare_model_dir` takes a model directory or ``model.tar.gz`` (docs/model-artifact.md)
   and checks it is one before anything starts, so a bad artifact fails fast with a message
   instead of a server whose ``/ping`` never turns healthy;
2. :func:`build_model_archive` runs torch-model-archiver at start-up (an unzipped archive in
   the model store: nothing is zipped only to be unzipped again);
3. :func:`render_config` writes the effective ``config.properties``: the base file
   (package data, ``model_code/serving/resources/config.properties``) plus the addresses, the model store and the one
   model with its batching settings;
4. :class:`TorchServeProcess` starts ``torchserve --foreground`` in its own session, waits for
   ``/ping`` and stops the whole process group (Java frontend and Python workers); its base,
   :class:`ServerProcess`, does the same for Ray Serve (``model_code.serving.ray_launch``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, Field

from model_code.artifact import CUDA_MODEL_FILE, MODEL_FILE, ArtifactError, open_artifact
from model_code.model_forms import AOTI_FILE, EXPORTED_FILE
from model_code.serving import process
from model_code.serving.process import signal_group as _signal_group

MODEL_NAME = "model"
MODEL_VERSION = "1.0"
HANDLER_FILE = Path(__file__).with_name("torchserve_handler.py")
# The base configuration and the plugin's source are package data of model_code.serving (an
# installed package, not a checkout); D2OPS_TS_CONFIG may point at another configuration.
CONFIG_ENV = "D2OPS_TS_CONFIG"
RESOURCES = Path(str(importlib.resources.files("model_code.serving") / "resources"))
PACKAGED_CONFIG = RESOURCES / "config.properties"
# TorchServe 0.12's own /ping answers 200 while the model is still loading; the ReadinessPing
# plugin replaces it. It is compiled once per source version into the user's cache directory (the
# image does it at build time) unless D2OPS_TS_PLUGINS names a directory holding the jar.
PLUGINS_ENV = "D2OPS_TS_PLUGINS"
PLUGIN_SOURCE = RESOURCES / "ReadinessPing.java"
PLUGIN_JAR = "d2ops-readiness-ping.jar"
PLUGIN_SERVICE = "META-INF/services/org.pytorch.serve.servingsdk.ModelServerEndpoint"


class ServingError(Exception):
    """TorchServe could not be prepared, did not start, or did not become healthy in time."""


class BatchSettings(BaseModel):
    """Per-model settings TorchServe reads from the ``models`` property."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(default=8, ge=1, le=64)
    max_batch_delay_ms: int = Field(default=20, ge=0, le=10_000)
    workers: int = Field(default=1, ge=1, le=32)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BatchSettings:
        """``D2OPS_BATCH_SIZE``, ``D2OPS_MAX_BATCH_DELAY_MS``, ``D2OPS_WORKERS`` (e.g. set in the SageMaker model)."""
        names = {"batch_size": "D2OPS_BATCH_SIZE", "max_batch_delay_ms": "D2OPS_MAX_BATCH_DELAY_MS",
                 "workers": "D2OPS_WORKERS"}
        return cls.model_validate({field: env[var] for field, var in names.items() if env.get(var)})


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(CONFIG_ENV) or PACKAGED_CONFIG)


def torchserve_jar() -> Path:
    import ts

    return Path(ts.__file__).parent / "frontend" / "model-server.jar"


def build_ping_plugin(dest_dir: Path, source: Path = PLUGIN_SOURCE) -> Path:
    """Compile ReadinessPing.java into ``dest_dir``/d2ops-readiness-ping.jar (needs a JDK's javac)."""
    jar = dest_dir / PLUGIN_JAR
    if jar.is_file():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        raise ServingError("javac not found: a JDK is needed once to compile the /ping plugin "
                           f"({source}); or set {PLUGINS_ENV} to a directory holding {PLUGIN_JAR}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        classes = Path(tmp) / "classes"
        proc = subprocess.run([javac, "--release", "17", "-cp", str(torchserve_jar()), "-d", str(classes), str(source)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ServingError(f"compiling {source} failed:\n{proc.stderr}")
        staged = Path(tmp) / PLUGIN_JAR
        with zipfile.ZipFile(staged, "w") as zf:
            for path in sorted(classes.rglob("*.class")):
                zf.write(path, path.relative_to(classes).as_posix())
            zf.writestr(PLUGIN_SERVICE, "io.d2ops.serving.ReadinessPing\n")
        os.replace(staged, jar)
    return jar


def plugins_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the /ping plugin jar is: prebuilt (the image) or compiled once per source version."""
    if env.get(PLUGINS_ENV):
        directory = Path(env[PLUGINS_ENV])
        if not (directory / PLUGIN_JAR).is_file():
            raise ServingError(f"{PLUGINS_ENV}={directory} holds no {PLUGIN_JAR}")
        return directory
    digest = hashlib.sha256(PLUGIN_SOURCE.read_bytes() + torchserve_jar().name.encode()).hexdigest()[:12]
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = cache / "d2ops" / "serving-plugin" / digest
    build_ping_plugin(directory)
    return directory


def prepare_model_dir(model_path: Path | str, workdir: Path | str) -> Path:
    """A model directory as-is, or ``model.tar.gz`` safely extracted under ``workdir``; checked either way."""
    try:  # extraction with the "data" filter plus size and member-count caps
        directory, _ = open_artifact(model_path, Path(workdir) / "artifact")
    except ArtifactError as exc:
        raise ServingError(str(exc)) from exc
    # TorchScript files are zip archives. A truncated or foreign model.pt would otherwise only show as
    # TorchServe workers failing to load it, over and over, until the start-up timeout (600 s) ends the container.
    for weights in (directory / MODEL_FILE, directory / CUDA_MODEL_FILE):
        if weights.exists() and not zipfile.is_zipfile(weights):
            raise ServingError(f"{weights}: not a TorchScript archive (truncated or not a d2ops model); "
                               f"re-export the artifact")
    return directory


def build_model_archive(model_dir: Path, model_store: Path) -> Path:
    """torch-model-archiver: model.pt, its other forms, metadata.json and the handler, unzipped into the model store."""
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_packaging import generate_model_archive

    model_store.mkdir(parents=True, exist_ok=True)
    # Every form the artifact holds travels: the handler loads the one load_artifact picks (D2OPS_MODEL_FORM).
    extra = [str(model_dir / name) for name in ("metadata.json", "evaluation.json", CUDA_MODEL_FILE, EXPORTED_FILE,
                                                AOTI_FILE)
             if (model_dir / name).is_file()]
    generate_model_archive(ModelArchiverConfig(
        model_name=MODEL_NAME, version=MODEL_VERSION, handler=str(HANDLER_FILE),
        serialized_file=str(model_dir / MODEL_FILE), extra_files=",".join(extra),
        export_path=str(model_store), archive_format="no-archive", force=True))
    return model_store / MODEL_NAME


def read_properties(path: Path) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def render_config(base: Mapping[str, str], *, model_store: Path, plugins: Path, inference_address: str,
                  management_address: str, metrics_address: str, settings: BatchSettings,
                  grpc_ports: tuple[int, int] | None = None) -> dict[str, str]:
    """The base configuration plus this server's addresses and its one model, loaded at start.

    Exactly one model is loaded so ``/invocations`` (which goes to the single startup model)
    is unambiguous. TorchServe 0.12 always opens its gRPC ports too (there is no switch), so a
    second server on the same machine needs its own ``grpc_ports`` (inference, management).
    """
    grpc = {} if grpc_ports is None else {"grpc_inference_port": str(grpc_ports[0]),
                                          "grpc_management_port": str(grpc_ports[1])}
    model = {MODEL_VERSION: {"defaultVersion": True, "marName": MODEL_NAME, "minWorkers": settings.workers,
                             "maxWorkers": settings.workers, "batchSize": settings.batch_size,
                             "maxBatchDelay": settings.max_batch_delay_ms}}
    return {**base, "inference_address": inference_address, "management_address": management_address,
            "metrics_address": metrics_address, "model_store": str(model_store), "plugins_path": str(plugins),
            **grpc, "load_models": MODEL_NAME,
            "models": json.dumps({MODEL_NAME: model}, separators=(",", ":"))}


def write_properties(path: Path, props: Mapping[str, str]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    os.replace(tmp, path)
    return path


MAX_UNIX_SOCKET_PATH = 100


def temp_dir(workdir: Path) -> tuple[Path, bool]:
    """TorchServe's temp dir and whether it is outside ``workdir`` (then its owner removes it at stop)."""
    inside = workdir / "tmp"
    if len(str(inside / ".ts.sock.9999")) <= MAX_UNIX_SOCKET_PATH:
        return inside, False
    # Workers listen on a Unix socket in the temp dir; a deep workdir would exceed the
    # 107-byte socket path limit ("AF_UNIX path too long"), so use a short one instead.
    return Path(tempfile.mkdtemp(prefix="d2ops-ts-")), True


def serving_env(workdir: Path, base: Mapping[str, str] = os.environ, *, tmp: Path | None = None) -> dict[str, str]:
    """Environment for TorchServe: its logs, temp files and pid file under ``workdir`` (or ``tmp``)."""
    tmp = tmp if tmp is not None else temp_dir(workdir)[0]
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(base)
    env.update({
        "LOG_LOCATION": str(workdir / "logs"), "METRICS_LOCATION": str(workdir / "logs"),
        # TorchServe keeps a pid file in the temp dir and refuses to start a second server that
        # shares it: a temp dir per server lets blue and green run side by side.
        "TEMP": str(tmp), "TMPDIR": str(tmp),
        # Hand request bodies to the handler as bytes, so JSON errors are ours to report.
        "TS_DECODE_INPUT_REQUEST": "false",
        "PYTHONUNBUFFERED": "1",
    })
    return env  # the workers import model_code as an installed package, like this module


def torchserve_command(config_file: Path, model_store: Path) -> list[str]:
    return [sys.executable, "-m", "ts.model_server", "--foreground", "--ts-config", str(config_file),
            "--model-store", str(model_store), "--ncs", "--disable-token-auth"]


def prepare(model_path: Path | str, workdir: Path | str, *, inference_address: str, management_address: str,
            metrics_address: str, settings: BatchSettings, base_config: Path | None = None,
            grpc_ports: tuple[int, int] | None = None) -> Path:
    """Steps 1-3: check the artifact, build the archive, write ``config.properties``; returns its path."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model_dir(model_path, work)
    store = work / "model-store"
    build_model_archive(model_dir, store)
    base = read_properties(base_config or config_path())
    props = render_config(base, model_store=store, plugins=plugins_dir(), inference_address=inference_address,
                          management_address=management_address, metrics_address=metrics_address, settings=settings,
                          grpc_ports=grpc_ports)
    return write_properties(work / "config.properties", props)


class ServerProcess:
    """A server in its own session, so stopping it can signal every process it made.

    Subclasses say what to run (:meth:`command`, :meth:`environment`); start, ``/ping`` and the
    group's stop are the same for TorchServe and Ray Serve.
    """

    name = "the server"
    # TorchServe's wrapper only waits for Java: its children are stopped first. A leader that shuts its
    # own children down (Ray's driver: serve.shutdown, ray.shutdown) is signalled first instead.
    leader_first = False

    def __init__(self, workdir: Path, ping_url: str, *, stdout: IO[bytes] | int | None = None):
        self.workdir = workdir
        self.ping_url = ping_url
        self.stdout = stdout
        self.proc: subprocess.Popen[bytes] | None = None
        # The server's temp dir, when a short one outside the work dir had to be made (Unix socket paths are
        # limited to 107 bytes): removed at stop, not left in /tmp once per server started.
        self.temp: Path | None = None
        self._own_temp = False

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command(), cwd=self.workdir, env=self.environment(), stdout=self.stdout,
                                     stderr=subprocess.STDOUT if self.stdout is not None else None,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServingError(f"{self.name} was not started")
        return self.proc.pid

    def ping(self, timeout: float = 2.0) -> int | None:
        """The /ping status code, or None while nothing listens."""
        return process.ping(self.ping_url, timeout)

    def wait_healthy(self, timeout: float) -> float:
        """Block until /ping answers 200; returns the seconds waited. Fails early if the server exits."""
        try:
            return process.wait_healthy(self.ping_url, self.proc, timeout, name=self.name)
        except process.HealthWaitError as exc:
            raise ServingError(f"{exc}; see {self.logs_dir}") from exc

    def stop(self, timeout: float = 30.0) -> None:
        try:
            self._stop_group(timeout)
        finally:
            if self._own_temp and self.temp is not None:
                shutil.rmtree(self.temp, ignore_errors=True)

    def _stop_group(self, timeout: float) -> None:
        """Stop the leader's children (TorchServe's Java and workers), then the leader, or the leader first
        (:attr:`leader_first`); SIGKILL what is left in the group after ``timeout``.

        TorchServe's wrapper waits for Java and so reaps it; it is signalled last so no process is
        orphaned. Anything still in the group at the deadline is killed, whichever the order.
        """
        if self.proc is None:
            return
        pgid = self.proc.pid  # the session leader's pid is the group id
        for pid in [pgid] if self.leader_first else _group_members(pgid):
            if pid != pgid or self.leader_first:
                _signal(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + 5
        while _group_members(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGTERM)
            time.sleep(0.1)
        while _group_members(pgid):
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.05)
        self.proc.wait()


class TorchServeProcess(ServerProcess):
    """``torchserve --foreground`` with the effective ``config.properties``."""

    name = "TorchServe"

    def __init__(self, config_file: Path, workdir: Path, ping_url: str, *, stdout: IO[bytes] | int | None = None):
        super().__init__(workdir, ping_url, stdout=stdout)
        self.config_file = config_file
        self.temp, self._own_temp = temp_dir(workdir)

    def command(self) -> list[str]:
        return torchserve_command(self.config_file, Path(read_properties(self.config_file)["model_store"]))

    def environment(self) -> dict[str, str]:
        return serving_env(self.workdir, tmp=self.temp)


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where the kernel refuses.

    Ray's processes can outlive their parent for a moment at shutdown (workers after the raylet); orphans
    are handed to the nearest subreaper, which must ``wait`` for them or they stay zombies. Here that is
    the entry point, which reaps them (:func:`reap_orphans`), not whoever started it.
    """
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(keep: int | None = None) -> int:
    """``wait`` for this process's exited children other than ``keep`` (the server, which Popen waits for)."""
    import psutil

    reaped = 0
    for child in psutil.Process().children():
        try:
            if child.pid != keep and child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
                reaped += 1
        except (psutil.Error, ChildProcessError):
            continue
    return reaped


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in the group."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return members
