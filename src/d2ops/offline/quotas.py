"""The offline account's SageMaker quotas: what the offline SageMaker refuses, and what an offline
Service Quotas API would list.

SageMaker counts instances per instance type and usage (training, spot training, processing,
endpoint) against account-level quotas that Service Quotas names, e.g. "ml.g4dn.xlarge for spot
training job usage" (d2ops_core.platform.quota_name). A request that would take the instances in
use past the quota is refused with ``ResourceLimitExceeded`` in SageMaker's own words
(d2ops_core.platform.quota_refusal_message).

The defaults model a new account: accelerated (GPU/Inferentia/Trainium) spot training at 0, the
quota a first run most often meets, and a few instances of everything else, enough for the stack's
defaults (offline: on-demand training, one evaluation job, a blue/green endpoint update that holds
the old and the new fleet at once). Tests and `d2ops doctor` override quotas by name:

    quotas = AccountQuotas({"ml.g4dn.xlarge for training job usage": 0})
    quotas.value("ml.g4dn.xlarge for training job usage")        # 0
    quotas.check("ml.g4dn.xlarge", "training", requested=1, used=0)  # raises QuotaExceeded
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from d2ops.offline.errors import ApiError
from d2ops_core.platform import (
    QUOTA_SERVICE_CODE,
    QuotaUsage,
    instance_family,
    parse_quota_name,
    quota_name,
    quota_refusal_message,
)

USAGES: tuple[QuotaUsage, ...] = ("training", "spot training", "processing", "endpoint")
# A modelled new account (see the module docstring); not a claim about any real account's numbers.
DEFAULT_VALUES: dict[QuotaUsage, float] = {"training": 4, "spot training": 4, "processing": 4, "endpoint": 8}
_ACCELERATED_FAMILIES = ("g", "p", "inf", "trn")  # ml.g4dn, ml.p4d, ml.inf2, ml.trn1 ...
ZERO_BY_DEFAULT: tuple[QuotaUsage, ...] = ("spot training",)


def accelerated(instance_type: str) -> bool:
    family = instance_family(instance_type)
    return any(family.startswith(prefix) and family[len(prefix):][:1].isdigit() for prefix in _ACCELERATED_FAMILIES)


def default_value(instance_type: str, usage: QuotaUsage) -> float:
    """The modelled new account's quota for ``instance_type`` and ``usage``."""
    if usage in ZERO_BY_DEFAULT and accelerated(instance_type):
        return 0
    return DEFAULT_VALUES[usage]


def quota_code(name: str) -> str:
    """A stable Service Quotas code for an offline quota (real codes are per type and usage, not derivable)."""
    return "L-" + hashlib.sha256(name.encode()).hexdigest()[:8].upper()


@dataclass(frozen=True)
class Quota:
    """One quota as Service Quotas lists it (GetServiceQuota / ListServiceQuotas)."""

    name: str
    code: str
    value: float
    service_code: str = QUOTA_SERVICE_CODE
    unit: str = "None"
    adjustable: bool = True


class QuotaExceeded(ApiError):
    """SageMaker's refusal of a request over a quota (``ResourceLimitExceeded``, HTTP 400)."""

    def __init__(self, name: str, value: float, used: float, requested: float) -> None:
        super().__init__("ResourceLimitExceeded", quota_refusal_message(name, value, used, requested))
        self.quota_name, self.value, self.used, self.requested = name, value, used, requested


class AccountQuotas:
    """The offline account's SageMaker quotas: modelled defaults, overridden by name."""

    def __init__(self, overrides: Mapping[str, float] | None = None) -> None:
        self.overrides: dict[str, float] = {}
        for name, value in (overrides or {}).items():
            self.set(name, value)

    def set(self, name: str, value: float) -> None:
        """Override one quota; a name that is not a SageMaker per-instance-type quota is a ValueError."""
        if parse_quota_name(name) is None:
            raise ValueError(f"{name!r} is not a SageMaker quota name ('<ml instance type> for <usage>', e.g. "
                             f"{quota_name('ml.g4dn.xlarge', 'spot training')!r})")
        if value < 0:
            raise ValueError(f"quota {name!r}: {value} is negative")
        self.overrides[name] = float(value)

    def value(self, name: str) -> float:
        parsed = parse_quota_name(name)
        if parsed is None:
            raise KeyError(name)
        return self.overrides.get(name, default_value(*parsed))

    def quota(self, name: str) -> Quota:
        return Quota(name=name, code=quota_code(name), value=self.value(name))

    def listed(self, instance_types: Iterable[str]) -> list[Quota]:
        """Every usage's quota for ``instance_types`` and every overridden one, sorted by name (what
        ListServiceQuotas would answer for the instance types that matter)."""
        names = {quota_name(t, u) for t in instance_types for u in USAGES} | set(self.overrides)
        return [self.quota(name) for name in sorted(names)]

    def check(self, instance_type: str, usage: QuotaUsage, requested: float, used: float) -> None:
        """Raise :class:`QuotaExceeded` when ``requested`` more instances would take ``used`` past the quota."""
        name = quota_name(instance_type, usage)
        value = self.value(name)
        if used + requested > value:
            raise QuotaExceeded(name, value, used, requested)
