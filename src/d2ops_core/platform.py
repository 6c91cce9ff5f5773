"""Platform facts: what SageMaker's hosts and an AWS account give a job or an endpoint.

Nothing here can be observed on a development machine (no GPU driver, no account quota, no
network rule), so each fact is written down once, with its source and the date it was read, and
the images, the job requests and the preflight (`d2ops doctor`) are tested against this table.
When AWS changes a fact, change it here and let the tests say what no longer fits.

Standard library only (the Lambda layer and both images ship it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

CHECKED = "2026-11-26"


@dataclass(frozen=True)
class Source:
    """Where a fact was read, and when."""

    url: str
    checked: str = CHECKED


_INSTANCE_TYPE = re.compile(r"^ml\.(?P<family>[a-z0-9]+)\.(?P<size>[a-z0-9]+)$")


def instance_family(instance_type: str) -> str:
    """``ml.g4dn.xlarge`` -> ``g4dn``; a ValueError names anything that is not a SageMaker instance type."""
    match = _INSTANCE_TYPE.match(instance_type)
    if match is None:
        raise ValueError(f"{instance_type!r} is not a SageMaker instance type (ml.<family>.<size>)")
    return match["family"]


# ---------------------------------------------------------------------------------------- quotas
# Service Quotas names SageMaker's per-instance-type limits "<instance type> for <usage>"; a new
# account's GPU quotas are often 0 (spot training in particular). The quota *codes* (L-...) differ
# per instance type and are not derivable, so the preflight and the failure message find a quota by
# its name (ListServiceQuotas, service code "sagemaker").
QUOTA_SERVICE_CODE = "sagemaker"
QUOTA_SOURCE = Source("https://docs.aws.amazon.com/sagemaker/latest/dg/regions-quotas.html")

QuotaUsage = Literal["training", "spot training", "processing", "endpoint"]
_QUOTA_SUFFIX: dict[str, str] = {
    "training": "for training job usage",
    "spot training": "for spot training job usage",
    "processing": "for processing job usage",
    "endpoint": "for endpoint usage",
}


def quota_name(instance_type: str, usage: QuotaUsage) -> str:
    """The Service Quotas name of the limit a job or an endpoint of ``instance_type`` counts against."""
    instance_family(instance_type)  # refuse a malformed type here, not as a quota that never matches
    return f"{instance_type} {_QUOTA_SUFFIX[usage]}"


_QUOTA_MESSAGE = re.compile(
    r"account-level service limit '(?P<name>[^']+)' is (?P<value>\d+(?:\.\d+)?) Instances?"
    r"(?:, with current utilization of (?P<used>\d+(?:\.\d+)?) Instances?)?"
    r"(?: and a request delta of (?P<delta>\d+(?:\.\d+)?) Instances?)?")


@dataclass(frozen=True)
class QuotaRefusal:
    """What SageMaker's ResourceLimitExceeded message says about the quota a request exceeded."""

    name: str
    value: float
    used: float | None = None
    requested: float | None = None


def parse_quota_refusal(message: str) -> QuotaRefusal | None:
    """SageMaker words a quota refusal as "The account-level service limit '<quota name>' is N
    Instances, with current utilization of U Instances and a request delta of D Instances. Please use
    AWS Service Quotas to request an increase for this quota." None when ``message`` is not one."""
    match = _QUOTA_MESSAGE.search(message)
    if match is None:
        return None

    def number(group: str) -> float | None:
        return float(match[group]) if match[group] is not None else None

    return QuotaRefusal(name=match["name"], value=float(match["value"]), used=number("used"),
                        requested=number("delta"))


# ------------------------------------------------------------------------------ model registry
# CreateModelPackage's ModelPackageDescription (botocore shape EntityDescription): at most 1,024
# characters, each of the Unicode categories letter, mark, separator, symbol, number or punctuation
# (pattern [\p{L}\p{M}\p{Z}\p{S}\p{N}\p{P}]*): no control, format or unassigned characters. A request
# outside it is a ValidationException, so the run would end RegistrationFailed instead of with the
# gate's verdict. tests/unit/test_registry_description.py reads both from botocore's model.
MODEL_PACKAGE_DESCRIPTION_SOURCE = Source(
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateModelPackage.html")
MODEL_PACKAGE_DESCRIPTION_MAX = 1024
MODEL_PACKAGE_DESCRIPTION_CATEGORIES = frozenset("LMZSNP")  # first letters of unicodedata.category
