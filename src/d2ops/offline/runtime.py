"""The offline runtime: the deployed stack's moving parts, on loopback, in one process.

    with OfflineRuntime(work_dir=Path(".d2ops")) as rt:
        key, version = rt.upload_dataset(Path("my-dataset"))       # manifest.json last
        rt.deliver_upload_event(rt.stack.data_bucket, key)         # the S3 -> EventBridge trigger
        ...                                                        # boto3 works as against AWS

Starting it: takes the work dir's lock, ends processes an interrupted runtime left behind,
starts moto's server (S3, SNS, SQS, the SageMaker control-plane records) and the local
gateway (Step Functions, SageMaker jobs and endpoints, SageMaker Runtime, SageMaker's Service
Quotas), points boto3 at them through the standard ``AWS_ENDPOINT_URL_*`` variables with
credentials made for this runtime alone (moto's server, the gateway and the status API answer only
requests signed with them, `d2ops.offline.caller_check`; other commands read them from ``runtime.json``), creates
the stack's buckets (with their event notifications), topic and model package group from
template.yaml and its images' tags in ECR, restores the S3
snapshot of the last run, reloads execution and job records, and serves the status API.
Stopping it reverses all of that and saves an S3 snapshot for the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.credentials import Credentials

from d2ops.offline import events, moto_fidelity
from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.caller_check import CallerCheck, MotoCallerCheck, pipeline_entrypoints
from d2ops.offline.eventbridge import EventBridgeRules
from d2ops.offline.lambdas import LocalLambdas
from d2ops.offline.processes import ProcessWarden
from d2ops.offline.quotas import AccountQuotas
from d2ops.offline.services import SERVICES, LocalSageMaker, LocalStepFunctions
from d2ops.offline.services.base import EmulatedService
from d2ops.offline.services.sagemaker_endpoints import ServingBackend
from d2ops.offline.services.sagemaker_jobs import JobBackend
from d2ops.offline.stack import ACCOUNT_ID, REGION, OfflineStack, load_stack
from d2ops.offline.status_api_server import HttpApi, reviewer_session
from d2ops.offline.store import write_json_atomic
from d2ops_core import s3_layout

log = logging.getLogger(__name__)

S = TypeVar("S", bound=EmulatedService)
DEFAULT_WORK_DIR = Path(".d2ops")
# Where a running runtime listens and its credentials (for `d2ops status` and the other commands); mode 0600.
RUNTIME_INFO = "runtime.json"
_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# offline_credentials() while no runtime runs in this process: no runtime accepts it.
_NO_RUNTIME = Credentials("offline", "offline", "offline")
_IN_PROCESS: list[Credentials] = []  # the credentials of the runtimes started in this process, latest last

_CLIENT_CONFIG = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=120)


def new_credentials() -> Credentials:
    """Fresh random credentials, shaped like AWS's (a 20-character key id, a 40-character secret)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return Credentials("ASIA" + "".join(secrets.choice(alphabet) for _ in range(16)), secrets.token_urlsafe(30),
                       secrets.token_urlsafe(32))


def credentials_environment(credentials: Credentials) -> dict[str, str]:
    """``credentials`` as the AWS_* variables boto3 reads."""
    return dict(zip(_CREDENTIAL_VARIABLES, (credentials.access_key, credentials.secret_key, credentials.token or ""),
                    strict=True))


def offline_credentials() -> Credentials:
    """The identity of the runtime running in this process (the one its APIs accept); a placeholder when none runs.

    Another process's runtime: `d2ops.offline.client.running_runtime` reads its credentials from ``runtime.json``.
    """
    return _IN_PROCESS[-1] if _IN_PROCESS else _NO_RUNTIME


_ALARM_KEYS = frozenset({"AlarmDescription", "Namespace", "MetricName", "Dimensions", "Statistic", "ExtendedStatistic",
                         "Period", "EvaluationPeriods", "DatapointsToAlarm", "Threshold", "ComparisonOperator",
                         "TreatMissingData", "Metrics", "AlarmActions"})


