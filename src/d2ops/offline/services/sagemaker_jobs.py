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
from dataclasses import dataclass
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


class LocalJobs:
    """Training and processing jobs: their records, threads and files."""

    OPERATIONS = frozenset({"CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob", "ListTrainingJobs",
                            "CreateProcessingJob", "DescribeProcessingJob", "StopProcessingJob"})

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
        self._training: dict[str, dict[str, Any]] = {}
        self._processing: dict[str, dict[str, Any]] = {}
        self._stops: dict[str, threading.Event] = {}
        self._records = work_dir / "sagemaker"
        self._reload()
        account.holds(self.fleets)

    # ----- persistence ---------------------------------------------------------------------
    def _save(self, kind: str, record: dict[str, Any]) -> None:
        name = record["TrainingJobName"] if kind == "training" else record["ProcessingJobName"]
        write_json_atomic(self._records / kind / f"{name}.json", encode_datetimes(record))

    def _reload(self) -> None:
        for kind, table, key, status in (("training", self._training, "TrainingJobName", "TrainingJobStatus"),
                                         ("processing", self._processing, "ProcessingJobName",
                                          "ProcessingJobStatus")):
            for path in sorted((self._records / kind).glob("*.json")):
                try:
                    record = decode_datetimes(json.loads(path.read_text("utf-8")))
                except (OSError, ValueError):
                    path.replace(path.with_suffix(".corrupt"))
                    continue
                if record.get(status) not in TERMINAL_JOB_STATES:
                    # Its processes died with the runtime that ran it.
                    record[status] = "Stopped"
                    record["FailureReason"] = "the offline runtime stopped while the job was running"
                    record["EndTime"] = record.get("LastModifiedTime", utc_now())
                    self._save(kind, record)
                table[record[key]] = record

    def job_dir(self, name: str) -> Path:
        """Where a training or processing job runs: its channels, /opt/ml trees and :data:`JOB_LOG`."""
        return self.work_dir / "jobs" / name

    def job_log(self, name: str) -> Path:
        """The job's log lines as they come (every host's, ``[host] `` first), the job's CloudWatch log here."""
        return self.job_dir(name) / JOB_LOG

    # ----- quotas ----------------------------------------------------------------------------
    def fleets(self) -> list[Fleet]:
        """The instances the running jobs hold."""
        fleets = [f for r in self._training.values() if r["TrainingJobStatus"] == "InProgress"
                  for f in self._training_fleet(r)]
        fleets += [f for r in self._processing.values() if r["ProcessingJobStatus"] == "InProgress"
                   for f in self._processing_fleet(r)]
        return fleets

    @staticmethod
    def _training_fleet(request: dict[str, Any]) -> list[Fleet]:
        """(instance type, quota usage, instances) a training job holds while it runs."""
        usage: QuotaUsage = "spot training" if request.get("EnableManagedSpotTraining") else "training"
        resources = request.get("ResourceConfig") or {}
        groups = resources.get("InstanceGroups") or [resources]
        return [(str(g["InstanceType"]), usage, float(g.get("InstanceCount", 1))) for g in groups
                if g.get("InstanceType")]

    @staticmethod
    def _processing_fleet(request: dict[str, Any]) -> list[Fleet]:
        cluster = (request.get("ProcessingResources") or {}).get("ClusterConfig") or {}
        return [(str(cluster["InstanceType"]), "processing", float(cluster.get("InstanceCount", 1)))] \
            if cluster.get("InstanceType") else []
    # ----- training jobs ---------------------------------------------------------------------
    def create_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("TrainingJobName")
        if not name or not isinstance(name, str):
            raise ApiError("ValidationException", "TrainingJobName is required")
        for required in ("AlgorithmSpecification", "OutputDataConfig", "ResourceConfig", "RoleArn"):
            if required not in request:
                raise ApiError("ValidationException", f"{required} is required")
        with self._lock:
            if name in self._training:
                raise ApiError("ResourceInUse", f"Training job names must be unique within an AWS account and "
                                                f"region, and a training job with this name already exists "
                                                f"({self.account.arn('training-job', name)})")
            self.account.check_quotas(self._training_fleet(request))
            now = utc_now()
            hyperparameters = {**self.training_defaults, **(request.get("HyperParameters") or {})}
            record = {**request, "HyperParameters": hyperparameters,
                      "TrainingJobName": name, "TrainingJobArn": self.account.arn("training-job", name),
                      "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting", "CreationTime": now,
                      "LastModifiedTime": now, "SecondaryStatusTransitions": [
                          {"Status": "Starting", "StartTime": now,
                           "StatusMessage": "Preparing the instances for training"}]}
            record.pop("Tags", None)
            self._training[name] = record
            self._stops[name] = threading.Event()
            self._save("training", record)
        self.account.start(name, lambda: self._run_training(name))
        return {"TrainingJobArn": record["TrainingJobArn"]}

    def _transition(self, record: dict[str, Any], secondary: str, message: str) -> None:
        now = utc_now()
        transitions = record.setdefault("SecondaryStatusTransitions", [])
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = now
        transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})
        record["SecondaryStatus"] = secondary
        record["LastModifiedTime"] = now

    def _run_training(self, name: str) -> None:
        record = self._training[name]
        job_dir = self.job_dir(name)
        stop = self._stops[name]
        try:
            shutil.rmtree(job_dir, ignore_errors=True)
            with self._lock:
                # As on AWS, billing (TrainingStartTime -> TrainingEndTime, hence TrainingTimeInSeconds and
                # BillableTimeInSeconds) starts when the instances are up, before the data download.
                record["TrainingStartTime"] = utc_now()
                self._transition(record, "Downloading", "Downloading input data")
                self._save("training", record)
            channels = {}
            for channel in record.get("InputDataConfig") or []:
                uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
                channels[channel["ChannelName"]] = self._download(uri, job_dir, "channels", channel["ChannelName"])
            with self._lock:
                self._transition(record, "Training", "Training image download completed. Training in progress.")
                self._save("training", record)
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
                self._save("training", record)
            output = record["OutputDataConfig"]["S3OutputPath"].rstrip("/") + f"/{name}/output"
            if outcome.model_tar is None:
                raise _JobFailed("the training job wrote nothing to its model directory")
            self._upload(outcome.model_tar, f"{output}/model.tar.gz")
            if outcome.output_tar is not None:
                self._upload(outcome.output_tar, f"{output}/output.tar.gz")
            with self._lock:
                record["ModelArtifacts"] = {"S3ModelArtifacts": f"{output}/model.tar.gz"}
                self._finish(record, "TrainingJobStatus", "Completed", "Completed", "Training job completed")
        except _Stopped:
            with self._lock:
                self._finish(record, "TrainingJobStatus", "Stopped", "Stopped", "Training job stopped")
        except _JobFailed as exc:
            with self._lock:
                record["FailureReason"] = str(exc)
                self._finish(record, "TrainingJobStatus", "Failed", "Failed", f"Training job failed: {exc}")
        except Exception as exc:
            log.exception("training job %s crashed", name)
            with self._lock:
                record["FailureReason"] = f"InternalServerError: {exc!r}"
                self._finish(record, "TrainingJobStatus", "Failed", "Failed", "Training job failed")
        finally:
            with self._lock:
                self._save("training", record)

    def _finish(self, record: dict[str, Any], status_key: str, status: str, secondary: str | None,
                message: str) -> None:
        now = utc_now()
        record[status_key] = status
        if secondary is not None:
            self._transition(record, secondary, message)
            record["TrainingEndTime"] = now
            if "TrainingStartTime" in record:
                record["TrainingTimeInSeconds"] = int((now - record["TrainingStartTime"]).total_seconds())
                record["BillableTimeInSeconds"] = record["TrainingTimeInSeconds"]
        else:
            record["ProcessingEndTime"] = now
        record["LastModifiedTime"] = now

    def describe_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("TrainingJobName", "")
        with self._lock:
            record = self._training.get(name)
            if record is None:
                raise ApiError("ValidationException", f"Requested resource not found: training job {name!r}")
            return copy.deepcopy(record)

    def stop_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("TrainingJobName", "")
        with self._lock:
            record = self._training.get(name)
            if record is None:
                raise ApiError("ValidationException", f"Requested resource not found: training job {name!r}")
            if record["TrainingJobStatus"] == "InProgress":
                record["TrainingJobStatus"] = "Stopping"
                self._stops[name].set()
        return {}

    def list_training_jobs(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            items = sorted(self._training.values(), key=lambda r: r["CreationTime"], reverse=True)
            return {"TrainingJobSummaries": [
                {k: r.get(k) for k in ("TrainingJobName", "TrainingJobArn", "CreationTime", "TrainingEndTime",
                                       "LastModifiedTime", "TrainingJobStatus") if r.get(k) is not None}
                for r in items]}

    # ----- processing jobs -------------------------------------------------------------------
    def create_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("ProcessingJobName")
        if not name or not isinstance(name, str):
            raise ApiError("ValidationException", "ProcessingJobName is required")
        with self._lock:
            if name in self._processing:
                # SageMaker's answer, as a Step Functions execution's CreateProcessingJob failure quoted it.
                raise ApiError("ResourceInUse", f"Job name must be unique within an AWS account and region, and a "
                                                f"job with this name already exists "
                                                f"({self.account.arn('processing-job', name)})")
            self.account.check_quotas(self._processing_fleet(request))
            now = utc_now()
            record = {**request, "ProcessingJobName": name,
                      "ProcessingJobArn": self.account.arn("processing-job", name), "ProcessingJobStatus": "InProgress",
                      "CreationTime": now, "LastModifiedTime": now}
            record.pop("Tags", None)
            self._processing[name] = record
            self._stops[name] = threading.Event()
            self._save("processing", record)
        self.account.start(name, lambda: self._run_processing(name))
        return {"ProcessingJobArn": record["ProcessingJobArn"]}

    def _run_processing(self, name: str) -> None:
        record = self._processing[name]
        job_dir = self.job_dir(name)
        stop = self._stops[name]
        try:
            shutil.rmtree(job_dir, ignore_errors=True)
            inputs = {}
            for item in record.get("ProcessingInputs") or []:
                uri = item["S3Input"]["S3Uri"]
                inputs[item["InputName"]] = self._download(uri, job_dir, "inputs", item["InputName"])
            with self._lock:
                record["ProcessingStartTime"] = utc_now()
                self._save("processing", record)
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
            with self._lock:
                self._finish(record, "ProcessingJobStatus", "Completed", None, "")
        except _Stopped:
            with self._lock:
                self._finish(record, "ProcessingJobStatus", "Stopped", None, "")
        except _JobFailed as exc:
            with self._lock:
                record["FailureReason"] = str(exc)
                record["ExitMessage"] = str(exc)
                self._finish(record, "ProcessingJobStatus", "Failed", None, "")
        except Exception as exc:
            log.exception("processing job %s crashed", name)
            with self._lock:
                record["FailureReason"] = f"InternalServerError: {exc!r}"
                self._finish(record, "ProcessingJobStatus", "Failed", None, "")
        finally:
            with self._lock:
                self._save("processing", record)

    def describe_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("ProcessingJobName", "")
        with self._lock:
            record = self._processing.get(name)
            if record is None:
                raise ApiError("ValidationException", f"Could not find requested job with name {name}")
            return copy.deepcopy(record)

    def stop_processing_job(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("ProcessingJobName", "")
        with self._lock:
            record = self._processing.get(name)
            if record is None:
                raise ApiError("ValidationException", f"Could not find requested job with name {name}")
            if record["ProcessingJobStatus"] == "InProgress":
                record["ProcessingJobStatus"] = "Stopping"
                self._stops[name].set()
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
