"""The offline account's SageMaker quotas (d2ops.offline.quotas) and the offline SageMaker's refusals.

The refusal is SageMaker's own ResourceLimitExceeded wording, so the parser the failure line uses
(d2ops_core.platform.parse_quota_refusal) reads back exactly the quota, its value, the instances in use
and the request.
"""

from __future__ import annotations

import pytest

from d2ops.offline.quotas import AccountQuotas, QuotaExceeded, default_value, quota_code
from d2ops_core.platform import parse_quota_refusal, quota_name


def test_a_new_account_has_no_gpu_spot_training_but_can_run_the_stack_defaults() -> None:
    quotas = AccountQuotas()
    assert quotas.value("ml.g4dn.xlarge for spot training job usage") == 0
    assert quotas.value("ml.p4d.24xlarge for spot training job usage") == 0
    assert quotas.value("ml.m5.xlarge for spot training job usage") > 0  # CPU spot is not the trap
    for usage in ("training", "processing"):
        assert default_value("ml.g4dn.xlarge", usage) >= 1
    assert default_value("ml.g4dn.xlarge", "endpoint") >= 2  # blue/green holds the old and the new fleet


def test_overrides_by_name_and_refusals_in_sagemakers_words() -> None:
    quotas = AccountQuotas({"ml.g5.xlarge for endpoint usage": 2})
    quotas.check("ml.g5.xlarge", "endpoint", requested=1, used=1)  # exactly at the quota: allowed
    with pytest.raises(QuotaExceeded) as refused:
        quotas.check("ml.g5.xlarge", "endpoint", requested=1, used=2)
    assert refused.value.code == "ResourceLimitExceeded" and refused.value.status == 400
    parsed = parse_quota_refusal(refused.value.message)
    assert parsed is not None
    assert (parsed.name, parsed.value, parsed.used, parsed.requested) == ("ml.g5.xlarge for endpoint usage", 2, 2, 1)


def test_a_misspelt_override_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match="not a SageMaker quota name"):
        AccountQuotas({"g4dn.xlarge spot training": 1})
    with pytest.raises(ValueError, match="negative"):
        AccountQuotas({quota_name("ml.g4dn.xlarge", "training"): -1})


def test_the_listing_covers_every_usage_of_the_instance_types_with_stable_codes() -> None:
    quotas = AccountQuotas({"ml.c5.xlarge for processing job usage": 3})
    listed = {q.name: q for q in quotas.listed(["ml.g4dn.xlarge"])}
    usages = ("training", "spot training", "processing", "endpoint")
    extra = "ml.c5.xlarge for processing job usage"
    assert set(listed) == {quota_name("ml.g4dn.xlarge", u) for u in usages} | {extra}
    assert listed[extra].value == 3
    spot = "ml.g4dn.xlarge for spot training job usage"
    assert listed[spot].code == quota_code(spot)
    assert len({q.code for q in listed.values()}) == len(listed)
