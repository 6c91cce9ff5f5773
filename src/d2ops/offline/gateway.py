"""One loopback HTTP endpoint for the AWS APIs moto cannot serve the way the pipeline needs.

- Step Functions (AWS JSON 1.0, ``X-Amz-Target: AWSStepFunctions.<Op>``): `sfn.LocalStepFunctions`.
- SageMaker (AWS JSON 1.1, ``X-Amz-Target: SageMaker.<Op>``): training and processing jobs and
  endpoints are served by `sagemaker.LocalSageMaker` (they run real local processes); every
  other SageMaker operation (models, endpoint configs, the Model Registry) is forwarded
  unchanged to the moto server, which keeps those control-plane records.
- SageMaker Runtime (REST JSON, ``POST /endpoints/<name>/invocations``): forwarded to the
  endpoint's local TorchServe ``/invocations``.
- Service Quotas (AWS JSON 1.1, ``X-Amz-Target: ServiceQuotasV20190624.<Op>``): SageMaker's
  quotas from the offline account's table (`servicequotas.OfflineServiceQuotas`); other service
  codes are forwarded to moto.

boto3 reaches it through ``AWS_ENDPOINT_URL_SFN``, ``AWS_ENDPOINT_URL_SAGEMAKER``,
``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`` and ``AWS_ENDPOINT_URL_SERVICE_QUOTAS``. Signatures are not
checked (dummy credentials).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import urllib.error
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from d2ops.offline.errors import ApiError
from d2ops.offline.request_body import BadContentLength, content_length

log = logging.getLogger(__name__)

_INVOKE = re.compile(r"^/endpoints/(?P<name>[A-Za-z0-9-]{1,63})/invocations$")
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"  # InvokeEndpoint's CustomAttributes member
MAX_BODY = 64 * 1024 * 1024  # generous for images; refuses absurd requests before reading them
# SageMaker operations with an idempotency token (ClientToken) that moto does not honour.
IDEMPOTENT_OPERATIONS = frozenset({"CreateModelPackage"})
# Creates whose names SageMaker keeps unique (moto overwrites instead): name member, Describe operation, the
# ARN member it answers and the noun of SageMaker's "Cannot create already existing ..." message.
UNIQUE_NAMES = {"CreateModel": ("ModelName", "DescribeModel", "ModelArn", "model"),
                "CreateEndpointConfig": ("EndpointConfigName", "DescribeEndpointConfig", "EndpointConfigArn",
                                         "endpoint configuration")}


def aws_json(value: Any) -> Any:
    """Python values -> the AWS JSON protocols' encoding (timestamps as epoch seconds)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: aws_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [aws_json(v) for v in value]
    return value


class JsonService(Protocol):
    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]: ...


class QuotaService(JsonService, Protocol):
    OWNED: frozenset[str]

    def serves(self, request: dict[str, Any]) -> bool: ...


class Invoker(Protocol):
    def invoke(self, endpoint_name: str, body: bytes, content_type: str | None,
               accept: str | None, custom_attributes: str | None = None) -> tuple[int, bytes, str]: ...


