"""SageMaker training and processing jobs as local processes, honouring the container contract.

A training job gets one ``/opt/ml``-shaped tree per host under ``work_dir/<host>/``
(config JSON files, channel links, model/output/checkpoint directories), one process per
host with the ``SM_*`` variables the SageMaker training toolkit would set, ranks meeting
over loopback, logs streamed with a ``[host]`` prefix (``d2ops.local.job_log``), metric lines parsed with
``d2ops_core.metrics``, and the results packed as ``model.tar.gz``/``output.tar.gz``.

Each host runs the command its image declares (``d2ops.local.container_entry``: the Dockerfile's
ENTRYPOINT with ``train`` appended, as SageMaker runs it), and sees its tree at ``/opt/ml``
itself: every host process gets its own private mount namespace (``unshare -m``) with its tree
bind-mounted there, so several hosts on one machine each have their own ``/opt/ml``. That needs
root on Linux; elsewhere the runner falls back to pointing ``D2OPS_ML_ROOT`` at the tree (which
the job code honours) and says so once in the job log. Otherwise only torch's own
``MASTER_ADDR``/``MASTER_PORT`` differ from SageMaker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from d2ops.local import container_entry
from d2ops.local.job_log import host_line
from d2ops_core import metrics
from model_code.archive import pack_directory  # standard library only: no torch here

Status = Literal["Completed", "Failed", "Stopped"]
# The evaluation job's ContainerEntrypoint (prepare_training sets the same), for specs that name none.
EVALUATION_COMMAND = container_entry.local_command(("/usr/local/bin/cuda-compat", "python", "-m",
                                                   "model_code.evaluation.job"))
ML_ROOT = Path("/opt/ml")
ML_MOUNT_VARIABLE = "D2OPS_ML_MOUNT"  # auto (default) | namespace | remap
# Runs inside the host's new mount namespace: the bind mount is private to it, then the job replaces
# the shell (same pid, so the runner's signals reach the job itself).
_MOUNT_SCRIPT = ('mount --bind "$1" /opt/ml || { echo "d2ops local runner: cannot bind-mount $1 at /opt/ml" >&2; '
                 'exit 125; }; shift; exec "$@"')
PEER_FAILURE_GRACE_SECONDS = 10.0
STOP_GRACE_SECONDS = 120.0  # SageMaker gives a stopped container about two minutes


class LocalJobError(Exception):
    """The job could not be started (bad channel path, unusable work directory)."""


@dataclass
class JobResult:
    job_name: str
    status: Status
    failure_reason: str | None
    exit_codes: dict[str, int | None]
    metrics: dict[str, float]
    seconds: float
    model_artifact: Path | None = None
    output_artifact: Path | None = None
    outputs: dict[str, Path] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """A flat JSON-able description (DescribeTrainingJob-like)."""
        out: dict[str, Any] = {"job_name": self.job_name, "status": self.status, "failure_reason": self.failure_reason,
                               "seconds": round(self.seconds, 1), "exit_codes": self.exit_codes,
                               "final_metrics": self.metrics}
        if self.model_artifact:
            out["model_artifact"] = str(self.model_artifact)
        if self.output_artifact:
            out["output_artifact"] = str(self.output_artifact)
        return out


@dataclass
class TrainingJobSpec:
    job_name: str
    channels: Mapping[str, Path]
    work_dir: Path  # holds <host>/ trees; reuse it to resume from the checkpoints it holds
    output_dir: Path  # receives model.tar.gz and output.tar.gz, as S3OutputPath would
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    instance_count: int = 1
    command: tuple[str, ...] | None = None  # default: the training image's declared entry + "train"
    environment: Mapping[str, str] = field(default_factory=dict)
    code_dir: Path | None = None  # extra code on PYTHONPATH (like /opt/ml/code); model_code is installed
    cpus_per_host: int | None = None  # default: local_cpus(), this machine's cores less one split over the hosts
    max_runtime_seconds: float | None = None

    def hosts(self) -> list[str]:
        return [f"algo-{i + 1}" for i in range(self.instance_count)]


@dataclass
class ProcessingJobSpec:
    job_name: str
    inputs: Mapping[str, Path]  # name -> local file or directory (mounted at /opt/ml/processing/input/<name>)
    work_dir: Path
    output_dir: Path  # receives the contents of /opt/ml/processing/output
    command: tuple[str, ...] = EVALUATION_COMMAND
    environment: Mapping[str, str] = field(default_factory=dict)
    code_dir: Path | None = None
    max_runtime_seconds: float | None = None


@dataclass(frozen=True)
class MlMount:
    """How job processes find their tree: at /opt/ml itself (namespace) or through D2OPS_ML_ROOT."""

    namespace: bool
    reason: str  # why not, when not

    def describe(self, root: Path) -> str:
        if self.namespace:
            return f"local runner: the job sees {root} at {ML_ROOT} (a private mount namespace per process)"
        return (f"local runner: cannot mount the job's tree at {ML_ROOT} ({self.reason}); the job reads it from "
                f"{root} through D2OPS_ML_ROOT instead")

    def wrap(self, root: Path, command: tuple[str, ...]) -> tuple[str, ...]:
        if not self.namespace:
            return command
        return ("unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_SCRIPT, "d2ops-mount",
                str(root), *command)

    def view(self, root: Path) -> Path:
        """Where the job itself sees ``root``."""
        return ML_ROOT if self.namespace else root


@functools.lru_cache(maxsize=4)
def _probe_namespace(requested: str) -> MlMount:
    if requested == "remap":
        return MlMount(False, f"{ML_MOUNT_VARIABLE}=remap")
    if not sys.platform.startswith("linux"):
        return MlMount(False, f"mount namespaces are Linux-only, this is {sys.platform}")
    if os.geteuid() != 0:
        return MlMount(False, "binding a directory at /opt/ml needs root")
    missing = [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return MlMount(False, f"{' and '.join(missing)} not found")
    try:
        ML_ROOT.mkdir(parents=True, exist_ok=True)  # the mount point; stays empty outside the namespaces
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                f"mount -t tmpfs d2ops-probe {ML_ROOT}"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MlMount(False, f"cannot prepare {ML_ROOT}: {exc}")
    if probe.returncode != 0:
        return MlMount(False, f"unshare --mount failed: {(probe.stderr or probe.stdout).strip()[:200]}")
    return MlMount(True, "")


def ml_mount(environ: Mapping[str, str] = os.environ) -> MlMount:
    """Namespace when this machine allows it (or ``D2OPS_ML_MOUNT=namespace`` insists), else remap."""
    requested = environ.get(ML_MOUNT_VARIABLE, "auto") or "auto"
    if requested not in ("auto", "namespace", "remap"):
        raise LocalJobError(f"{ML_MOUNT_VARIABLE}={requested!r}: expected auto, namespace or remap")
    mount = _probe_namespace(requested)
    if requested == "namespace" and not mount.namespace:
        raise LocalJobError(f"{ML_MOUNT_VARIABLE}=namespace, but {mount.reason}")
    return mount


def training_command(spec: TrainingJobSpec) -> tuple[str, ...]:
    try:
        return spec.command or container_entry.image_command("training")
    except container_entry.EntryError as exc:
        raise LocalJobError(f"training image entry: {exc}") from exc


def _absolute(spec: TrainingJobSpec) -> TrainingJobSpec:
    """Relative paths are the caller's; the job runs elsewhere (cwd = its tree), so resolve them here."""
    return dataclasses.replace(spec, work_dir=spec.work_dir.absolute(), output_dir=spec.output_dir.absolute(),
                               channels={name: Path(path).absolute() for name, path in spec.channels.items()},
                               code_dir=spec.code_dir and spec.code_dir.absolute())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_json(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)


