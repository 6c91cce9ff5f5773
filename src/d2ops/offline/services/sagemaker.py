"""The SageMaker API offline (AWS JSON 1.1, ``X-Amz-Target: SageMaker.<Op>``).

The operations that do real work are served here: training and processing jobs, endpoints. Every
other operation (models, endpoint configs, the Model Registry) goes on to the moto server, which
keeps those control-plane records, with two of SageMaker's rules moto lacks: ``ClientToken``
idempotency (`IDEMPOTENT_OPERATIONS`) and unique names (`UNIQUE_NAMES`).

Jobs run in background threads that download their inputs from the local S3, hand them to a
`JobBackend` (local processes honouring the training-container contract), upload what the job
wrote where SageMaker would, and keep a DescribeTrainingJob / DescribeProcessingJob record
with real statuses, timings, FinalMetricDataList and FailureReason. Job records are persisted
under the work dir so the status API can describe them after a restart.

Endpoints follow the model the state machine references: endpoint config -> model ->
model package (all moto records) -> ModelDataUrl. CreateEndpoint starts a local TorchServe
(`ServingBackend`) and reports Creating -> InService (or Failed). UpdateEndpoint is blue/green:
the old server keeps serving while the new one starts (Updating); if the new one fails, the
endpoint stays on the old config, as SageMaker's automatic rollback leaves it. With a
DeploymentConfig the new fleet then bakes for WaitIntervalInSeconds (capped offline by
``max_bake_seconds``): a CANARY takes its CanarySize share of InvokeEndpoint requests (a
deterministic interleaving, so tests can count), ALL_AT_ONCE all of them, and
PendingDeploymentSummary reports the variant ``Baking``. An AutoRollbackConfiguration alarm
entering ALARM during the update sends every request back to the old server and stops the new
one (the endpoint is InService on the old config again); otherwise all traffic moves to the new
server and the old one stops.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from d2ops.offline.errors import ApiError
from d2ops.offline.job_metrics import MetricPublisher, MetricScraper
from d2ops.offline.quotas import AccountQuotas
from d2ops.offline.services.base import AwsJsonService, RuntimeParts, Upstream, WireRequest, WireResponse
from d2ops.offline.stack import ACCOUNT_ID, REGION
from d2ops.offline.store import write_json_atomic
from d2ops_core.platform import QuotaUsage
from d2ops_core.s3_layout import parse_s3_uri

log = logging.getLogger(__name__)

TERMINAL_JOB_STATES = ("Completed", "Failed", "Stopped")
ALARM_POLL_SECONDS = 0.5
# Offline: long enough for a poll, the smoke test (24 answers, a fraction of a second each on a
# CPU) and the alarm, short enough for `make demo`; SageMaker's own bake (WaitIntervalInSeconds)
# is 600 s. Should the bake end first, the state machine smoke-tests the endpoint in service
# and a failure updates it back instead.
DEFAULT_MAX_BAKE_SECONDS = 30.0
# (instance type, quota usage, instances): what a job or an endpoint holds against the account's quotas.
Fleet = tuple[str, QuotaUsage, float]
# A job's log (what CloudWatch Logs keeps under /aws/sagemaker/TrainingJobs), in the job's directory.
JOB_LOG = "job.log"
# SageMaker operations with an idempotency token (ClientToken) that moto does not honour.
IDEMPOTENT_OPERATIONS = frozenset({"CreateModelPackage"})
# Creates whose names SageMaker keeps unique (moto overwrites instead): name member, Describe operation, the
# ARN member it answers and the noun of SageMaker's "Cannot create already existing ..." message.
UNIQUE_NAMES = {"CreateModel": ("ModelName", "DescribeModel", "ModelArn", "model"),
                "CreateEndpointConfig": ("EndpointConfigName", "DescribeEndpointConfig", "EndpointConfigArn",
                                         "endpoint configuration")}


@dataclass
class _Canary:
    """An update in its bake: the new server and the share of requests it takes."""

    config: str
    server: ServedModel
    share: float
    sent: int = 0

    def takes_next(self) -> bool:
        """Request n goes to the new fleet when floor((n+1)*share) grows: exactly `share` of every prefix."""
        n = self.sent
        self.sent += 1
        return math.floor((n + 1) * self.share) > math.floor(n * self.share)


def traffic_share(routing: dict[str, Any], instance_count: int) -> float:
    """The new fleet's share of requests during the bake, from TrafficRoutingConfiguration."""
    kind = routing.get("Type")
    if kind == "ALL_AT_ONCE":
        return 1.0
    if kind != "CANARY":
        raise ApiError("ValidationException", f"TrafficRoutingConfiguration Type {kind!r} is not emulated offline "
                                              "(ALL_AT_ONCE and CANARY are)")
    size = routing.get("CanarySize") or {}
    value = size.get("Value")
    if not isinstance(value, int) or value < 1:
        raise ApiError("ValidationException", "TrafficRoutingConfiguration.CanarySize.Value must be an integer >= 1")
    if size.get("Type") not in ("CAPACITY_PERCENT", "INSTANCE_COUNT"):
        raise ApiError("ValidationException", f"CanarySize {size} must be INSTANCE_COUNT or CAPACITY_PERCENT")
    count = max(instance_count, 1)
    # A canary is whole instances of the new fleet, at least one: CanarySize "must be less than
    # or equal to 50% of the variant's total instance count" (SageMaker's TrafficRoutingConfig),
    # so a one-instance variant can have no canary at all. (Rounding a percentage down to whole
    # instances is the lenient reading; any reading refuses a canary on one instance.)
    percent = size.get("Type") == "CAPACITY_PERCENT"
    canary = max(1, count * value // 100) if percent else value
    if 2 * canary > count or (percent and value > 50):
        raise ApiError("ValidationException", f"TrafficRoutingConfiguration.CanarySize {size} is {canary} of the "
                                              f"variant's {count} instance(s): CanarySize must be less than or equal "
                                              f"to 50% of the variant's total instance count (at most 50%); use "
                                              f"ALL_AT_ONCE for a one-instance variant")
    return value / 100 if percent else canary / count


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


class ServedModel(Protocol):
    url: str  # http://127.0.0.1:<port> answering /ping and /invocations

    def stop(self) -> None: ...


class ServingBackend(Protocol):
    # ``environment``: the model's container Environment (CreateModel), set in the server's environment
    def start(self, model_tar: Path, work_dir: Path, name: str,
              environment: Mapping[str, str] | None = None) -> ServedModel: ...


def _now() -> datetime:
    return datetime.now(UTC)


def final_metrics(lines: list[str], definitions: list[dict[str, str]]) -> list[dict[str, Any]]:
    """FinalMetricDataList: the last value each of the job's MetricDefinitions regexes found in its logs."""
    scraper = MetricScraper(definitions)
    last: dict[str, float] = {}
    for line in lines:
        last.update(scraper.scrape(line))
    now = _now()
    return [{"MetricName": name, "Value": value, "Timestamp": now} for name, value in last.items()]


class LocalSageMaker(AwsJsonService):
    """Serves the OWNED operations; all others go on to moto (`forward`)."""

    CLIENT = "sagemaker"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_SAGEMAKER"
    TARGET_PREFIX = "SageMaker"
    JSON_VERSION = "1.1"
    OWNED = frozenset({"CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob", "ListTrainingJobs",
                       "CreateProcessingJob", "DescribeProcessingJob", "StopProcessingJob",
                       "CreateEndpoint", "UpdateEndpoint", "DescribeEndpoint", "DeleteEndpoint", "ListEndpoints",
                       "ListTags"})

    def __init__(self, work_dir: Path, s3: Any, registry: Any, jobs: JobBackend, serving: ServingBackend,
                 region: str, account_id: str, training_defaults: dict[str, str] | None = None,
                 cloudwatch: Any = None, max_bake_seconds: float = DEFAULT_MAX_BAKE_SECONDS,
                 quotas: AccountQuotas | None = None) -> None:
        self.work_dir = work_dir
        # The account's instance quotas: a create over one is refused with ResourceLimitExceeded.
        self.quotas = quotas if quotas is not None else AccountQuotas()
        self.cloudwatch = cloudwatch  # boto3 CloudWatch client: the auto-rollback alarms
        self.max_bake_seconds = max_bake_seconds
        # Hyperparameters a job gets when its request does not set them: a machine profile
        # (a CPU laptop trains at the data's resolution), recorded in the job's description.
        self.training_defaults = dict(training_defaults or {})
        self.s3 = s3  # boto3 S3 client (moto)
        self.registry = registry  # boto3 SageMaker client straight to moto (models, configs, packages)
        self.jobs = jobs
        self.serving = serving
        self.region = region
        self.account_id = account_id
        self._lock = threading.RLock()
        self._training: dict[str, dict[str, Any]] = {}
        self._processing: dict[str, dict[str, Any]] = {}
        self._stops: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._endpoints: dict[str, dict[str, Any]] = {}
        self._endpoint_tags: dict[str, list[dict[str, str]]] = {}  # endpoint ARN -> CreateEndpoint's Tags
        self._servers: dict[str, ServedModel] = {}  # endpoint name -> server taking traffic
        self._canaries: dict[str, _Canary] = {}  # endpoint name -> the new fleet during its bake
        self._served: dict[str, dict[str, int]] = {}  # endpoint name -> config -> requests answered
        self._server_configs: dict[str, str] = {}  # endpoint name -> config of self._servers[name]
        self._closing = threading.Event()
        self._records = work_dir / "sagemaker"
        self._idempotent: dict[tuple[str, str], tuple[bytes, bytes, str]] = {}
        self._idempotency_lock = threading.Lock()
        self._reload()

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> LocalSageMaker:
        return cls(parts.work_dir, parts.client("s3"), parts.moto_client("sagemaker"), parts.jobs_backend(),
                   parts.serving_backend(), REGION, ACCOUNT_ID, parts.training_defaults,
                   cloudwatch=parts.client("cloudwatch"), quotas=parts.quotas)

    # ----- persistence ---------------------------------------------------------------------
    def _save(self, kind: str, record: dict[str, Any]) -> None:
        name = record["TrainingJobName"] if kind == "training" else record["ProcessingJobName"]
        write_json_atomic(self._records / kind / f"{name}.json",
                          json.loads(json.dumps(record, default=lambda v: {"$datetime": v.isoformat()})))

    def _reload(self) -> None:
        def decode(value: Any) -> Any:
            if isinstance(value, dict):
                if set(value) == {"$datetime"}:
                    return datetime.fromisoformat(value["$datetime"])
                return {k: decode(v) for k, v in value.items()}
            if isinstance(value, list):
                return [decode(v) for v in value]
            return value

        for kind, table, key, status in (("training", self._training, "TrainingJobName", "TrainingJobStatus"),
                                         ("processing", self._processing, "ProcessingJobName",
                                          "ProcessingJobStatus")):
            for path in sorted((self._records / kind).glob("*.json")):
                try:
                    record = decode(json.loads(path.read_text("utf-8")))
                except (OSError, ValueError):
                    path.replace(path.with_suffix(".corrupt"))
                    continue
                if record.get(status) not in TERMINAL_JOB_STATES:
                    # Its processes died with the runtime that ran it.
                    record[status] = "Stopped"
                    record["FailureReason"] = "the offline runtime stopped while the job was running"
                    record["EndTime"] = record.get("LastModifiedTime", _now())
                    self._save(kind, record)
                table[record[key]] = record

    # ----- dispatch -------------------------------------------------------------------------
    def owns(self, operation: str, request: WireRequest) -> bool:
        return operation in self.OWNED

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        if operation not in self.OWNED:
            raise ApiError("UnknownOperationException", f"{operation} is not served locally")
        method = "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")
        result: dict[str, Any] = getattr(self, method)(request)
        return result

    def forward(self, operation: str, request: WireRequest, upstream: Upstream) -> WireResponse:
        if operation in IDEMPOTENT_OPERATIONS:
            return self._forward_idempotent(operation, request, upstream)
        if operation in UNIQUE_NAMES:
            return self._forward_unique(operation, request, upstream)
        return upstream.forward(request)

    def _forward_unique(self, operation: str, request: WireRequest, upstream: Upstream) -> WireResponse:
        """A name already in use is refused as SageMaker refuses it (a ValidationException naming the ARN)."""
        member, describe, arn_member, noun = UNIQUE_NAMES[operation]
        try:
            name = json.loads(request.body or b"{}").get(member)
        except (ValueError, AttributeError):
            name = None
        if isinstance(name, str):
            found = upstream.forward(request, target=f"SageMaker.{describe}", body=json.dumps({member: name}).encode())
            if found.status == 200:
                arn = json.loads(found.body).get(arn_member, name)
                message = f'Cannot create already existing {noun} "{arn}".'
                return WireResponse.json(400, {"__type": "ValidationException", "message": message},
                                         found.content_type)
        return upstream.forward(request)

    def _forward_idempotent(self, operation: str, request: WireRequest, upstream: Upstream) -> WireResponse:
        """SageMaker's idempotency token (moto ignores it): a repeated ``ClientToken`` with the same request
        answers the first call's response instead of creating again; with another request it is refused."""
        try:
            token = json.loads(request.body or b"{}").get("ClientToken")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            return upstream.forward(request)
        with self._idempotency_lock:
            seen = self._idempotent.get((operation, token))
            if seen is None:
                answer = upstream.forward(request)
                if answer.status == 200:
                    self._idempotent[(operation, token)] = (request.body, answer.body, answer.content_type)
                return answer
        first_body, data, content_type = seen
        if json.loads(first_body) != json.loads(request.body):
            return WireResponse.json(400, {"__type": "ValidationException", "message": (
                f"ClientToken {token} was already used for {operation} with different parameters")}, content_type)
        return WireResponse(200, data, content_type)

    def job_dir(self, name: str) -> Path:
        """Where a training or processing job runs: its channels, /opt/ml trees and :data:`JOB_LOG`."""
        return self.work_dir / "jobs" / name

    def job_log(self, name: str) -> Path:
        """The job's log lines as they come (every host's, ``[host] `` first), the job's CloudWatch log here."""
        return self.job_dir(name) / JOB_LOG

    def _arn(self, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:{kind}/{name.lower()}"

    def _start(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"sagemaker-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    # ----- quotas ----------------------------------------------------------------------------
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

    def _endpoint_fleet(self, config_name: str) -> list[Fleet]:
        variants = self.registry.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]
        return [(str(v["InstanceType"]), "endpoint", float(v.get("InitialInstanceCount", 1))) for v in variants
                if v.get("InstanceType")]  # serverless variants hold no instances

    def _in_use(self) -> list[Fleet]:
        """Every instance the account holds now: running jobs, endpoints (both fleets during an update)."""
        fleets = [f for r in self._training.values() if r["TrainingJobStatus"] == "InProgress"
                  for f in self._training_fleet(r)]
        fleets += [f for r in self._processing.values() if r["ProcessingJobStatus"] == "InProgress"
                   for f in self._processing_fleet(r)]
        for endpoint in self._endpoints.values():
            if endpoint["EndpointStatus"] == "Failed":
                continue
            fleets += self._endpoint_fleet(endpoint["EndpointConfigName"])
            pending = endpoint.get("PendingDeploymentSummary")
            if endpoint["EndpointStatus"] == "Updating" and pending:
                fleets += self._endpoint_fleet(pending["EndpointConfigName"])
        return fleets

    def _check_quotas(self, wanted: list[Fleet]) -> None:
        """Refuse (ResourceLimitExceeded) a request whose instances would exceed a quota. Call under the lock."""
        in_use = self._in_use()
        for instance_type in sorted({t for t, _, _ in wanted}):
            for usage in sorted({u for t, u, _ in wanted if t == instance_type}):
                requested = sum(n for t, u, n in wanted if (t, u) == (instance_type, usage))
                used = sum(n for t, u, n in in_use if (t, u) == (instance_type, usage))
                self.quotas.check(instance_type, usage, requested, used)

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
                                                f"({self._arn('training-job', name)})")
            self._check_quotas(self._training_fleet(request))
            now = _now()
            hyperparameters = {**self.training_defaults, **(request.get("HyperParameters") or {})}
            record = {**request, "HyperParameters": hyperparameters,
                      "TrainingJobName": name, "TrainingJobArn": self._arn("training-job", name),
                      "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting", "CreationTime": now,
                      "LastModifiedTime": now, "SecondaryStatusTransitions": [
                          {"Status": "Starting", "StartTime": now,
                           "StatusMessage": "Preparing the instances for training"}]}
            record.pop("Tags", None)
            self._training[name] = record
            self._stops[name] = threading.Event()
            self._save("training", record)
        self._start(name, lambda: self._run_training(name))
        return {"TrainingJobArn": record["TrainingJobArn"]}

    def _transition(self, record: dict[str, Any], secondary: str, message: str) -> None:
        now = _now()
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
                record["TrainingStartTime"] = _now()
                self._transition(record, "Downloading", "Downloading input data")
                self._save("training", record)
            channels = {}
            for channel in record.get("InputDataConfig") or []:
                uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
                channels[channel["ChannelName"]] = self._download(uri, job_dir / "channels" / channel["ChannelName"])
            with self._lock:
                self._transition(record, "Training", "Training image download completed. Training in progress.")
                self._save("training", record)
            definitions = (record.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
            # As SageMaker does while the job runs: its metric values to CloudWatch (the status API's progress).
            publisher = None if self.cloudwatch is None else MetricPublisher(
                self.cloudwatch, name, self.job_log(name), definitions).start()
            try:
                outcome = self.jobs.run_training(record, channels, job_dir, stop)
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
        now = _now()
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
                                                f"({self._arn('processing-job', name)})")
            self._check_quotas(self._processing_fleet(request))
            now = _now()
            record = {**request, "ProcessingJobName": name, "ProcessingJobArn": self._arn("processing-job", name),
                      "ProcessingJobStatus": "InProgress", "CreationTime": now, "LastModifiedTime": now}
            record.pop("Tags", None)
            self._processing[name] = record
            self._stops[name] = threading.Event()
            self._save("processing", record)
        self._start(name, lambda: self._run_processing(name))
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
                inputs[item["InputName"]] = self._download(uri, job_dir / "inputs" / item["InputName"])
            with self._lock:
                record["ProcessingStartTime"] = _now()
                self._save("processing", record)
            outcome = self.jobs.run_processing(record, inputs, job_dir, stop)
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
    def _download(self, uri: str, target: Path) -> Path:
        """An S3 prefix (or one object) -> a local directory, like SageMaker's File input mode."""
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

    # ----- endpoints -------------------------------------------------------------------------
    def _model_data(self, config_name: str) -> str:
        """Endpoint config -> model -> (model package) -> ModelDataUrl, from the moto records."""
        try:
            config = self.registry.describe_endpoint_config(EndpointConfigName=config_name)
        except self.registry.exceptions.ClientError as exc:
            raise ApiError("ValidationException", f"Could not find endpoint configuration {config_name}") from exc
        variant = config["ProductionVariants"][0]
        model = self.registry.describe_model(ModelName=variant["ModelName"])
        container = model.get("PrimaryContainer") or (model.get("Containers") or [{}])[0]
        if container.get("ModelDataUrl"):
            return str(container["ModelDataUrl"])
        package = container.get("ModelPackageName")
        if not package:
            raise ApiError("ValidationException", f"model {variant['ModelName']} has neither ModelDataUrl nor "
                                                  "ModelPackageName")
        described = self.registry.describe_model_package(ModelPackageName=package)
        return str(described["InferenceSpecification"]["Containers"][0]["ModelDataUrl"])

    def _container_environment(self, config_name: str) -> dict[str, str]:
        """The environment SageMaker gives the endpoint's container: the model's PrimaryContainer Environment."""
        variant = self.registry.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"][0]
        model = self.registry.describe_model(ModelName=variant["ModelName"])
        container = model.get("PrimaryContainer") or (model.get("Containers") or [{}])[0]
        return {str(k): str(v) for k, v in (container.get("Environment") or {}).items()}

    def _serve(self, name: str, config_name: str) -> ServedModel:
        model_uri = self._model_data(config_name)
        serve_dir = self.work_dir / "endpoints" / name / config_name
        shutil.rmtree(serve_dir, ignore_errors=True)
        serve_dir.mkdir(parents=True)
        bucket, key = parse_s3_uri(model_uri)
        tar_path = serve_dir / "model.tar.gz"
        self.s3.download_file(bucket, key, str(tar_path))
        return self.serving.start(tar_path, serve_dir, name, environment=self._container_environment(config_name))

    def create_endpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        name, config = request.get("EndpointName", ""), request.get("EndpointConfigName", "")
        with self._lock:
            if name in self._endpoints:
                raise ApiError("ValidationException", f"Cannot create already existing endpoint "
                                                      f"\"{self._arn('endpoint', name)}\".")
            self._model_data(config)  # a missing config fails the call, not the endpoint
            self._check_quotas(self._endpoint_fleet(config))
            now = _now()
            endpoint = {"EndpointName": name, "EndpointArn": self._arn("endpoint", name),
                        "EndpointConfigName": config, "EndpointStatus": "Creating", "CreationTime": now,
                        "LastModifiedTime": now}
            self._endpoints[name] = endpoint
            self._endpoint_tags[endpoint["EndpointArn"]] = list(request.get("Tags") or [])

        def bring_up() -> None:
            try:
                server = self._serve(name, config)
            except Exception as exc:
                log.warning("endpoint %s failed to start: %s", name, exc)
                with self._lock:
                    endpoint.update(EndpointStatus="Failed", FailureReason=str(exc)[:1024], LastModifiedTime=_now())
                return
            with self._lock:
                if self._endpoints.get(name) is not endpoint:  # deleted meanwhile
                    server.stop()
                    return
                self._servers[name] = server
                self._server_configs[name] = config
                endpoint.update(EndpointStatus="InService", LastModifiedTime=_now())

        self._start(f"endpoint-{name}", bring_up)
        return {"EndpointArn": endpoint["EndpointArn"]}

    def update_endpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        name, config = request.get("EndpointName", ""), request.get("EndpointConfigName", "")
        deployment = request.get("DeploymentConfig") or {}
        policy = deployment.get("BlueGreenUpdatePolicy") or {}
        # Without a DeploymentConfig SageMaker shifts all traffic at once, with no bake.
        routing = policy.get("TrafficRoutingConfiguration") or {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}
        alarms = [str(a.get("AlarmName")) for a in (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms")
                  or []]
        with self._lock:
            endpoint = self._endpoints.get(name)
            if endpoint is None:
                raise ApiError("ValidationException", f"Could not find endpoint \"{self._arn('endpoint', name)}\".")
            if endpoint["EndpointStatus"] != "InService":
                raise ApiError("ValidationException", f"Cannot update in-progress endpoint "
                                                      f"\"{endpoint['EndpointArn']}\".")
            self._model_data(config)
            # Blue/green: the new fleet comes up while the old one still serves, so both count.
            self._check_quotas(self._endpoint_fleet(config))
            variant = self.registry.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]
            share = traffic_share(routing, int(variant.get("InitialInstanceCount", 1)))
            bake = min(float(routing.get("WaitIntervalInSeconds") or 0), self.max_bake_seconds)
            now = _now()
            endpoint.update(EndpointStatus="Updating", LastModifiedTime=now)
            endpoint.pop("FailureReason", None)
            endpoint["PendingDeploymentSummary"] = {
                "EndpointConfigName": config, "StartTime": now,
                "ProductionVariants": [{"VariantName": variant["VariantName"], "VariantStatus": [
                    {"Status": "Creating", "StatusMessage": "Launching the new fleet", "StartTime": now}]}]}

        def stage(status: str, message: str) -> None:
            with self._lock:
                pending = endpoint.get("PendingDeploymentSummary")
                if pending is not None:
                    pending["ProductionVariants"][0]["VariantStatus"] = [
                        {"Status": status, "StatusMessage": message, "StartTime": _now()}]

        def finish(**fields: Any) -> None:
            with self._lock:
                endpoint.pop("PendingDeploymentSummary", None)
                endpoint.update(EndpointStatus="InService", LastModifiedTime=_now(), **fields)

        def blue_green() -> None:
            started = _now()
            try:
                green = self._serve(name, config)
            except Exception as exc:
                log.warning("endpoint %s update failed, staying on the old config: %s", name, exc)
                finish(FailureReason=str(exc)[:1024])  # blue keeps serving: the update rolled back
                return
            if bake > 0 or alarms:
                with self._lock:
                    self._canaries[name] = _Canary(config, green, share)
                stage("Baking", f"{share:.0%} of the traffic on the new fleet for {bake:.0f} s")
                tripped = self._watch_alarms(alarms, started, bake)
                if tripped is not None or self._closing.is_set():
                    with self._lock:
                        self._canaries.pop(name, None)
                    green.stop()
                    reason = f"alarm {tripped} is in ALARM: rolled back to the previous endpoint config"
                    log.warning("endpoint %s update %s", name, reason)
                    finish(FailureReason=reason)
                    return
            stage("ActivatingTraffic", "Shifting all traffic to the new fleet")
            with self._lock:
                self._canaries.pop(name, None)
                blue = self._servers.get(name)
                self._servers[name] = green  # the traffic switch
                self._server_configs[name] = config
            # The old fleet is gone before the endpoint reads InService again (as SageMaker's update
            # ends): a caller that sees InService never finds the old server still answering.
            if blue is not None:
                blue.stop()
            finish(EndpointConfigName=config)

        self._start(f"endpoint-{name}-update", blue_green)
        return {"EndpointArn": endpoint["EndpointArn"]}

    def _watch_alarms(self, alarms: list[str], since: datetime, seconds: float) -> str | None:
        """The first alarm in ALARM during the bake, or None once it has passed.

        moto does not evaluate alarms, so an alarm offline changes state only by SetAlarmState; a
        state set before this update stands for one CloudWatch would since have evaluated back
        (the metric had no new data), so only states set during the update count.
        """
        deadline = time.monotonic() + seconds
        while not self._closing.is_set():
            if alarms and self.cloudwatch is not None:
                for alarm in self.cloudwatch.describe_alarms(AlarmNames=alarms).get("MetricAlarms", []):
                    if alarm.get("StateValue") == "ALARM" and alarm["StateUpdatedTimestamp"] >= since:
                        return str(alarm["AlarmName"])
            if time.monotonic() >= deadline:
                return None
            time.sleep(ALARM_POLL_SECONDS)
        return None

    def describe_endpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("EndpointName", "")
        with self._lock:
            endpoint = self._endpoints.get(name)
            if endpoint is None:
                raise ApiError("ValidationException", f"Could not find endpoint \"{self._arn('endpoint', name)}\".")
            result = copy.deepcopy(endpoint)
        if result["EndpointStatus"] in ("InService", "Updating"):
            result["ProductionVariants"] = [{"VariantName": "AllTraffic", "CurrentInstanceCount": 1,
                                             "DesiredInstanceCount": 1}]
        return result

    def delete_endpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("EndpointName", "")
        with self._lock:
            if self._endpoints.pop(name, None) is None:
                raise ApiError("ValidationException", f"Could not find endpoint \"{self._arn('endpoint', name)}\".")
            self._endpoint_tags.pop(self._arn("endpoint", name), None)
            server = self._servers.pop(name, None)
            canary = self._canaries.pop(name, None)
            self._server_configs.pop(name, None)
        for running in (server, canary.server if canary else None):
            if running is not None:
                running.stop()
        return {}

    def list_tags(self, request: dict[str, Any]) -> dict[str, Any]:
        """An endpoint's tags (``d2ops doctor`` reads the run that deployed it); any other resource's are moto's."""
        arn = str(request.get("ResourceArn", ""))
        with self._lock:
            tags = self._endpoint_tags.get(arn)
        if tags is not None:
            return {"Tags": tags}
        try:
            answer: dict[str, Any] = self.registry.list_tags(**request)
        except self.registry.exceptions.ClientError as exc:
            error = exc.response.get("Error") or {}
            raise ApiError(str(error.get("Code") or "ValidationException"), str(error.get("Message") or exc),
                           int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 400)) from exc
        answer.pop("ResponseMetadata", None)
        return answer

    def list_endpoints(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return {"Endpoints": [{k: e[k] for k in ("EndpointName", "EndpointArn", "CreationTime",
                                                     "LastModifiedTime", "EndpointStatus")}
                                  for e in self._endpoints.values()]}

    # ----- SageMaker Runtime -------------------------------------------------------------------
    def invoke(self, endpoint_name: str, body: bytes, content_type: str | None,
               accept: str | None, custom_attributes: str | None = None) -> tuple[int, bytes, str]:
        import urllib.error
        import urllib.request

        with self._lock:
            server = self._servers.get(endpoint_name)
            config = self._server_configs.get(endpoint_name, "")
            canary = self._canaries.get(endpoint_name)
            if server is not None and canary is not None and canary.takes_next():
                server, config = canary.server, canary.config
            if server is not None:
                served = self._served.setdefault(endpoint_name, {})
                served[config] = served.get(config, 0) + 1
        if server is None:
            raise ApiError("ValidationError", f"Endpoint {endpoint_name} of account {self.account_id} not found.")
        headers = {"Content-Type": content_type or "application/octet-stream"}
        if accept:
            headers["Accept"] = accept
        if custom_attributes:
            headers["X-Amzn-SageMaker-Custom-Attributes"] = custom_attributes
        request = urllib.request.Request(f"{server.url}/invocations", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read(), response.headers.get("Content-Type") or "application/json"
        except urllib.error.HTTPError as err:
            return err.code, err.read(), err.headers.get("Content-Type") or "application/json"
        except OSError as exc:
            raise ApiError("ServiceUnavailable", f"endpoint {endpoint_name} did not answer: {exc}", 503) from exc

    def served(self, endpoint_name: str) -> dict[str, int]:
        """Requests each endpoint config's server has been sent (the canary split, observable)."""
        with self._lock:
            return dict(self._served.get(endpoint_name, {}))

    def endpoint_url(self, endpoint_name: str) -> str | None:
        with self._lock:
            server = self._servers.get(endpoint_name)
        return server.url if server else None

    # ----- shutdown ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop running jobs and every endpoint server (their processes must not outlive us)."""
        self._closing.set()  # a bake in progress ends (and stops its new server)
        for stop in self._stops.values():
            stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        with self._lock:
            servers = [*self._servers.values(), *(c.server for c in self._canaries.values())]
            self._servers.clear()
            self._canaries.clear()
            for endpoint in self._endpoints.values():
                endpoint["EndpointStatus"] = "OutOfService"
        for server in servers:
            server.stop()


class _JobFailed(Exception):
    pass


class _Stopped(Exception):
    pass
