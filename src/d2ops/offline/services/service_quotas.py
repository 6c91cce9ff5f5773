"""An offline Service Quotas API for SageMaker's quotas (moto's Service Quotas serves only ``vpc``).

It answers from the same table the offline SageMaker enforces (:class:`d2ops.offline.quotas.AccountQuotas`),
so ``d2ops doctor`` against the offline runtime reads the quotas its runs will meet, in botocore's
shapes (AWS JSON 1.1, ``X-Amz-Target: ServiceQuotasV20190624.<Op>``), as Service Quotas answers:

- ``ListServiceQuotas``: the account's applied values, i.e. the quotas raised (or lowered) from
  their defaults. A quota still at its default is not among them;
- ``ListAWSDefaultServiceQuotas``: AWS's default values;
- ``GetServiceQuota`` / ``GetAWSDefaultServiceQuota``: one quota by its code.

Both lists page with ``MaxResults``/``NextToken``. The default list covers every usage of the
instance types the offline stack names (and every overridden quota): a real account lists every
instance type SageMaker offers, which no table here knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from d2ops.offline.errors import ApiError
from d2ops.offline.quotas import USAGES, AccountQuotas, Quota, default_value, quota_code
from d2ops.offline.services.base import AwsJsonService, RuntimeParts, WireRequest
from d2ops.offline.stack import ACCOUNT_ID, REGION
from d2ops_core.platform import QUOTA_SERVICE_CODE, parse_quota_name, quota_name

SERVICE_NAME = "Amazon SageMaker"
_MAX_RESULTS = 100  # Service Quotas' own cap on MaxResults


class OfflineServiceQuotas(AwsJsonService):
    """Serves the operations above for service code ``sagemaker``; other operations and service codes
    go on to moto."""

    CLIENT = "service-quotas"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_SERVICE_QUOTAS"
    TARGET_PREFIX = "ServiceQuotasV20190624"
    JSON_VERSION = "1.1"
    OWNED = frozenset({"ListServiceQuotas", "ListAWSDefaultServiceQuotas", "GetServiceQuota",
                       "GetAWSDefaultServiceQuota"})

    def __init__(self, quotas: AccountQuotas, instance_types: Iterable[str], region: str, account_id: str) -> None:
        self.quotas = quotas
        self.instance_types = sorted(set(instance_types))
        self.region = region
        self.account_id = account_id

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> OfflineServiceQuotas:
        return cls(parts.quotas, parts.stack.instance_types(), REGION, ACCOUNT_ID)

    def owns(self, operation: str, request: WireRequest) -> bool:
        body = request.json_object()
        return body is not None and operation in self.OWNED and self.serves(body)

    def serves(self, request: dict[str, Any]) -> bool:
        return request.get("ServiceCode") == QUOTA_SERVICE_CODE

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        if operation == "ListServiceQuotas":
            applied = [self.quotas.quota(name) for name in sorted(self.quotas.overrides)]
            return self._page(applied, request)
        if operation == "ListAWSDefaultServiceQuotas":
            return self._page([self._default(name) for name in self._names()], request)
        if operation == "GetServiceQuota":
            return {"Quota": self._shape(self.quotas.quota(self._by_code(request)))}
        if operation == "GetAWSDefaultServiceQuota":
            return {"Quota": self._shape(self._default(self._by_code(request)))}
        raise ApiError("UnknownOperationException", f"{operation} is not served offline")

    def _names(self) -> list[str]:
        return sorted({quota_name(t, u) for t in self.instance_types for u in USAGES} | set(self.quotas.overrides))

    def _default(self, name: str) -> Quota:
        parsed = parse_quota_name(name)
        assert parsed is not None  # every name here came from quota_name or a checked override
        return Quota(name=name, code=quota_code(name), value=default_value(*parsed))

    def _by_code(self, request: dict[str, Any]) -> str:
        code = request.get("QuotaCode")
        for name in self._names():
            if quota_code(name) == code:
                return name
        raise ApiError("NoSuchResourceException", f"The request failed because the specified quota {code} does not "
                                                  f"exist for service {QUOTA_SERVICE_CODE}.")

    def _page(self, quotas: list[Quota], request: dict[str, Any]) -> dict[str, Any]:
        size = request.get("MaxResults") or _MAX_RESULTS
        if not isinstance(size, int) or not 1 <= size <= _MAX_RESULTS:
            raise ApiError("IllegalArgumentException", f"MaxResults must be between 1 and {_MAX_RESULTS}")
        token = request.get("NextToken")
        try:
            start = int(token) if token is not None else 0
        except ValueError:
            raise ApiError("InvalidPaginationTokenException", "Invalid pagination token") from None
        answer: dict[str, Any] = {"Quotas": [self._shape(q) for q in quotas[start:start + size]]}
        if start + size < len(quotas):
            answer["NextToken"] = str(start + size)
        return answer

    def _shape(self, quota: Quota) -> dict[str, Any]:
        return {"ServiceCode": quota.service_code, "ServiceName": SERVICE_NAME,
                "QuotaArn": f"arn:aws:servicequotas:{self.region}:{self.account_id}:{quota.service_code}/{quota.code}",
                "QuotaCode": quota.code, "QuotaName": quota.name, "Value": quota.value, "Unit": quota.unit,
                "Adjustable": quota.adjustable, "GlobalQuota": False}
