"""The offline Service Quotas API: SageMaker's quotas from the offline account's table, in botocore's
shapes through the gateway; other service codes are moto's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.quotas import AccountQuotas
from d2ops.offline.services.service_quotas import OfflineServiceQuotas
from d2ops_core.platform import quota_name

GPU = "ml.g4dn.xlarge"
CPU = "ml.m5.large"
RAISED = quota_name(GPU, "spot training")


@pytest.fixture(scope="module")
def service_quotas() -> Iterator[Any]:
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    gateway = AwsEndpoint(f"http://{host}:{port}")
    gateway.add(OfflineServiceQuotas(AccountQuotas({RAISED: 3}), [GPU, CPU], "us-east-1",
                                     "123456789012"))
    gateway.start()
    try:
        yield boto3.client("service-quotas", region_name="us-east-1", endpoint_url=gateway.url,
                           aws_access_key_id="offline", aws_secret_access_key="offline")
    finally:
        gateway.stop()
        moto.stop()


def _all(client: Any, operation: str, page_size: int) -> list[dict[str, Any]]:
    pages = client.get_paginator(operation).paginate(ServiceCode="sagemaker",
                                                     PaginationConfig={"PageSize": page_size})
    return [q for page in pages for q in page["Quotas"]]


def test_applied_values_list_only_what_was_changed_and_defaults_list_every_usage(service_quotas: Any) -> None:
    applied = _all(service_quotas, "list_service_quotas", 1)
    assert [(q["QuotaName"], q["Value"]) for q in applied] == [(RAISED, 3.0)]
    defaults = _all(service_quotas, "list_aws_default_service_quotas", 3)  # 8 quotas over 3 pages
    names = [q["QuotaName"] for q in defaults]
    assert len(names) == 8 == len(set(names))
    by_name = {q["QuotaName"]: q for q in defaults}
    assert by_name[RAISED]["Value"] == 0  # a new account's spot GPU training quota
    assert by_name[quota_name(CPU, "spot training")]["Value"] > 0
    assert all(q["ServiceCode"] == "sagemaker" and q["QuotaCode"].startswith("L-") for q in defaults)


def test_one_quota_by_code_applied_and_default(service_quotas: Any) -> None:
    code = _all(service_quotas, "list_service_quotas", 10)[0]["QuotaCode"]
    assert service_quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 3
    assert service_quotas.get_aws_default_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"][
        "Value"] == 0
    with pytest.raises(ClientError) as missing:
        service_quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode="L-00000000")
    assert missing.value.response["Error"]["Code"] == "NoSuchResourceException"


def test_a_bad_page_token_is_refused_as_service_quotas_refuses_it(service_quotas: Any) -> None:
    with pytest.raises(ClientError) as bad:
        service_quotas.list_aws_default_service_quotas(ServiceCode="sagemaker", NextToken="x")
    assert bad.value.response["Error"]["Code"] == "InvalidPaginationTokenException"


def test_other_service_codes_are_answered_by_moto(service_quotas: Any) -> None:
    vpc = service_quotas.list_aws_default_service_quotas(ServiceCode="vpc")["Quotas"]
    assert vpc and all(q["ServiceCode"] == "vpc" for q in vpc)
