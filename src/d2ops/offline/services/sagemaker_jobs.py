"""SageMaker training and processing jobs offline (CreateTrainingJob ... ListTrainingJobs,
CreateProcessingJob ... StopProcessingJob).

Jobs run in background threads that download their inputs from the local S3, hand them to a
`JobBackend` (local processes honouring the training-container contract), upload what the job
wrote where SageMaker would, and keep a DescribeTrainingJob / DescribeProcessingJob record
with real statuses, timings, FinalMetricDataList and FailureReason. Job records are persisted
under the work dir so the status API can describe them after a restart.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from d2ops.offline.errors import ApiError
from d2ops.offline.job_metrics import MetricPublisher, MetricScraper
from d2ops.offline.services.sagemaker_account import Fleet, SageMakerAccount, utc_now
from d2ops.offline.store import decode_datetimes, encode_datetimes, write_json_atomic
from d2ops_core.platform import QuotaUsage
from d2ops_core.s3_layout import parse_s3_uri

log = logging.getLogger(__name__)

TERMINAL_JOB_STATES = ("Completed", "Failed", "Stopped")
# A job's log (what CloudWatch Logs keeps under /aws/sagemaker/TrainingJobs), in the job's directory.
JOB_LOG = "job.log"


@dataclass
class JobOutcome:
    """What a local job left behind: artifacts to upload, or why it failed."""

    failure_reason: str | None
    model_tar: Path | None = None  # training: model.tar.gz
    output_tar: Path | None = None  # training: output.tar.gz
    processing_outputs: dict[str, Path] | None = None  # processing: OutputName -> local dir
    log_lines: list[str] | None = None


class JobBackend(Protocol):
    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome: ...

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome: ...


def final_metrics(lines: list[str], definitions: list[dict[str, str]]) -> list[dict[str, Any]]:
    """FinalMetricDataList: the last value each of the job's MetricDefinitions regexes found in its logs."""
    scraper = MetricScraper(definitions)
    last: dict[str, float] = {}
    for line in lines:
        last.update(scraper.scrape(line))
    now = utc_now()
    return [{"MetricName": name, "Value": value, "Timestamp": now} for name, value in last.items()]


def training_fleet(request: dict[str, Any]) -> list[Fleet]:
    """(instance type, quota usage, instances) a training job holds while it runs."""
    usage: QuotaUsage = "spot training" if request.get("EnableManagedSpotTraining") else "training"
    resources = request.get("ResourceConfig") or {}
    groups = resources.get("InstanceGroups") or [resources]
    return [(str(g["InstanceType"]), usage, float(g.get("InstanceCount", 1))) for g in groups
            if g.get("InstanceType")]


def processing_fleet(request: dict[str, Any]) -> list[Fleet]:
    """(instance type, quota usage, instances) a processing job holds while it runs."""
    cluster = (request.get("ProcessingResources") or {}).get("ClusterConfig") or {}
    return [(str(cluster["InstanceType"]), "processing", float(cluster.get("InstanceCount", 1)))] \
        if cluster.get("InstanceType") else []


@dataclass(frozen=True)
class JobKind:
    """What differs between SageMaker's two job kinds; one lifecycle (`LocalJobs`) serves both.

    The members are SageMaker's: ``<noun>Name``, ``<noun>Arn`` and ``<noun>Status`` in each request and record,
    ``Create<noun>``, ``Describe<noun>`` and ``Stop<noun>`` for the operations.
    """

    noun: str  # "TrainingJob"
    directory: str  # the records' folder under <work dir>/sagemaker, and the log's word for the kind
    arn_resource: str  # "training-job": arn:aws:sagemaker:<region>:<account>:training-job/<name>
    required: tuple[str, ...]  # members CreateX refuses to go without (besides the name)
    in_use: str  # SageMaker's ResourceInUse message for a name taken, of {arn}
    not_found: str  # SageMaker's ValidationException message for an unknown name, of {name}
    fleet: Callable[[dict[str, Any]], list[Fleet]]  # the instances a job holds while it runs (quotas)
    end_member: str  # when the job ended: TrainingEndTime, ProcessingEndTime
    failure_members: tuple[str, ...]  # the members that say why a job failed
    # Training jobs only: the SecondaryStatus history ("Training job completed", ...) and the billed seconds
    # counted from the start member (None: the kind has neither).
    secondary_label: str | None = None
    billed_from: str | None = None
    name_member: str = field(init=False)  # TrainingJobName
    arn_member: str = field(init=False)  # TrainingJobArn
    status_member: str = field(init=False)  # TrainingJobStatus

    def __post_init__(self) -> None:
        for member in ("Name", "Arn", "Status"):
            object.__setattr__(self, f"{member.lower()}_member", f"{self.noun}{member}")

    def operations(self) -> frozenset[str]:
        return frozenset(f"{verb}{self.noun}" for verb in ("Create", "Describe", "Stop"))