def _link(target: Path, link: Path) -> None:
    if link.is_symlink() or link.is_file():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target.resolve(), target_is_directory=target.is_dir())


def local_cpus(hosts: int = 1, cores: int | None = None) -> int:
    """Cores one process of a local job may use: this machine's (usable_cores) less one, split over the job's hosts.

    A local job shares the machine with the offline runtime and whatever else the user runs (a
    SageMaker instance is the job's own). A training step is thousands of OpenMP parallel regions,
    each ending at a barrier that waits for its slowest thread: with a thread on every core, any
    other busy process holds every region up. On 2 cores (docs/training.md, "Threads"), the
    detectron2 CPU profile's second thread gained at most 1.35x on an idle machine and cost up to
    10x under other work (0.30 vs 0.41 s a step idle; 3.6-11.3 vs 1.2 s at load average 7-11).
    """
    cores = cores or usable_cores()
    return max(1, (cores - 1) // max(1, hosts))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's cpuset), not the host's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _base_environment(code_dir: Path | None, cpus: int, extra: Mapping[str, str]) -> dict[str, str]:
    # The job's own variables first, as SageMaker sets the container's; what the runner sets below wins
    # over them: a request's PATH or PYTHONPATH must not decide which code the runner's command loads.
    env = container_entry.host_environment()
    env.pop("D2OPS_CHECKPOINT_DIR", None)  # this shell's, not the job's (a job's own Environment may set it)
    env.update(extra)
    env.pop("D2OPS_ML_ROOT", None)  # set by the runner only where the tree cannot be at /opt/ml
    env["PATH"] = os.environ.get("PATH", os.defpath)
    container_entry.python_on_path(env)  # the image's scripts run `python`: here, this interpreter
    env.pop("PYTHONPATH", None)
    python_path = [str(code_dir)] if code_dir is not None else []
    python_path += filter(None, [os.environ.get("PYTHONPATH")])
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(python_path)
    env["PYTHONUNBUFFERED"] = "1"
    # One BLAS/OpenMP pool per process sized to its share of the cores (local_cpus), not all of them each.
    env["OMP_NUM_THREADS"] = str(cpus)
    # OpenMP threads that wait for the others sleep instead of spinning (libgomp's default spins first):
    # on a shared machine spinning takes the core from the thread being waited for. A value set wins.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def prepare_training_host(spec: TrainingJobSpec, host: str, master_port: int,
                          mount: MlMount | None = None) -> tuple[Path, dict[str, str]]:
    """Lay out ``work_dir/<host>`` as /opt/ml and return (root, environment) for its process.

    The environment's paths are the ones the job sees: under /opt/ml in a mount namespace,
    else under the tree itself (with ``D2OPS_ML_ROOT`` set).
    """
    spec = _absolute(spec)
    mount = mount or MlMount(False, "no mount requested")
    for name, path in spec.channels.items():
        if not Path(path).is_dir():
            raise LocalJobError(f"channel {name!r}: {path} is not a directory")
    hosts = spec.hosts()
    root = spec.work_dir / host
    config = root / "input" / "config"
    hyperparameters = {k: str(v) for k, v in spec.hyperparameters.items()}
    _write_json(config / "hyperparameters.json", hyperparameters)
    _write_json(config / "resourceconfig.json", {"current_host": host, "hosts": hosts,
                                                  "network_interface_name": "lo"})
    _write_json(config / "inputdataconfig.json", {
        name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
        for name in spec.channels})
    data = root / "input" / "data"
    data.mkdir(parents=True, exist_ok=True)
    seen = mount.view(root)
    for stale in data.iterdir():
        if stale.name not in spec.channels and stale.is_symlink():
            stale.unlink()  # a restarted job with fewer channels must not see the old ones
    for name, path in spec.channels.items():
        _link(Path(path), data / name)
    for sub in ("model", "output/data", "checkpoints"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "output" / "failure").unlink(missing_ok=True)

    cpus = spec.cpus_per_host or local_cpus(len(hosts))
    env = _base_environment(spec.code_dir, cpus, spec.environment)
    if not mount.namespace:
        env["D2OPS_ML_ROOT"] = str(root)
    env.update({
        "TRAINING_JOB_NAME": spec.job_name,
        "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": host, "SM_NUM_GPUS": "0", "SM_NUM_CPUS": str(cpus),
        "SM_NETWORK_INTERFACE_NAME": "lo",
        "SM_CHANNELS": json.dumps(sorted(spec.channels)),
        **{f"SM_CHANNEL_{name.upper()}": str(seen / "input" / "data" / name) for name in spec.channels},
        "SM_HPS": json.dumps(hyperparameters),
        "SM_INPUT_CONFIG_DIR": str(seen / "input" / "config"), "SM_INPUT_DATA_DIR": str(seen / "input" / "data"),
        "SM_MODEL_DIR": str(seen / "model"), "SM_OUTPUT_DIR": str(seen / "output"),
        "SM_OUTPUT_DATA_DIR": str(seen / "output" / "data"),
        # Host names algo-N do not resolve here; torch's own variables point the rendezvous at loopback.
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
    })
    return root, env