class Gateway:
    """Owns the HTTP server thread; services are attached after construction."""

    def __init__(self, moto_url: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.moto_url = moto_url.rstrip("/")
        self.sfn: JsonService | None = None
        self.sagemaker: JsonService | None = None
        self.sagemaker_owned: frozenset[str] = frozenset()
        self._idempotent: dict[tuple[str, str], tuple[bytes, bytes, str]] = {}
        self._idempotency_lock = threading.Lock()
        self.runtime: Invoker | None = None
        # Service Quotas for service code "sagemaker" (d2ops.offline.servicequotas); other codes go to moto.
        self.servicequotas: QuotaService | None = None
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("gateway: " + format, *args)

            def do_POST(self) -> None:
                gateway._handle(self)

            def do_GET(self) -> None:
                gateway._reply(self, 404, b'{"message":"not found"}', "application/json")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        # stop() waits for the serve loop to notice: poll every 0.1 s, not socketserver's 0.5 (each runtime stops it)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="offline-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # shutdown() waits for serve_forever() to notice: on a gateway that never started it would wait forever.
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    # ----- request handling ----------------------------------------------------------------
    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str,
               headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            length = content_length(handler.headers)
        except BadContentLength as exc:
            handler.close_connection = True
            self._reply(handler, exc.status, json.dumps({"message": exc.message}).encode(), "application/json")
            return
        if length > MAX_BODY:
            self._reply(handler, 413, json.dumps({"message": f"request body over {MAX_BODY} bytes"}).encode(),
                        "application/json")
            handler.close_connection = True
            return
        body = handler.rfile.read(length) if length else b""
        target = handler.headers.get("X-Amz-Target", "")
        match = _INVOKE.match(handler.path.split("?")[0])
        if match and self.runtime is not None:
            self._invoke(handler, match["name"], body)
        elif target.startswith("ServiceQuotasV20190624.") and self.servicequotas is not None:
            self._service_quotas(handler, target.partition(".")[2], body)
        elif target.startswith("AWSStepFunctions.") and self.sfn is not None:
            self._json_call(handler, self.sfn, target.partition(".")[2], body, "1.0")
        elif target.startswith("SageMaker.") and self.sagemaker is not None:
            operation = target.partition(".")[2]
            if operation in self.sagemaker_owned:
                self._json_call(handler, self.sagemaker, operation, body, "1.1")
            elif operation in IDEMPOTENT_OPERATIONS:
                self._forward_idempotent(handler, operation, body)
            elif operation in UNIQUE_NAMES:
                self._forward_unique(handler, operation, body)
            else:
                self._forward(handler, body)
        else:
            self._reply(handler, 400, json.dumps({"__type": "UnknownOperationException",
                                                  "message": f"no offline service for {target or handler.path}"})
                        .encode(), "application/x-amz-json-1.0")

    def _service_quotas(self, handler: BaseHTTPRequestHandler, operation: str, body: bytes) -> None:
        assert self.servicequotas is not None
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if isinstance(request, dict) and operation in self.servicequotas.OWNED and self.servicequotas.serves(request):
            self._json_call(handler, self.servicequotas, operation, body, "1.1")
        else:
            self._forward(handler, body)

    def _json_call(self, handler: BaseHTTPRequestHandler, service: JsonService, operation: str, body: bytes,
                   version: str) -> None:
        content_type = f"application/x-amz-json-{version}"
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ApiError("SerializationException", "the request body is not a JSON object")
            result = service.call(operation, request)
            self._reply(handler, 200, json.dumps(aws_json(result)).encode(), content_type)
        except ApiError as err:
            self._reply(handler, err.status, json.dumps({"__type": err.code, "message": err.message}).encode(),
                        content_type)
        except ValueError as exc:
            self._reply(handler, 400, json.dumps({"__type": "SerializationException", "message": str(exc)}).encode(),
                        content_type)
        except Exception as exc:  # a bug here must reach the client as a 500, not a dropped connection
            log.exception("offline %s %s failed", content_type, operation)
            self._reply(handler, 500, json.dumps({"__type": "InternalFailure", "message": repr(exc)}).encode(),
                        content_type)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        self._reply(handler, *self._moto(handler, body))

    def _moto(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length")}
        request = urllib.request.Request(self.moto_url + handler.path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, data, content_type = response.status, response.read(), response.headers.get("Content-Type")
        except urllib.error.HTTPError as err:
            status, data, content_type = err.code, err.read(), err.headers.get("Content-Type")
        return status, data, content_type or "application/x-amz-json-1.1"

    def _forward_unique(self, handler: BaseHTTPRequestHandler, operation: str, body: bytes) -> None:
        """A name already in use is refused as SageMaker refuses it (a ValidationException naming the ARN)."""
        member, describe, arn_member, noun = UNIQUE_NAMES[operation]
        try:
            name = json.loads(body or b"{}").get(member)
        except (ValueError, AttributeError):
            name = None
        if isinstance(name, str):
            original = handler.headers.get("X-Amz-Target")
            handler.headers.replace_header("X-Amz-Target", f"SageMaker.{describe}")
            try:
                status, data, content_type = self._moto(handler, json.dumps({member: name}).encode())
            finally:
                handler.headers.replace_header("X-Amz-Target", str(original))
            if status == 200:
                arn = json.loads(data).get(arn_member, name)
                message = f'Cannot create already existing {noun} "{arn}".'
                self._reply(handler, 400, json.dumps({"__type": "ValidationException", "message": message}).encode(),
                            content_type)
                return
        self._forward(handler, body)

    def _forward_idempotent(self, handler: BaseHTTPRequestHandler, operation: str, body: bytes) -> None:
        """SageMaker's idempotency token (moto ignores it): a repeated ``ClientToken`` with the same request
        answers the first call's response instead of creating again; with another request it is refused."""
        try:
            token = json.loads(body or b"{}").get("ClientToken")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            self._forward(handler, body)
            return
        with self._idempotency_lock:
            seen = self._idempotent.get((operation, token))
            if seen is None:
                status, data, content_type = self._moto(handler, body)
                if status == 200:
                    self._idempotent[(operation, token)] = (body, data, content_type)
                self._reply(handler, status, data, content_type)
                return
        first_body, data, content_type = seen
        if json.loads(first_body) != json.loads(body):
            self._reply(handler, 400, json.dumps({"__type": "ValidationException", "message": (
                f"ClientToken {token} was already used for {operation} with different parameters")}).encode(),
                content_type)
            return
        self._reply(handler, 200, data, content_type)

    def _invoke(self, handler: BaseHTTPRequestHandler, name: str, body: bytes) -> None:
        assert self.runtime is not None
        try:
            # InvokeEndpoint's CustomAttributes reach the container as this header, as SageMaker passes them.
            status, data, content_type = self.runtime.invoke(name, body, handler.headers.get("Content-Type"),
                                                             handler.headers.get("Accept"),
                                                             handler.headers.get(CUSTOM_ATTRIBUTES))
        except ApiError as err:
            self._reply(handler, err.status, json.dumps({"message": err.message}).encode(), "application/json",
                        {"x-amzn-ErrorType": err.code})
            return
        if 200 <= status < 300:
            self._reply(handler, 200, data, content_type, {"x-Amzn-Invoked-Production-Variant": "AllTraffic"})
            return
        # SageMaker wraps a container's error answer as ModelError (HTTP 424) with the original.
        message = data.decode("utf-8", "replace")[:4096]
        self._reply(handler, 424, json.dumps({"message": f"Received client error ({status}) from primary with "
                                                         f"message \"{message}\"",
                                              "OriginalStatusCode": status, "OriginalMessage": message}).encode(),
                    "application/json", {"x-amzn-ErrorType": "ModelError"})
