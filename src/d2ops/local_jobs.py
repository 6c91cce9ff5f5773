"""SageMaker training and processing jobs as local processes, honouring the container contract.

A training job gets one ``/opt/ml``-shaped tree per host under ``work_dir/<host>/``
(config JSON files, channel links, model/output/checkpoint directories), one process per
host with the ``SM_*`` variables the SageMaker training toolkit would set, ranks meeting
over loopback, logs streamed with a ``[host]`` prefix, metric lines parsed with
``d2ops.metrics``, and the results packed as ``model.tar.gz``/``output.tar.gz``.
The job code is the real entry point, unchanged: only ``D2OPS_ML_ROOT`` (where the tree
is) and torch's own ``MASTER_ADDR``/``MASTER_PORT`` differ from SageMaker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from d2ops import metrics

Status = Literal["Completed", "Failed", "Stopped"]
REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINING_COMMAND = (sys.executable, "-m", "model_code.training.train")
EVALUATION_COMMAND = (sys.executable, "-m", "model_code.evaluation.job")
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
    command: tuple[str, ...] = TRAINING_COMMAND
    environment: Mapping[str, str] = field(default_factory=dict)
    code_dir: Path = REPO_ROOT  # on PYTHONPATH, like /opt/ml/code
    cpus_per_host: int | None = None  # default: this machine's cores split over the hosts
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
    code_dir: Path = REPO_ROOT
    max_runtime_seconds: float | None = None


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


def _base_environment(code_dir: Path, cpus: int, extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("D2OPS_CHECKPOINT_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join([str(code_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    # One BLAS/OpenMP pool per process sized to its share of the cores, not all of them each.
    env["OMP_NUM_THREADS"] = str(cpus)
    env.update(extra)
    return env


def prepare_training_host(spec: TrainingJobSpec, host: str, master_port: int) -> tuple[Path, dict[str, str]]:
    """Lay out ``work_dir/<host>`` as /opt/ml and return (root, environment) for its process."""
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
    for stale in data.iterdir():
        if stale.name not in spec.channels and stale.is_symlink():
            stale.unlink()  # a restarted job with fewer channels must not see the old ones
    for name, path in spec.channels.items():
        _link(Path(path), data / name)
    for sub in ("model", "output/data", "checkpoints"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "output" / "failure").unlink(missing_ok=True)

    cpus = spec.cpus_per_host or max(1, (os.cpu_count() or 1) // len(hosts))
    env = _base_environment(spec.code_dir, cpus, spec.environment)
    env.update({
        "D2OPS_ML_ROOT": str(root),
        "TRAINING_JOB_NAME": spec.job_name,
        "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": host, "SM_NUM_GPUS": "0", "SM_NUM_CPUS": str(cpus),
        "SM_NETWORK_INTERFACE_NAME": "lo",
        "SM_CHANNELS": json.dumps(sorted(spec.channels)),
        **{f"SM_CHANNEL_{name.upper()}": str(data / name) for name in spec.channels},
        "SM_HPS": json.dumps(hyperparameters),
        "SM_INPUT_CONFIG_DIR": str(config), "SM_INPUT_DATA_DIR": str(data),
        "SM_MODEL_DIR": str(root / "model"), "SM_OUTPUT_DIR": str(root / "output"),
        "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
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

    def follow(self, prefix: str, stream: Any) -> None:
        def pump() -> None:
            for raw in stream:
                line = raw.rstrip("\n")
                parsed = metrics.parse_metric_line(line)
                with self.lock:
                    if parsed:
                        self.metrics[parsed[0]] = parsed[1]
                    self.log(f"[{prefix}] {line}")
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


def pack_tar(directory: Path, tar_path: Path) -> Path:
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tar_path.with_name(tar_path.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name)
    os.replace(tmp, tar_path)
    return tar_path


def run_training_job(spec: TrainingJobSpec, *, stop: threading.Event | None = None,
                     log: Callable[[str], None] = print) -> JobResult:
    if spec.instance_count < 1:
        raise LocalJobError(f"instance_count must be at least 1, got {spec.instance_count}")
    port = free_port()
    started = time.monotonic()
    streams = _Streams(log)
    procs: dict[str, subprocess.Popen[str]] = {}
    roots: dict[str, Path] = {}
    try:
        for host in spec.hosts():
            roots[host], env = prepare_training_host(spec, host, port)
            procs[host] = _start(spec.command, env, roots[host])
            streams.follow(host, procs[host].stdout)
        stopped, stop_reason = _supervise(procs, stop, spec.max_runtime_seconds, log)
    except BaseException:
        for p in procs.values():
            _signal(p, signal.SIGKILL)
        raise
    streams.join()
    codes = {h: p.returncode for h, p in procs.items()}
    master = spec.hosts()[0]
    status: Status
    reason: str | None = None
    if stopped and stop_reason == "stop requested":
        status = "Stopped"
    elif all(c == 0 for c in codes.values()) and not stopped:
        status = "Completed"
    else:
        status = "Failed"
        reason = stop_reason if stopped else None
        for host in sorted(procs, key=lambda h: (codes[h] == 0, h)):
            failure = roots[host] / "output" / "failure"
            if reason is None and failure.is_file() and failure.read_text().strip():
                reason = f"{host}: {failure.read_text().strip()}"
        if reason is None:
            bad = {h: c for h, c in codes.items() if c != 0}
            reason = f"AlgorithmError: hosts exited with codes {bad} and wrote no failure file"
    result = JobResult(job_name=spec.job_name, status=status, failure_reason=reason, exit_codes=codes,
                       metrics=dict(streams.metrics), seconds=time.monotonic() - started)
    output_data = roots[master] / "output" / "data"
    if output_data.is_dir() and any(output_data.iterdir()):
        result.output_artifact = pack_tar(output_data, spec.output_dir / "output.tar.gz")
    model_dir = roots[master] / "model"
    if status == "Completed" and model_dir.is_dir() and any(model_dir.iterdir()):
        result.model_artifact = pack_tar(model_dir, spec.output_dir / "model.tar.gz")
    _write_json(spec.output_dir / "job.json", result.summary())
    return result


def prepare_processing(spec: ProcessingJobSpec) -> tuple[Path, dict[str, str]]:
    """Lay out ``work_dir`` as /opt/ml with processing/input/<name> and processing/output."""
    root = spec.work_dir
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
    env = _base_environment(spec.code_dir, max(1, os.cpu_count() or 1), spec.environment)
    env.update({"D2OPS_ML_ROOT": str(root), "PROCESSING_JOB_NAME": spec.job_name})
    return root, env


def run_processing_job(spec: ProcessingJobSpec, *, stop: threading.Event | None = None,
                       log: Callable[[str], None] = print) -> JobResult:
    started = time.monotonic()
    root, env = prepare_processing(spec)
    streams = _Streams(log)
    proc = _start(spec.command, env, root)
    streams.follow("processing", proc.stdout)
    try:
        stopped, stop_reason = _supervise({"processing": proc}, stop, spec.max_runtime_seconds, log)
    except BaseException:
        _signal(proc, signal.SIGKILL)
        raise
    streams.join()
    status: Status = "Completed" if proc.returncode == 0 and not stopped else "Failed"
    reason = None
    if stopped and stop_reason == "stop requested":
        status = "Stopped"
    elif status == "Failed":
        message = root / "output" / "message"
        reason = (message.read_text().strip() if message.is_file() else None) or stop_reason or \
            f"AlgorithmError: exited with code {proc.returncode}"
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
    return JobResult(job_name=spec.job_name, status=status, failure_reason=reason,
                     exit_codes={"processing": proc.returncode}, metrics=dict(streams.metrics),
                     seconds=time.monotonic() - started, outputs=outputs)