class _Streams:
    """Copies each process's output line by line with a prefix and collects metric lines."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.metrics: dict[str, float] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def follow(self, host: str, stream: Any) -> None:
        def pump() -> None:
            for raw in stream:
                line = raw.rstrip("\n")
                parsed = metrics.parse_metric_line(line)
                with self.lock:
                    if parsed:
                        self.metrics[parsed[0]] = parsed[1]
                    self.log(host_line(host, line))
            stream.close()

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=10)


def _start(command: tuple[str, ...], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(list(command), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)


def _signal(proc: subprocess.Popen[str], signum: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)  # the host's whole process group: its worker processes too


def _supervise(procs: dict[str, subprocess.Popen[str]], stop: threading.Event | None,
               max_runtime: float | None, log: Callable[[str], None]) -> tuple[bool, str | None]:
    """Wait for every process; stop them all on request, timeout, or when a peer fails. (stopped, reason)"""
    started = time.monotonic()
    failed_at: float | None = None
    stopping_since: float | None = None
    reason: str | None = None
    while any(p.poll() is None for p in procs.values()):
        now = time.monotonic()
        if stopping_since is None:
            if stop is not None and stop.is_set():
                reason = "stop requested"
            elif max_runtime is not None and now - started > max_runtime:
                reason = f"MaxRuntimeExceeded: the job ran longer than {max_runtime:.0f} s"
            if reason:
                log(f"stopping the job ({reason}): SIGTERM to every host")
                for p in procs.values():
                    _signal(p, signal.SIGTERM)
                stopping_since = now
        elif now - stopping_since > STOP_GRACE_SECONDS:
            for p in procs.values():
                _signal(p, signal.SIGKILL)
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs.values()):
            failed_at = now
        if failed_at is not None and now - failed_at > PEER_FAILURE_GRACE_SECONDS:
            # SageMaker ends the whole job when one host fails; peers would otherwise wait on a collective.
            for p in procs.values():
                _signal(p, signal.SIGKILL)
        time.sleep(0.2)
    return stopping_since is not None, reason


@dataclass(frozen=True)
class _Ran:
    """How a job's processes ended: exit codes per host, whether (and why) the runner stopped them."""

    codes: dict[str, int | None]
    stopped: bool
    stop_reason: str | None
    metrics: dict[str, float]

    @property
    def status(self) -> Status:
        if self.stopped and self.stop_reason == "stop requested":
            return "Stopped"
        return "Completed" if not self.stopped and all(c == 0 for c in self.codes.values()) else "Failed"


