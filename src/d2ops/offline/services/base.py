"""What an emulated AWS service is to the loopback endpoint (`d2ops.offline.aws_endpoint`).

A service is a class with:

- ``CLIENT``: boto3's name for the API (``"service-quotas"``), and ``ENDPOINT_VARIABLE``: the
  ``AWS_ENDPOINT_URL_<SERVICE ID>`` variable through which boto3 reaches the endpoint for it;
- ``from_runtime(parts)``: how the offline runtime builds it from its parts (`RuntimeParts`);
- ``accepts(request)``: whether a request is its (an ``X-Amz-Target`` prefix, a REST path);
- ``handle(request, upstream)``: the answer; ``upstream`` is moto's server, for what it leaves there;
- ``shutdown()``, if it runs anything (threads, processes) that must end with the runtime.

Most services speak the AWS JSON protocol: they subclass `AwsJsonService`, name their
``TARGET_PREFIX`` and ``JSON_VERSION``, and implement ``call(operation, request)``; ``owns`` says
which operations they serve themselves (the rest go to moto, through ``forward``). The list of
services is `d2ops.offline.services.SERVICES`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from d2ops.offline.errors import ApiError

log = logging.getLogger(__name__)

S = TypeVar("S", bound="EmulatedService")


@dataclass(frozen=True)
class WireRequest:
    """One HTTP request to the endpoint, its body read."""

    path: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def target(self) -> str:
        """``X-Amz-Target`` (``<prefix>.<Operation>``) of the AWS JSON protocols; empty for REST calls."""
        return self.headers.get("X-Amz-Target", "") or ""

    @property
    def operation(self) -> str:
        return self.target.partition(".")[2]

    @property
    def route(self) -> str:
        """The path without its query string."""
        return self.path.split("?")[0]

    def json_object(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None when it is not one."""
        try:
            value = json.loads(self.body or b"{}")
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class WireResponse:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, document: Any, content_type: str,
             headers: Mapping[str, str] | None = None) -> WireResponse:
        return cls(status, json.dumps(document).encode(), content_type, dict(headers or {}))


class Upstream(Protocol):
    """moto's server: the requests an emulated service leaves to it."""

    def forward(self, request: WireRequest, *, target: str | None = None,
                body: bytes | None = None) -> WireResponse:
        """``request`` as it came (or with another ``X-Amz-Target`` / body), answered by moto."""
        ...


class RuntimeParts(Protocol):
    """What a service's ``from_runtime`` may read from the offline runtime (`d2ops.offline.runtime`)."""

    work_dir: Path
    stack: Any  # d2ops.offline.stack.OfflineStack
    quotas: Any  # d2ops.offline.quotas.AccountQuotas
    lambdas: Any  # d2ops.offline.lambdas.LocalLambdas
    training_defaults: dict[str, str]
    lost_responses: dict[str, int]
    throttles: dict[str, int]

    def client(self, service: str) -> Any:
        """A boto3 client configured as the handlers' are (the runtime's endpoints)."""
        ...

    def moto_client(self, service: str) -> Any:
        """A boto3 client straight to moto's server."""
        ...

    def jobs_backend(self) -> Any:
        """How SageMaker jobs run (d2ops.offline.services.sagemaker_jobs.JobBackend)."""
        ...

    def serving_backend(self) -> Any:
        """How SageMaker endpoints serve (d2ops.offline.services.sagemaker_endpoints.ServingBackend)."""
        ...

    def service(self, kind: type[S]) -> S:
        """The runtime's instance of another emulated service (built first if need be)."""
        ...


class EmulatedService(Protocol):
    CLIENT: ClassVar[str]
    ENDPOINT_VARIABLE: ClassVar[str]

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> EmulatedService: ...

    def accepts(self, request: WireRequest) -> bool: ...

    def handle(self, request: WireRequest, upstream: Upstream) -> WireResponse: ...


def aws_json(value: Any) -> Any:
    """Python values -> the AWS JSON protocols' encoding (timestamps as epoch seconds)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: aws_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [aws_json(v) for v in value]
    return value


class AwsJsonService:
    """A service on the AWS JSON protocol (``POST /``, ``X-Amz-Target: <TARGET_PREFIX>.<Operation>``)."""

    CLIENT: ClassVar[str]
    ENDPOINT_VARIABLE: ClassVar[str]
    TARGET_PREFIX: ClassVar[str]
    JSON_VERSION: ClassVar[str]  # "1.0" or "1.1": the Content-Type application/x-amz-json-<version>

    def accepts(self, request: WireRequest) -> bool:
        return request.target.startswith(self.TARGET_PREFIX + ".")

    def owns(self, operation: str, request: WireRequest) -> bool:
        """Whether this service answers ``operation`` itself; otherwise `forward` passes it on."""
        return True

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def forward(self, operation: str, request: WireRequest, upstream: Upstream) -> WireResponse:
        """An operation this service leaves to moto."""
        return upstream.forward(request)

    def handle(self, request: WireRequest, upstream: Upstream) -> WireResponse:
        operation = request.operation
        if self.owns(operation, request):
            return self.answer(operation, request.body)
        return self.forward(operation, request, upstream)

    def answer(self, operation: str, body: bytes) -> WireResponse:
        """``call`` on the decoded body, its result or error in the protocol's encoding."""
        content_type = f"application/x-amz-json-{self.JSON_VERSION}"
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ApiError("SerializationException", "the request body is not a JSON object")
            result = self.call(operation, request)
            return WireResponse.json(200, aws_json(result), content_type)
        except ApiError as err:
            return WireResponse.json(err.status, {"__type": err.code, "message": err.message}, content_type)
        except ValueError as exc:
            return WireResponse.json(400, {"__type": "SerializationException", "message": str(exc)}, content_type)
        except Exception as exc:  # a bug here must reach the client as a 500, not a dropped connection
            log.exception("offline %s %s failed", content_type, operation)
            return WireResponse.json(500, {"__type": "InternalFailure", "message": repr(exc)}, content_type)