TRAINING = JobKind(
    "TrainingJob", "training", "training-job", ("AlgorithmSpecification", "OutputDataConfig", "ResourceConfig",
                                                "RoleArn"),
    in_use="Training job names must be unique within an AWS account and region, and a training job with this name "
           "already exists ({arn})",
    not_found="Requested resource not found: training job {name!r}",
    fleet=training_fleet, end_member="TrainingEndTime", failure_members=("FailureReason",),
    secondary_label="Training job", billed_from="TrainingStartTime")
PROCESSING = JobKind(
    "ProcessingJob", "processing", "processing-job", (),
    # SageMaker's answer, as a Step Functions execution's CreateProcessingJob failure quoted it.
    in_use="Job name must be unique within an AWS account and region, and a job with this name already exists "
           "({arn})",
    not_found="Could not find requested job with name {name}",
    fleet=processing_fleet, end_member="ProcessingEndTime", failure_members=("FailureReason", "ExitMessage"))
JOB_KINDS = (TRAINING, PROCESSING)

# What a kind does between its download of inputs and its upload of outputs: the members the record gets on
# completion (raises _Stopped or _JobFailed otherwise).
Work = Callable[[dict[str, Any], Path, threading.Event], dict[str, Any]]


class LocalJobs:
    """Training and processing jobs: their records, threads and files."""

    OPERATIONS = frozenset({"ListTrainingJobs"}.union(*(kind.operations() for kind in JOB_KINDS)))

    def __init__(self, account: SageMakerAccount, work_dir: Path, s3: Any, backend: JobBackend,
                 training_defaults: dict[str, str] | None = None, cloudwatch: Any = None) -> None:
        self.account = account
        self.work_dir = work_dir
        self.s3 = s3  # boto3 S3 client (moto)
        self.backend = backend
        # Hyperparameters a job gets when its request does not set them: a machine profile
        # (a CPU laptop trains at the data's resolution), recorded in the job's description.
        self.training_defaults = dict(training_defaults or {})
        self.cloudwatch = cloudwatch  # boto3 CloudWatch client: the jobs' metrics, as SageMaker publishes them
        self._lock = account.lock
        # A kind's noun -> job name -> its Describe record.
        self._jobs: dict[str, dict[str, dict[str, Any]]] = {kind.noun: {} for kind in JOB_KINDS}
        self._stops: dict[str, threading.Event] = {}
        self._records = work_dir / "sagemaker"
        self._reload()
        account.holds(self.fleets)

    # ----- persistence ---------------------------------------------------------------------
    def _save(self, kind: JobKind, record: dict[str, Any]) -> None:
        write_json_atomic(self._records / kind.directory / f"{record[kind.name_member]}.json",
                          encode_datetimes(record))

    def _reload(self) -> None:
        for kind in JOB_KINDS:
            for path in sorted((self._records / kind.directory).glob("*.json")):
                try:
                    record = decode_datetimes(json.loads(path.read_text("utf-8")))
                except (OSError, ValueError):
                    path.replace(path.with_suffix(".corrupt"))
                    continue
                if record.get(kind.status_member) not in TERMINAL_JOB_STATES:
                    # Its processes died with the runtime that ran it.
                    record[kind.status_member] = "Stopped"
                    record["FailureReason"] = "the offline runtime stopped while the job was running"
                    record["EndTime"] = record.get("LastModifiedTime", utc_now())
                    self._save(kind, record)
                self._jobs[kind.noun][record[kind.name_member]] = record

    def job_dir(self, name: str) -> Path:
        """Where a training or processing job runs: its channels, /opt/ml trees and :data:`JOB_LOG`."""
        return self.work_dir / "jobs" / name

    def job_log(self, name: str) -> Path:
        """The job's log lines as they come (every host's, ``[host] `` first), the job's CloudWatch log here."""
        return self.job_dir(name) / JOB_LOG

    # ----- quotas ----------------------------------------------------------------------------
    def fleets(self) -> list[Fleet]:
        """The instances the running jobs hold."""
        return [f for kind in JOB_KINDS for r in self._jobs[kind.noun].values()
                if r[kind.status_member] == "InProgress" for f in kind.fleet(r)]

    # ----- the operations, per kind ---------------------------------------------------------
    def create_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        def record(name: str, now: datetime) -> dict[str, Any]:
            hyperparameters = {**self.training_defaults, **(request.get("HyperParameters") or {})}
            return {**request, "HyperParameters": hyperparameters,
                    "TrainingJobName": name, "TrainingJobArn": self.account.arn("training-job", name),
                    "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting", "CreationTime": now,
                    "LastModifiedTime": now, "SecondaryStatusTransitions": [
                        {"Status": "Starting", "StartTime": now,
                         "StatusMessage": "Preparing the instances for training"}]}
        return self._create(TRAINING, request, record, self._train)

    def describe_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._describe(TRAINING, request)

    def stop_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._stop(TRAINING, request)

    def list_training_jobs(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            items = sorted(self._jobs[TRAINING.noun].values(), key=lambda r: r["CreationTime"], reverse=True)
            return {"TrainingJobSummaries": [
                {k: r.get(k) for k in ("TrainingJobName", "TrainingJobArn", "CreationTime", "TrainingEndTime",
                                       "LastModifiedTime", "TrainingJobStatus") if r.get(k) is not None}
                for r in items]}

    def create_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        def record(name: str, now: datetime) -> dict[str, Any]:
            return {**request, "ProcessingJobName": name,
                    "ProcessingJobArn": self.account.arn("processing-job", name), "ProcessingJobStatus": "InProgress",
                    "CreationTime": now, "LastModifiedTime": now}
        return self._create(PROCESSING, request, record, self._process)

    def describe_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._describe(PROCESSING, request)

    def stop_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._stop(PROCESSING, request)

    # ----- one job's lifecycle, whatever its kind --------------------------------------------
    def _create(self, kind: JobKind, request: dict[str, Any], new_record: Callable[[str, datetime], dict[str, Any]],
                work: Work) -> dict[str, Any]:
        name = request.get(kind.name_member)
        if not name or not isinstance(name, str):
            raise ApiError("ValidationException", f"{kind.name_member} is required")
        for required in kind.required:
            if required not in request:
                raise ApiError("ValidationException", f"{required} is required")
        with self._lock:
            jobs = self._jobs[kind.noun]
            if name in jobs:
                raise ApiError("ResourceInUse", kind.in_use.format(arn=self.account.arn(kind.arn_resource, name)))
            self.account.check_quotas(kind.fleet(request))
            record = new_record(name, utc_now())
            record.pop("Tags", None)
            jobs[name] = record
            self._stops[name] = threading.Event()
            self._save(kind, record)
        self.account.start(name, lambda: self._run(kind, name, work))
        return {kind.arn_member: record[kind.arn_member]}

    def _describe(self, kind: JobKind, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._known(kind, request.get(kind.name_member, "")))

    def _stop(self, kind: JobKind, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get(kind.name_member, "")
        with self._lock:
            record = self._known(kind, name)
            if record[kind.status_member] == "InProgress":
                record[kind.status_member] = "Stopping"
                self._stops[name].set()
        return {}

    def _known(self, kind: JobKind, name: str) -> dict[str, Any]:
        record = self._jobs[kind.noun].get(name)
        if record is None:
            raise ApiError("ValidationException", kind.not_found.format(name=name))
        return record

    def _run(self, kind: JobKind, name: str, work: Work) -> None:
        record = self._jobs[kind.noun][name]
        job_dir = self.job_dir(name)
        stop = self._stops[name]
        try:
            shutil.rmtree(job_dir, ignore_errors=True)
            produced = work(record, job_dir, stop)
            with self._lock:
                record.update(produced)
                self._end(kind, record, "Completed")
        except _Stopped:
            with self._lock:
                self._end(kind, record, "Stopped")
        except _JobFailed as exc:
            with self._lock:
                for member in kind.failure_members:
                    record[member] = str(exc)
                self._end(kind, record, "Failed", f": {exc}")
        except Exception as exc:
            log.exception("%s job %s crashed", kind.directory, name)
            with self._lock:
                record["FailureReason"] = f"InternalServerError: {exc!r}"
                self._end(kind, record, "Failed")
        finally:
            with self._lock:
                self._save(kind, record)

    def _transition(self, record: dict[str, Any], secondary: str, message: str) -> None:
        now = utc_now()
        transitions = record.setdefault("SecondaryStatusTransitions", [])
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = now
        transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})
        record["SecondaryStatus"] = secondary
        record["LastModifiedTime"] = now

    def _end(self, kind: JobKind, record: dict[str, Any], status: str, detail: str = "") -> None:
        """The job ended ``status``; ``detail`` follows the secondary status's message (": why it failed")."""
        now = utc_now()
        record[kind.status_member] = status
        if kind.secondary_label is not None:
            self._transition(record, status, f"{kind.secondary_label} {status.lower()}{detail}")
        record[kind.end_member] = now
        if kind.billed_from is not None and kind.billed_from in record:
            record["TrainingTimeInSeconds"] = int((now - record[kind.billed_from]).total_seconds())
            record["BillableTimeInSeconds"] = record["TrainingTimeInSeconds"]
        record["LastModifiedTime"] = now

    # ----- what each kind does ---------------------------------------------------------------
    def _train(self, record: dict[str, Any], job_dir: Path, stop: threading.Event) -> dict[str, Any]:
        name = record["TrainingJobName"]
        with self._lock:
            # As on AWS, billing (TrainingStartTime -> TrainingEndTime, hence TrainingTimeInSeconds and
            # BillableTimeInSeconds) starts when the instances are up, before the data download.
            record["TrainingStartTime"] = utc_now()
            self._transition(record, "Downloading", "Downloading input data")
            self._save(TRAINING, record)
        channels = {}
        for channel in record.get("InputDataConfig") or []:
            uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
            channels[channel["ChannelName"]] = self._download(uri, job_dir, "channels", channel["ChannelName"])
        with self._lock:
            self._transition(record, "Training", "Training image download completed. Training in progress.")
            self._save(TRAINING, record)
        definitions = (record.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        # As SageMaker does while the job runs: its metric values to CloudWatch (the status API's progress).
        publisher = None if self.cloudwatch is None else MetricPublisher(
            self.cloudwatch, name, self.job_log(name), definitions).start()
        try:
            outcome = self.backend.run_training(record, channels, job_dir, stop)
        finally:
            if publisher is not None:
                publisher.stop()
        lines = outcome.log_lines or []
        with self._lock:
            record["FinalMetricDataList"] = final_metrics(lines, definitions)
        if stop.is_set():
            raise _Stopped()
        if outcome.failure_reason is not None:
            raise _JobFailed(outcome.failure_reason)
        with self._lock:
            self._transition(record, "Uploading", "Uploading generated training model")
            self._save(TRAINING, record)
        output = record["OutputDataConfig"]["S3OutputPath"].rstrip("/") + f"/{name}/output"
        if outcome.model_tar is None:
            raise _JobFailed("the training job wrote nothing to its model directory")
        self._upload(outcome.model_tar, f"{output}/model.tar.gz")
        if outcome.output_tar is not None:
            self._upload(outcome.output_tar, f"{output}/output.tar.gz")
        return {"ModelArtifacts": {"S3ModelArtifacts": f"{output}/model.tar.gz"}}

    def _process(self, record: dict[str, Any], job_dir: Path, stop: threading.Event) -> dict[str, Any]:
        inputs = {}
        for item in record.get("ProcessingInputs") or []:
            uri = item["S3Input"]["S3Uri"]
            inputs[item["InputName"]] = self._download(uri, job_dir, "inputs", item["InputName"])
        with self._lock:
            record["ProcessingStartTime"] = utc_now()
            self._save(PROCESSING, record)
        outcome = self.backend.run_processing(record, inputs, job_dir, stop)
        if stop.is_set():
            raise _Stopped()
        if outcome.failure_reason is not None:
            raise _JobFailed(outcome.failure_reason)
        produced = outcome.processing_outputs or {}
        for output in (record.get("ProcessingOutputConfig") or {}).get("Outputs") or []:
            local = produced.get(output["OutputName"])
            if local is None:
                raise _JobFailed(f"the job produced no output {output['OutputName']!r}")
            target = output["S3Output"]["S3Uri"].rstrip("/")
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                self._upload(path, f"{target}/{path.relative_to(local).as_posix()}")
        return {}

    # ----- S3 transfer -----------------------------------------------------------------------
    def _download(self, uri: str, job_dir: Path, *parts: str) -> Path:
        """An S3 prefix (or one object) -> the job's directory ``job_dir/<parts>``, like SageMaker's File input mode."""
        target = job_dir.joinpath(*parts)
        # The parts are request members (a channel or input name): whatever they are, never outside the job.
        if not target.resolve().is_relative_to(job_dir.resolve()) or target.resolve() == job_dir.resolve():
            raise _JobFailed(f"ClientError: {'/'.join(parts)!r} is not a directory inside the job's directory")
        bucket, key = parse_s3_uri(uri)
        target.mkdir(parents=True, exist_ok=True)
        found = 0
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=key):
            for item in page.get("Contents", []):
                rel = item["Key"][len(key):].lstrip("/") if item["Key"] != key else Path(key).name
                if not rel or rel.endswith("/"):
                    continue
                dest = (target / rel).resolve()
                if not dest.is_relative_to(target.resolve()):
                    raise _JobFailed(f"s3://{bucket}/{item['Key']} would be written outside the job's input dir")
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, item["Key"], str(dest))
                found += 1
        if found == 0:
            raise _JobFailed(f"ClientError: Data download failed: no objects under {uri}")
        return target

    def _upload(self, path: Path, uri: str) -> None:
        bucket, key = parse_s3_uri(uri)
        self.s3.upload_file(str(path), bucket, key)

    def stop_all(self) -> None:
        """Ask every running job to stop (their processes must not outlive the runtime)."""
        for stop in self._stops.values():
            stop.set()


class _JobFailed(Exception):
    pass


class _Stopped(Exception):
    pass