def _run_hosts(launches: Mapping[str, tuple[tuple[str, ...], dict[str, str], Path]], stop: threading.Event | None,
               max_runtime: float | None, log: Callable[[str], None]) -> _Ran:
    """The lifecycle every local job shares (training hosts and processing alike): one process per host in
    its own session, its output streamed with the host's prefix and metric lines collected, supervised
    (stop request, max runtime, a failed peer), and every process killed if the runner itself fails."""
    streams = _Streams(log)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for host, (command, env, cwd) in launches.items():
            procs[host] = _start(command, env, cwd)
            streams.follow(host, procs[host].stdout)
        stopped, stop_reason = _supervise(procs, stop, max_runtime, log)
    except BaseException:
        for p in procs.values():
            _signal(p, signal.SIGKILL)
        raise
    streams.join()
    return _Ran({h: p.returncode for h, p in procs.items()}, stopped, stop_reason, dict(streams.metrics))


def run_training_job(spec: TrainingJobSpec, *, stop: threading.Event | None = None,
                     log: Callable[[str], None] = print) -> JobResult:
    if spec.instance_count < 1:
        raise LocalJobError(f"instance_count must be at least 1, got {spec.instance_count}")
    spec = _absolute(spec)
    command = training_command(spec)
    mount = ml_mount({**os.environ, **spec.environment})
    port = free_port()
    started = time.monotonic()
    roots: dict[str, Path] = {}
    launches: dict[str, tuple[tuple[str, ...], dict[str, str], Path]] = {}
    for host in spec.hosts():
        roots[host], env = prepare_training_host(spec, host, port, mount)
        launches[host] = (mount.wrap(roots[host], command), env, roots[host])
    log(mount.describe(spec.work_dir / "algo-N"))
    ran = _run_hosts(launches, stop, spec.max_runtime_seconds, log)
    codes, status = ran.codes, ran.status
    master = spec.hosts()[0]
    reason: str | None = None
    if status == "Failed":
        reason = ran.stop_reason if ran.stopped else None
        for host in sorted(codes, key=lambda h: (codes[h] == 0, h)):
            failure = roots[host] / "output" / "failure"
            if reason is None and failure.is_file() and failure.read_text().strip():
                reason = f"{host}: {failure.read_text().strip()}"
        if reason is None:
            bad = {h: c for h, c in codes.items() if c != 0}
            reason = f"AlgorithmError: hosts exited with codes {bad} and wrote no failure file"
    result = JobResult(job_name=spec.job_name, status=status, failure_reason=reason, exit_codes=codes,
                       metrics=ran.metrics, seconds=time.monotonic() - started)
    output_data = roots[master] / "output" / "data"
    if output_data.is_dir() and any(output_data.iterdir()):
        result.output_artifact = pack_directory(output_data, spec.output_dir / "output.tar.gz")
    model_dir = roots[master] / "model"
    if status == "Completed" and model_dir.is_dir() and any(model_dir.iterdir()):
        result.model_artifact = pack_directory(model_dir, spec.output_dir / "model.tar.gz")
    _write_json(spec.output_dir / "job.json", result.summary())
    return result


