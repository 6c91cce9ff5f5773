"""Adapters from the offline SageMaker service to the local job runner and the local serving image.

The training payload's runner (`d2ops.local.jobs`) and the serving module
(`d2ops.local.serving`) own how a job or an endpoint runs on this machine; these adapters only
translate the SageMaker requests into their arguments and their results back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from d2ops.local import container_entry
from d2ops.local import jobs as local_jobs
from d2ops.local import serving as local_serving
from d2ops.offline.services.sagemaker_endpoints import ServedModel
from d2ops.offline.services.sagemaker_jobs import JOB_LOG, JobOutcome

PROCESSING_OUTPUT_ROOT = PurePosixPath("/opt/ml/processing/output")
ENDPOINT_STARTUP_SECONDS = 300.0


class _LogTee:
    """Keeps a job's log lines (for its metric regexes) and writes them to the job's log file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
            self._file.write(line.rstrip("\n") + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _command(app: dict[str, Any], default: tuple[str, ...]) -> tuple[str, ...]:
    """ContainerEntrypoint + ContainerArguments as this machine runs them (``d2ops.local.container_entry``)."""
    entrypoint = list(app.get("ContainerEntrypoint") or [])
    if not entrypoint:
        return default
    return container_entry.local_command([*entrypoint, *(app.get("ContainerArguments") or [])])


def _run_logged(run: Callable[[Callable[[str], None]], local_jobs.JobResult],
                work_dir: Path) -> tuple[local_jobs.JobResult | JobOutcome, list[str]]:
    """``run(log)`` with its lines teed to the job's log file: its result, or the failed JobOutcome of a job
    the local runner refused (LocalJobError); and the lines it logged."""
    tee = _LogTee(work_dir / JOB_LOG)
    try:
        return run(tee), tee.lines
    except local_jobs.LocalJobError as exc:
        return JobOutcome(failure_reason=f"ClientError: {exc}", log_lines=tee.lines), tee.lines
    finally:
        tee.close()


class LocalJobBackend:
    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        resources = request.get("ResourceConfig") or {}
        stopping = request.get("StoppingCondition") or {}
        spec = local_jobs.TrainingJobSpec(
            job_name=request["TrainingJobName"], channels=channels, work_dir=work_dir / "hosts",
            output_dir=work_dir / "output", hyperparameters=dict(request.get("HyperParameters") or {}),
            instance_count=int(resources.get("InstanceCount", 1)),
            environment=dict(request.get("Environment") or {}),  # as SageMaker sets the container's
            max_runtime_seconds=stopping.get("MaxRuntimeInSeconds"))
        result, lines = _run_logged(lambda log: local_jobs.run_training_job(spec, stop=stop, log=log), work_dir)
        if isinstance(result, JobOutcome):
            return result
        reason = result.failure_reason if result.status != "Completed" else None
        if result.status == "Stopped":
            reason = reason or "the job was stopped"
        return JobOutcome(failure_reason=reason, model_tar=result.model_artifact, output_tar=result.output_artifact,
                          log_lines=lines)

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        app = request.get("AppSpecification") or {}
        stopping = request.get("StoppingCondition") or {}
        output_dir = work_dir / "output"
        try:
            command = _command(app, local_jobs.EVALUATION_COMMAND)
        except container_entry.EntryError as exc:
            return JobOutcome(failure_reason=f"ClientError: ContainerEntrypoint: {exc}")
        spec = local_jobs.ProcessingJobSpec(
            job_name=request["ProcessingJobName"], inputs=inputs, work_dir=work_dir / "root", output_dir=output_dir,
            command=command,
            environment=dict(request.get("Environment") or {}), max_runtime_seconds=stopping.get("MaxRuntimeInSeconds"))
        result, lines = _run_logged(lambda log: local_jobs.run_processing_job(spec, stop=stop, log=log), work_dir)
        if isinstance(result, JobOutcome):
            return result
        if result.status != "Completed":
            return JobOutcome(failure_reason=result.failure_reason or f"the job ended {result.status}",
                              log_lines=lines)
        outputs: dict[str, Path] = {}
        for output in (request.get("ProcessingOutputConfig") or {}).get("Outputs") or []:
            local = PurePosixPath(output["S3Output"]["LocalPath"])
            # A ".." part would leave the output dir while still "under" it as text (no PurePath resolves it).
            if ".." in local.parts or (local != PROCESSING_OUTPUT_ROOT and PROCESSING_OUTPUT_ROOT not in local.parents):
                return JobOutcome(failure_reason=f"ClientError: output {output['OutputName']} LocalPath {local} is "
                                                 f"not under {PROCESSING_OUTPUT_ROOT}, the one output dir "
                                                 "the local runner collects", log_lines=lines)
            collected = output_dir / local.relative_to(PROCESSING_OUTPUT_ROOT)
            if not collected.resolve().is_relative_to(output_dir.resolve()):  # a link the job made, say
                return JobOutcome(failure_reason=f"ClientError: output {output['OutputName']} LocalPath {local} "
                                                 f"leads outside {PROCESSING_OUTPUT_ROOT}", log_lines=lines)
            outputs[output["OutputName"]] = collected
        return JobOutcome(failure_reason=None, processing_outputs=outputs, log_lines=lines)


class LocalServingBackend:
    """The serving image's entry point on loopback, running the server the model's container Environment
    names (``D2OPS_SERVING_BACKEND``: TorchServe unless it says ``ray-serve``), as SageMaker would."""

    def start(self, model_tar: Path, work_dir: Path, name: str,
              environment: Mapping[str, str] | None = None) -> ServedModel:
        # LocalEndpoint gives each server its own ports (HTTP and gRPC): a blue/green update runs two.
        endpoint = local_serving.LocalEndpoint(model_tar, workdir=work_dir / "serve",
                                               startup_timeout=ENDPOINT_STARTUP_SECONDS, environment=environment)
        return endpoint.start()
