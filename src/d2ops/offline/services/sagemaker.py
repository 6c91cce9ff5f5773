"""The SageMaker API offline (AWS JSON 1.1, ``X-Amz-Target: SageMaker.<Op>``).

The operations that do real work are served here: training and processing jobs
(`sagemaker_jobs`), endpoints with their canaries and alarm-driven rollback
(`sagemaker_endpoints`), which share the account's instance quotas (`sagemaker_account`). Every
other operation (models, endpoint configs, the Model Registry) goes on to the moto server, which
keeps those control-plane records, with two of SageMaker's rules moto lacks: ``ClientToken``
idempotency (`IDEMPOTENT_OPERATIONS`) and unique names (`UNIQUE_NAMES`).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Generic, TypeVar

from d2ops.offline.errors import ApiError
from d2ops.offline.quotas import AccountQuotas
from d2ops.offline.services.base import AwsJsonService, RuntimeParts, Upstream, WireRequest, WireResponse
from d2ops.offline.services.sagemaker_account import SageMakerAccount
from d2ops.offline.services.sagemaker_endpoints import DEFAULT_MAX_BAKE_SECONDS, LocalEndpoints, ServingBackend
from d2ops.offline.services.sagemaker_jobs import JobBackend, LocalJobs
from d2ops.offline.stack import ACCOUNT_ID, REGION

# SageMaker operations with an idempotency token (ClientToken) that moto does not honour.
IDEMPOTENT_OPERATIONS = frozenset({"CreateModelPackage"})
# Creates whose names SageMaker keeps unique (moto overwrites instead): name member, Describe operation, the
# ARN member it answers and the noun of SageMaker's "Cannot create already existing ..." message.
UNIQUE_NAMES = {"CreateModel": ("ModelName", "DescribeModel", "ModelArn", "model"),
                "CreateEndpointConfig": ("EndpointConfigName", "DescribeEndpointConfig", "EndpointConfigArn",
                                         "endpoint configuration")}
T = TypeVar("T")


class _PartAttribute(Generic[T]):
    """An attribute of LocalSageMaker that is one of its parts' (``part.attribute``), read and written there."""

    def __init__(self, part: str, attribute: str) -> None:
        self.part, self.attribute = part, attribute

    def __get__(self, owner: Any, owner_type: type | None = None) -> T:
        value: T = getattr(getattr(owner, self.part), self.attribute)
        return value

    def __set__(self, owner: Any, value: T) -> None:
        setattr(getattr(owner, self.part), self.attribute, value)


class LocalSageMaker(AwsJsonService):
    """Serves the OWNED operations (jobs: `job_api`; endpoints: `endpoint_api`); all others go on to moto
    (`forward`)."""

    CLIENT = "sagemaker"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_SAGEMAKER"
    TARGET_PREFIX = "SageMaker"
    JSON_VERSION = "1.1"
    OWNED = LocalJobs.OPERATIONS | LocalEndpoints.OPERATIONS

    def __init__(self, work_dir: Path, s3: Any, registry: Any, jobs: JobBackend, serving: ServingBackend,
                 region: str, account_id: str, training_defaults: dict[str, str] | None = None,
                 cloudwatch: Any = None, max_bake_seconds: float = DEFAULT_MAX_BAKE_SECONDS,
                 quotas: AccountQuotas | None = None) -> None:
        self.account = SageMakerAccount(region, account_id, quotas)
        self.job_api = LocalJobs(self.account, work_dir, s3, jobs, training_defaults, cloudwatch)
        self.endpoint_api = LocalEndpoints(self.account, work_dir, s3, registry, serving, cloudwatch,
                                           max_bake_seconds)
        self._idempotent: dict[tuple[str, str], tuple[bytes, bytes, str]] = {}
        self._idempotency_lock = threading.Lock()

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> LocalSageMaker:
        return cls(parts.work_dir, parts.client("s3"), parts.moto_client("sagemaker"), parts.jobs_backend(),
                   parts.serving_backend(), REGION, ACCOUNT_ID, parts.training_defaults,
                   cloudwatch=parts.client("cloudwatch"), quotas=parts.quotas)

    # ----- what the runtime, its commands and tests reach -------------------------------------
    @property
    def quotas(self) -> AccountQuotas:
        return self.account.quotas

    # How jobs run and endpoints serve, and how long a bake may last: a test may swap them between runs.
    jobs: _PartAttribute[JobBackend] = _PartAttribute("job_api", "backend")
    serving: _PartAttribute[ServingBackend] = _PartAttribute("endpoint_api", "serving")
    max_bake_seconds: _PartAttribute[float] = _PartAttribute("endpoint_api", "max_bake_seconds")

    def job_dir(self, name: str) -> Path:
        return self.job_api.job_dir(name)

    def job_log(self, name: str) -> Path:
        return self.job_api.job_log(name)

    def invoke(self, endpoint_name: str, body: bytes, content_type: str | None,
               accept: str | None, custom_attributes: str | None = None,
               inference_id: str | None = None) -> tuple[int, bytes, str]:
        """SageMaker Runtime's InvokeEndpoint (`sagemaker_runtime`)."""
        return self.endpoint_api.invoke(endpoint_name, body, content_type, accept, custom_attributes, inference_id)

    def served(self, endpoint_name: str) -> dict[str, int]:
        return self.endpoint_api.served(endpoint_name)

    def endpoint_url(self, endpoint_name: str) -> str | None:
        return self.endpoint_api.endpoint_url(endpoint_name)

    # ----- dispatch -------------------------------------------------------------------------
    def owns(self, operation: str, request: WireRequest) -> bool:
        return operation in self.OWNED

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        if operation not in self.OWNED:
            raise ApiError("UnknownOperationException", f"{operation} is not served locally")
        part = self.job_api if operation in LocalJobs.OPERATIONS else self.endpoint_api
        method = "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")
        result: dict[str, Any] = getattr(part, method)(request)
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

    # ----- shutdown ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop running jobs and every endpoint server (their processes must not outlive us)."""
        self.account.closing.set()  # a bake in progress ends (and stops its new server)
        self.job_api.stop_all()
        self.account.join(timeout=30)
        self.endpoint_api.stop_servers()