def prepare_processing(spec: ProcessingJobSpec, mount: MlMount | None = None) -> tuple[Path, dict[str, str]]:
    """Lay out ``work_dir`` as /opt/ml with processing/input/<name> and processing/output."""
    mount = mount or MlMount(False, "no mount requested")
    root = spec.work_dir.absolute()
    processing = root / "processing"
    for name, path in spec.inputs.items():
        source = Path(path)
        target = processing / "input" / name
        if source.is_dir():
            _link(source, target)
        elif source.is_file():
            # An S3 prefix naming one object (model.tar.gz) is downloaded into the input directory.
            target.mkdir(parents=True, exist_ok=True)
            _link(source, target / source.name)
        else:
            raise LocalJobError(f"processing input {name!r}: {source} does not exist")
    (processing / "output").mkdir(parents=True, exist_ok=True)
    (root / "output" / "message").unlink(missing_ok=True)
    env = _base_environment(spec.code_dir, local_cpus(), spec.environment)
    if not mount.namespace:
        env["D2OPS_ML_ROOT"] = str(root)
    env["PROCESSING_JOB_NAME"] = spec.job_name
    return root, env


def run_processing_job(spec: ProcessingJobSpec, *, stop: threading.Event | None = None,
                       log: Callable[[str], None] = print) -> JobResult:
    started = time.monotonic()
    spec = dataclasses.replace(spec, work_dir=spec.work_dir.absolute(), output_dir=spec.output_dir.absolute(),
                               inputs={name: Path(path).absolute() for name, path in spec.inputs.items()},
                               code_dir=spec.code_dir and spec.code_dir.absolute())
    mount = ml_mount({**os.environ, **spec.environment})
    root, env = prepare_processing(spec, mount)
    log(mount.describe(root))
    ran = _run_hosts({"processing": (mount.wrap(root, spec.command), env, root)}, stop, spec.max_runtime_seconds,
                     log)
    status, reason = ran.status, None
    if status == "Failed":
        message = root / "output" / "message"
        reason = (message.read_text().strip() if message.is_file() else None) or ran.stop_reason or \
            f"AlgorithmError: exited with code {ran.codes['processing']}"
    outputs: dict[str, Path] = {}
    produced = root / "processing" / "output"
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(produced.rglob("*")):
        if item.is_file():
            dest = spec.output_dir / item.relative_to(produced)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".tmp")
            tmp.write_bytes(item.read_bytes())
            os.replace(tmp, dest)
            outputs[str(item.relative_to(produced))] = dest
    return JobResult(job_name=spec.job_name, status=status, failure_reason=reason, exit_codes=ran.codes,
                     metrics=ran.metrics, seconds=time.monotonic() - started, outputs=outputs)
