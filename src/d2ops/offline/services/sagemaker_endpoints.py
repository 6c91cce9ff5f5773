"""SageMaker endpoints offline (CreateEndpoint ... ListEndpoints, their ListTags) and what
SageMaker Runtime's InvokeEndpoint reaches (`invoke`).

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
server and the old one stops. An endpoint config with a DataCaptureConfig has its answered requests
captured into S3 in SageMaker's layout (`sagemaker_capture`).
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from d2ops.offline.errors import ApiError
from d2ops.offline.services.sagemaker_account import Fleet, SageMakerAccount, utc_now
from d2ops.offline.services.sagemaker_capture import CaptureSettings, CaptureWriter
from d2ops_core.s3_layout import parse_s3_uri

log = logging.getLogger(__name__)

ALARM_POLL_SECONDS = 0.5
# Offline: long enough for a poll, the smoke test (24 answers, a fraction of a second each on a
# CPU) and the alarm, short enough for `make demo`; SageMaker's own bake (WaitIntervalInSeconds)
# is 600 s. Should the bake end first, the state machine smoke-tests the endpoint in service
# and a failure updates it back instead.
DEFAULT_MAX_BAKE_SECONDS = 30.0
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"  # InvokeEndpoint's CustomAttributes member, as a header


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


class ServedModel(Protocol):
    url: str  # http://127.0.0.1:<port> answering /ping and /invocations

    def stop(self) -> None: ...


class ServingBackend(Protocol):
    # ``environment``: the model's container Environment (CreateModel), set in the server's environment
    def start(self, model_tar: Path, work_dir: Path, name: str,
              environment: Mapping[str, str] | None = None) -> ServedModel: ...


class LocalEndpoints:
    """Endpoints: their records, the servers taking their traffic, updates in their bake."""

    OPERATIONS = frozenset({"CreateEndpoint", "UpdateEndpoint", "DescribeEndpoint", "DeleteEndpoint", "ListEndpoints",
                            "ListTags"})

    def __init__(self, account: SageMakerAccount, work_dir: Path, s3: Any, registry: Any, serving: ServingBackend,
                 cloudwatch: Any = None, max_bake_seconds: float = DEFAULT_MAX_BAKE_SECONDS) -> None:
        self.account = account
        self.work_dir = work_dir
        self.s3 = s3  # boto3 S3 client (moto)
        self.registry = registry  # boto3 SageMaker client straight to moto (models, configs, packages)
        self.serving = serving
        self.cloudwatch = cloudwatch  # boto3 CloudWatch client: the auto-rollback alarms
        self.max_bake_seconds = max_bake_seconds
        self._lock = account.lock
        self._endpoints: dict[str, dict[str, Any]] = {}
        self._endpoint_tags: dict[str, list[dict[str, str]]] = {}  # endpoint ARN -> CreateEndpoint's Tags
        self._servers: dict[str, ServedModel] = {}  # endpoint name -> server taking traffic
        self._canaries: dict[str, _Canary] = {}  # endpoint name -> the new fleet during its bake
        self._served: dict[str, dict[str, int]] = {}  # endpoint name -> config -> requests answered
        self._server_configs: dict[str, str] = {}  # endpoint name -> config of self._servers[name]
        self.capture = CaptureWriter(s3)  # data capture, for configs that ask for it
        self._capture_settings: dict[str, tuple[str, CaptureSettings | None]] = {}  # config -> (variant, settings)
        account.holds(self.fleets)

    def _not_found(self, name: str) -> ApiError:
        return ApiError("ValidationException", f"Could not find endpoint \"{self.account.arn('endpoint', name)}\".")

    # ----- quotas ----------------------------------------------------------------------------
    def fleets(self) -> list[Fleet]:
        """The instances the endpoints hold (both fleets during an update)."""
        fleets: list[Fleet] = []
        for endpoint in self._endpoints.values():
            if endpoint["EndpointStatus"] == "Failed":
                continue
            fleets += self._endpoint_fleet(endpoint["EndpointConfigName"])
            pending = endpoint.get("PendingDeploymentSummary")
            if endpoint["EndpointStatus"] == "Updating" and pending:
                fleets += self._endpoint_fleet(pending["EndpointConfigName"])
        return fleets

    def _endpoint_fleet(self, config_name: str) -> list[Fleet]:
        variants = self.registry.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]
        return [(str(v["InstanceType"]), "endpoint", float(v.get("InitialInstanceCount", 1))) for v in variants
                if v.get("InstanceType")]  # serverless variants hold no instances

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
                                                      f"\"{self.account.arn('endpoint', name)}\".")
            self._model_data(config)  # a missing config fails the call, not the endpoint
            self.account.check_quotas(self._endpoint_fleet(config))
            now = utc_now()
            endpoint = {"EndpointName": name, "EndpointArn": self.account.arn("endpoint", name),
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
                    endpoint.update(EndpointStatus="Failed", FailureReason=str(exc)[:1024], LastModifiedTime=utc_now())
                return
            with self._lock:
                if self._endpoints.get(name) is not endpoint:  # deleted meanwhile
                    server.stop()
                    return
                self._servers[name] = server
                self._server_configs[name] = config
                endpoint.update(EndpointStatus="InService", LastModifiedTime=utc_now())

        self.account.start(f"endpoint-{name}", bring_up)
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
                raise self._not_found(name)
            if endpoint["EndpointStatus"] != "InService":
                raise ApiError("ValidationException", f"Cannot update in-progress endpoint "
                                                      f"\"{endpoint['EndpointArn']}\".")
            self._model_data(config)
            # Blue/green: the new fleet comes up while the old one still serves, so both count.
            self.account.check_quotas(self._endpoint_fleet(config))
            variant = self.registry.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]
            share = traffic_share(routing, int(variant.get("InitialInstanceCount", 1)))
            bake = min(float(routing.get("WaitIntervalInSeconds") or 0), self.max_bake_seconds)
            now = utc_now()
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
                        {"Status": status, "StatusMessage": message, "StartTime": utc_now()}]

        def finish(**fields: Any) -> None:
            with self._lock:
                endpoint.pop("PendingDeploymentSummary", None)
                endpoint.update(EndpointStatus="InService", LastModifiedTime=utc_now(), **fields)

        def blue_green() -> None:
            started = utc_now()
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
                if tripped is not None or self.account.closing.is_set():
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

        self.account.start(f"endpoint-{name}-update", blue_green)
        return {"EndpointArn": endpoint["EndpointArn"]}

    def _watch_alarms(self, alarms: list[str], since: datetime, seconds: float) -> str | None:
        """The first alarm in ALARM during the bake, or None once it has passed.

        moto does not evaluate alarms, so an alarm offline changes state only by SetAlarmState; a
        state set before this update stands for one CloudWatch would since have evaluated back
        (the metric had no new data), so only states set during the update count.
        """
        deadline = time.monotonic() + seconds
        while not self.account.closing.is_set():
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
                raise self._not_found(name)
            result = copy.deepcopy(endpoint)
        if result["EndpointStatus"] in ("InService", "Updating"):
            result["ProductionVariants"] = [{"VariantName": "AllTraffic", "CurrentInstanceCount": 1,
                                             "DesiredInstanceCount": 1}]
        return result

    def delete_endpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("EndpointName", "")
        with self._lock:
            if self._endpoints.pop(name, None) is None:
                raise self._not_found(name)
            self._endpoint_tags.pop(self.account.arn("endpoint", name), None)
            server = self._servers.pop(name, None)
            canary = self._canaries.pop(name, None)
            self._server_configs.pop(name, None)
        for running in (server, canary.server if canary else None):
            if running is not None:
                running.stop()
        self.capture.flush(name)  # what the endpoint captured before it went
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
               accept: str | None, custom_attributes: str | None = None,
               inference_id: str | None = None) -> tuple[int, bytes, str]:
        """InvokeEndpoint: the answer of the server taking this request, captured when its config says so."""
        when = utc_now()
        status, answer, answer_type, config = self._forward(endpoint_name, body, content_type, accept,
                                                            custom_attributes)
        if 200 <= status < 300:
            try:
                variant, settings = self._capture_for(config)
            except Exception as exc:  # capture never fails an answered request
                log.warning("data capture: endpoint config %s unreadable, request not captured: %s", config, exc)
                return status, answer, answer_type
            if settings is not None:
                self.capture.capture(settings, endpoint_name, variant, request=body, request_type=content_type,
                                     answer=answer, answer_type=answer_type, when=when, inference_id=inference_id)
        return status, answer, answer_type

    def _capture_for(self, config: str) -> tuple[str, CaptureSettings | None]:
        """The config's variant name and DataCaptureConfig (configs never change: read once)."""
        with self._lock:
            known = self._capture_settings.get(config)
        if known is None:
            described = self.registry.describe_endpoint_config(EndpointConfigName=config)
            variant = str(described["ProductionVariants"][0].get("VariantName") or "AllTraffic")
            known = (variant, CaptureSettings.from_config(described.get("DataCaptureConfig")))
            with self._lock:
                self._capture_settings[config] = known
        return known

    def _forward(self, endpoint_name: str, body: bytes, content_type: str | None, accept: str | None,
                 custom_attributes: str | None) -> tuple[int, bytes, str, str]:
        """The request sent to the server taking it: its status, body, content type and that server's config."""
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
            raise ApiError("ValidationError",
                           f"Endpoint {endpoint_name} of account {self.account.account_id} not found.")
        headers = {"Content-Type": content_type or "application/octet-stream"}
        if accept:
            headers["Accept"] = accept
        if custom_attributes:
            headers[CUSTOM_ATTRIBUTES] = custom_attributes
        request = urllib.request.Request(f"{server.url}/invocations", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return (response.status, response.read(), response.headers.get("Content-Type") or "application/json",
                        config)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), err.headers.get("Content-Type") or "application/json", config
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
    def stop_servers(self) -> None:
        """Stop every endpoint server (their processes must not outlive the runtime)."""
        with self._lock:
            servers = [*self._servers.values(), *(c.server for c in self._canaries.values())]
            self._servers.clear()
            self._canaries.clear()
            for endpoint in self._endpoints.values():
                endpoint["EndpointStatus"] = "OutOfService"
        for server in servers:
            server.stop()
        self.capture.close()  # the records still buffered, written before the runtime saves S3