class OfflineRuntime:
    def __init__(self, work_dir: Path = DEFAULT_WORK_DIR, *, parameters: dict[str, str] | None = None,
                 jobs: JobBackend | None = None, serving: ServingBackend | None = None,
                 fresh: bool = False, training_defaults: dict[str, str] | None = None,
                 function_env: dict[str, dict[str, str]] | None = None,
                 lost_responses: dict[str, int] | None = None, quotas: Mapping[str, float] | None = None,
                 throttles: dict[str, int] | None = None) -> None:
        self.work_dir = work_dir.resolve()
        self.stack: OfflineStack = load_stack(parameters=parameters, function_env=function_env)
        self.fresh = fresh
        self._jobs = jobs
        self._serving = serving
        self.training_defaults = dict(training_defaults or {})
        self.lost_responses = dict(lost_responses or {})  # injected faults (ServiceExecutors)
        self.throttles = dict(throttles or {})  # injected ThrottlingExceptions (ServiceExecutors)
        # The offline account's SageMaker quotas by Service Quotas name (d2ops.offline.quotas), over its defaults.
        self.quotas = AccountQuotas(quotas)
        self.messages: list[str] = []  # what start-up found and did (interrupted runs, leftovers)
        self._saved_env: dict[str, str | None] = {}
        self._started = False
        self._sequencer = 0
        self._seq_lock = threading.Lock()
        # One boto3 session for the runtime's clients: a fresh Session re-reads and re-parses the service's
        # JSON model, 0.1-0.2 CPU-s a client (about 3 CPU-s of every start-up). Sessions are not
        # thread-safe (clients are), hence the lock.
        self._session: Any = None
        self._session_lock = threading.Lock()
        self._services: list[EmulatedService] = []  # built by service()

    # ----- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> OfflineRuntime:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
        moto_fidelity.apply()
        self.warden = ProcessWarden(self.work_dir)
        self.warden.acquire()
        atexit.register(self.stop)  # an exit that skips the caller's cleanup still ends TorchServe and jobs
        try:
            self.messages += self.warden.reap_leftovers()
            if self.fresh:
                for name in ("executions", "sagemaker", "jobs", "endpoints", "s3"):
                    shutil.rmtree(self.work_dir / name, ignore_errors=True)
            self.credentials = new_credentials()
            _IN_PROCESS.append(self.credentials)
            # What the gateway adds to the requests it forwards to moto (verified there by CallerCheck); never
            # leaves this process.
            forward_secret = secrets.token_urlsafe(32)
            # moto's server is no emulated service: it is what they leave requests to (their Upstream, through the
            # gateway) and boto3's endpoint for every other service (AWS_ENDPOINT_URL), so it starts first.
            self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self.moto.start()
            host, port = self.moto.get_host_and_port()
            # moto's app, behind our own Host/Origin/signature check (the served app is the server's attribute;
            # no fork)
            served = self.moto._server
            assert served is not None  # started above
            served.app = MotoCallerCheck(served.app, port, credentials=self.credentials, region=REGION,
                                         forward_secret=forward_secret)
            self.moto_url = f"http://{host}:{port}"
            self.gateway = AwsEndpoint(self.moto_url, forward_secret=forward_secret)
            env = {**credentials_environment(self.credentials), "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                   # Everything moto serves goes straight to it; the gateway takes the services emulated here.
                   "AWS_ENDPOINT_URL": self.moto_url,
                   **{service.ENDPOINT_VARIABLE: self.gateway.url for service in SERVICES},
                   "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "false",
                   **self.stack.lambda_environment()}
            self._set_env(env)
            # boto3's default session (the handlers' boto3.client) keeps the credentials it first read:
            # a fresh one reads this runtime's.
            boto3.setup_default_session()
            self._started = True
            self._create_resources()
            self.messages += self._restore_s3()
            (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
            self._lambda_log = open(self.work_dir / "logs" / "lambda.log", "a", encoding="utf-8")  # noqa: SIM115
            # Lambda is no emulated service: no boto3 call reaches it (the gateway serves no Invoke). It is a
            # part the services read (Step Functions' task integrations) and the status API calls, in-process.
            self.lambdas = LocalLambdas(self.stack.functions, self._lambda_log)
            # Each service builds itself from the runtime's parts (its records reloaded): SageMaker's jobs first, then
            # Step Functions (the stack's state machine, the executions an interrupted runtime left, marked
            # ABORTED), then the rest in table order (below).
            self.sagemaker = self.service(LocalSageMaker)
            self.sfn = self.service(LocalStepFunctions)
            self.machine = self.sfn.machines[self.stack.state_machine_arn]
            # EventBridge is no emulated service either (it serves no API here): its rules are delivered by
            # d2ops.offline.eventbridge, the status change as Step Functions reports it, the upload trigger
            # through deliver_event.
            self.eventbridge = EventBridgeRules(self.stack, self.lambdas, self.sfn)
            self.sfn.add_listener(self.eventbridge.status_changed)
            self.messages += self.sfn.recovery_messages
            for kind in SERVICES:
                self.gateway.add(self.service(kind))
            self.gateway.check = CallerCheck(
                credentials=self.credentials, port=self.gateway.server.server_address[1], region=REGION,
                clients=[kind.CLIENT for kind in SERVICES],
                entrypoints=pipeline_entrypoints(self.machine.definition, self.stack.functions)).check
            self.gateway.start()
            # The status API is no emulated service either: API Gateway's HTTP API has a port of its own (a URL
            # per API, not an AWS_ENDPOINT_URL_* variable), IAM auth as the stack's callers and the template's
            # routes to Lambdas. The runtime's one identity is the developer's: it signs as a session of the
            # stack's reviewer role.
            self.status_api = HttpApi([r for r in self.stack.routes], lambda fn, event: self.lambdas.invoke(fn, event),
                                      ACCOUNT_ID, credentials={self.credentials.access_key: self.credentials},
                                      region=REGION, callers={self.credentials.access_key: reviewer_session(
                                          self.stack, self.credentials.access_key)})
            self.status_api.start()
            self.warden.start_watching()
            # Written through a mkstemp file (mode 0600): only this user reads the credentials in it.
            write_json_atomic(self.work_dir / RUNTIME_INFO, {"pid": os.getpid(), "status_api": self.status_api.url,
                                                             "gateway": self.gateway.url, "moto": self.moto_url,
                                                             "parameters": self.stack.parameters,
                                                             "credentials": credentials_environment(self.credentials)})
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop executions, jobs and endpoints, save the S3 snapshot, release everything. Idempotent."""
        if getattr(self, "_stopping", False):
            return
        self._stopping = True
        atexit.unregister(self.stop)
        # The emulated services first, in table order (executions end before the jobs they started).
        steps: list[tuple[str, Any]] = [
            (service.CLIENT, service.shutdown) for kind in SERVICES for service in self._services
            if isinstance(service, kind) and hasattr(service, "shutdown")]
        steps += [
            ("status api", lambda: self.status_api.stop()),
            ("gateway", lambda: self.gateway.stop()),
            ("s3 snapshot", self._save_s3),
            ("moto", lambda: self.moto.stop()),
        ]
        for what, step in steps:
            try:
                step()
            except AttributeError:
                continue  # never started
            except Exception:
                log.exception("stopping the offline runtime: %s failed", what)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        with contextlib.suppress(AttributeError, ValueError):
            _IN_PROCESS.remove(self.credentials)
            boto3.setup_default_session()  # the environment's credentials again, not this runtime's
        with self._session_lock:
            self._session = None  # its credentials and endpoints were this run's
        with contextlib.suppress(AttributeError):
            self.lambdas.restore_logs()
            self._lambda_log.close()
        (self.work_dir / RUNTIME_INFO).unlink(missing_ok=True)
        with contextlib.suppress(AttributeError):
            self.warden.release()

    # ----- the emulated services (d2ops.offline.services) ---------------------------------------
    def service(self, kind: type[S]) -> S:
        """This runtime's instance of an emulated service, built on first use (one may use another)."""
        for built in self._services:
            if isinstance(built, kind):
                return built
        made = kind.from_runtime(self)
        assert isinstance(made, kind)
        self._services.append(made)
        return made

    def jobs_backend(self) -> JobBackend:
        return self._jobs or _default_jobs()

    def serving_backend(self) -> ServingBackend:
        return self._serving or _default_serving()

    # ----- AWS clients --------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        """A boto3 client configured exactly as the handlers' are (by the environment)."""
        return self._new_client(service)

    def moto_client(self, service: str) -> Any:
        """A boto3 client straight to moto's server."""
        return self._new_client(service, endpoint_url=self.moto_url)

    def _new_client(self, service: str, **options: Any) -> Any:
        with self._session_lock:
            if self._session is None:  # made once the environment points at this runtime (start)
                self._session = boto3.session.Session()
            return self._session.client(service, region_name=REGION, config=_CLIENT_CONFIG, **options)

    def _create_resources(self) -> None:
        s3 = self.client("s3")
        for bucket in self.stack.buckets:
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        for bucket, notifications in self.stack.bucket_notifications.items():
            s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=notifications)
        self.client("sns").create_topic(Name=self.stack.topic_name)
        # The images the stack parameters name, as `make images` pushes them (a manifest without layers:
        # offline, local processes stand in for the containers). `d2ops doctor` finds them there.
        ecr = self.client("ecr")
        for repository, tag in self.stack.images():
            with contextlib.suppress(ecr.exceptions.RepositoryAlreadyExistsException):
                ecr.create_repository(repositoryName=repository)
            with contextlib.suppress(ecr.exceptions.ImageAlreadyExistsException):
                ecr.put_image(repositoryName=repository, imageTag=tag, imageManifest=json.dumps(
                    {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                     "config": {}, "layers": []}))
        dynamodb = self.client("dynamodb")
        for name, props in self.stack.tables.items():
            try:
                dynamodb.create_table(TableName=name, KeySchema=props["KeySchema"],
                                      AttributeDefinitions=props["AttributeDefinitions"], BillingMode="PAY_PER_REQUEST")
            except dynamodb.exceptions.ResourceInUseException:
                # moto keeps its state per process: an earlier runtime in this process (tests) made it. Its
                # items are that runtime's leases, whose executions are gone: start with none.
                for item in dynamodb.scan(TableName=name).get("Items", []):
                    dynamodb.delete_item(TableName=name, Key={k["AttributeName"]: item[k["AttributeName"]]
                                                              for k in props["KeySchema"]})
        self.moto_client("sagemaker").create_model_package_group(ModelPackageGroupName=self.stack.model_package_group)
        cloudwatch = self.client("cloudwatch")
        for name, props in self.stack.alarms.items():
            # Only what PutMetricAlarm takes; moto does not evaluate metrics, so offline an alarm
            # changes state through SetAlarmState (the state machine's smoke test verdict).
            alarm = {k: v for k, v in props.items() if k in _ALARM_KEYS}
            cloudwatch.put_metric_alarm(AlarmName=name, **alarm)

    # ----- S3 snapshot (moto keeps S3 in memory) -------------------------------------------------
    def _snapshot_buckets(self) -> list[str]:
        return [self.stack.data_bucket, self.stack.artifacts_bucket]

    def _save_s3(self) -> None:
        if not self._started:
            return
        s3 = self.moto_client("s3")
        target = self.work_dir / "s3.new"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for bucket in self._snapshot_buckets():
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for item in page.get("Contents", []):
                    dest = target / bucket / item["Key"]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    s3.download_file(bucket, item["Key"], str(dest))
        final = self.work_dir / "s3"
        shutil.rmtree(final, ignore_errors=True)
        target.rename(final)  # the old snapshot stays whole until the new one is

    def _restore_s3(self) -> list[str]:
        shutil.rmtree(self.work_dir / "s3.new", ignore_errors=True)  # a save interrupted by a kill
        root = self.work_dir / "s3"
        if not root.is_dir():
            return []
        s3 = self.client("s3")
        count = 0
        for bucket in self._snapshot_buckets():
            base = root / bucket
            for path in sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []:
                s3.upload_file(str(path), bucket, path.relative_to(base).as_posix())
                count += 1
        return [f"restored {count} objects of the previous session into the local S3"] if count else []

    # ----- the things a user does -----------------------------------------------------------------
    def upload_dataset(self, local_dir: Path, name: str | None = None, version: str | None = None) -> tuple[str, str]:
        """Upload a dataset version directory to the data bucket, manifest.json last. -> (key, version id)."""
        import json

        manifest_path = local_dir / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text("utf-8"))
        except OSError as exc:
            raise ValueError(f"{manifest_path}: cannot read the dataset manifest: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{manifest_path}: not valid JSON: {exc}") from exc
        name = name or str(manifest.get("name") or "")
        version = version or str(manifest.get("version") or "")
        if not name or not version or "/" in name + version or name in (".", "..") or version in (".", ".."):
            raise ValueError(f"{manifest_path}: needs a plain 'name' and 'version' to form "
                             f"datasets/<name>/<version>/ (got {name!r}, {version!r})")
        prefix = s3_layout.dataset_prefix(name, version)
        s3 = self.client("s3")
        files = sorted(p for p in local_dir.rglob("*") if p.is_file() and p != manifest_path)
        for path in files:
            s3.upload_file(str(path), self.stack.data_bucket, prefix + path.relative_to(local_dir).as_posix())
        key = prefix + s3_layout.MANIFEST_NAME
        response = s3.put_object(Bucket=self.stack.data_bucket, Key=key, Body=manifest_path.read_bytes(),
                                 ContentType="application/json")
        return key, str(response.get("VersionId") or "")

    def upload_event(self, bucket: str, key: str) -> dict[str, Any]:
        head = self.client("s3").head_object(Bucket=bucket, Key=key)
        with self._seq_lock:
            self._sequencer += 1
            sequencer = self._sequencer
        return events.object_created_event(bucket, key, head, REGION, ACCOUNT_ID, sequencer)

    def deliver_event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """EventBridge: invoke the rule's target if the template's pattern matches, else None."""
        return self.eventbridge.deliver(event)


def _default_jobs() -> JobBackend:
    from d2ops.offline.backends import LocalJobBackend

    return LocalJobBackend()


def _default_serving() -> ServingBackend:
    from d2ops.offline.backends import LocalServingBackend

    return LocalServingBackend()
