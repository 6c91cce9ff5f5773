"""The canary deployment's contract across template.yaml, the definition and the offline endpoint.

The path tests (test_pipeline_paths.py) run the canary's branches; these check the numbers and
names that must agree: the alarms SageMaker watches, the permissions to read and trip them,
the wait budgets against SageMaker's own limits, and the offline traffic split.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from d2ops import template as sam
from d2ops.offline.errors import ApiError
from d2ops.offline.services.sagemaker_endpoints import _Canary, traffic_share
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
support.function_path("smoke_test_endpoint")
from prepare_training.models import PrepareSettings, TrafficRoutingConfig  # noqa: E402
from prepare_training.service import traffic_routing  # noqa: E402
from smoke_test_endpoint.models import SmokeTestEvent  # noqa: E402

TEMPLATE = sam.load_template()
STATES = all_states(json.loads(support.DEFINITION.read_text()))
UPDATE = STATES["Update endpoint (blue/green)"]["Parameters"]
POLICY = UPDATE["DeploymentConfig"]["BlueGreenUpdatePolicy"]
# The endpoint instance counts the stack allows (PrepareSettings.endpoint_instance_count).
INSTANCE_COUNTS = range(1, 11)
ROUTINGS = {n: traffic_routing(n) for n in INSTANCE_COUNTS}


def _statements(logical_id: str) -> list[dict[str, Any]]:
    props = TEMPLATE.resource(logical_id)["Properties"]
    policies = props.get("Policies") or []
    return [s for p in policies if isinstance(p, dict)
            for s in (p.get("Statement") or (p.get("PolicyDocument") or {}).get("Statement") or [])]


def _granting(logical_id: str, action: str) -> list[dict[str, Any]]:
    return [s for s in _statements(logical_id) if action in ([s["Action"]] if isinstance(s["Action"], str)
                                                             else s["Action"])]


def test_the_update_takes_the_plans_traffic_routing_through_the_sdk_integration() -> None:
    # The optimised sagemaker:updateEndpoint integration does not list DeploymentConfig.
    assert STATES["Update endpoint (blue/green)"]["Resource"].endswith(":states:::aws-sdk:sagemaker:updateEndpoint")
    assert POLICY["TrafficRoutingConfiguration.$"] == "$.plan.endpoint.traffic_routing"
    fields = PrepareSettings.model_fields["endpoint_instance_count"].metadata
    assert (min(INSTANCE_COUNTS), max(INSTANCE_COUNTS)) == (fields[0].ge, fields[1].le)


def test_one_instance_deploys_all_at_once_and_more_a_quarter_canary() -> None:
    assert ROUTINGS[1].model_dump() == {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600}  # no CanarySize key
    for n in INSTANCE_COUNTS[1:]:
        assert ROUTINGS[n].model_dump() == {"Type": "CANARY", "WaitIntervalInSeconds": 600,
                                            "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}}, n


@pytest.mark.parametrize("instances", INSTANCE_COUNTS)
def test_every_planned_routing_is_one_sagemaker_accepts(instances: int) -> None:
    """The offline SageMaker refuses what SageMaker's TrafficRoutingConfig documents it refuses (a
    CanarySize over 50 % of the variant's instances): the default one-instance stack's plan passes."""
    routing = ROUTINGS[instances].model_dump()
    assert 0 < traffic_share(routing, instances) <= 1
    TrafficRoutingConfig.model_validate(routing)  # and reads back as written


def test_the_old_fixed_canary_is_refused_on_the_default_one_instance_endpoint() -> None:
    assert PrepareSettings.model_fields["endpoint_instance_count"].default == 1
    with pytest.raises(ApiError, match=r"less than or equal to 50% of the variant's total instance count") as err:
        traffic_share({"Type": "CANARY", "WaitIntervalInSeconds": 600,
                       "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}}, 1)
    assert err.value.code == "ValidationException"


def test_the_smoke_test_reaches_the_new_fleet_with_overwhelming_probability() -> None:
    """During a CANARY's bake the requests split by the canary share; ALL_AT_ONCE sends them all."""
    requests = STATES["Smoke test endpoint"]["Parameters"]["Payload"]["requests"]
    assert requests <= SmokeTestEvent.model_fields["requests"].metadata[-1].le
    for n, routing in ROUTINGS.items():
        share = traffic_share(routing.model_dump(), n)
        assert (1 - share) ** requests < 0.002, n


def test_wait_budgets_cover_sagemakers_own_limits() -> None:
    """Deployment: poll budget >= MaximumExecutionTimeoutInSeconds, after which SageMaker rolls back by
    itself; the rollback gets a budget of its own. The bake outlasts a poll and the smoke test."""
    fields = PrepareSettings.model_fields
    poll = int(fields["endpoint_poll_seconds"].default)
    budget = poll * int(fields["endpoint_max_wait_attempts"].default)
    smoke_seconds = STATES["Smoke test endpoint"]["TimeoutSeconds"]
    for routing in ROUTINGS.values():
        assert budget >= POLICY["MaximumExecutionTimeoutInSeconds"] >= routing.WaitIntervalInSeconds + \
            POLICY["TerminationWaitInSeconds"]
        assert routing.WaitIntervalInSeconds >= 2 * poll + smoke_seconds
    rolled_back = STATES["Rolled back?"]["Choices"][1]["And"][1]
    assert rolled_back["NumericLessThanPath"] == "$.plan.endpoint.max_wait_attempts"


def test_every_rollback_alarm_exists_is_readable_by_sagemaker_and_the_smoke_alarm_is_trippable() -> None:
    substitutions = support.substitutions()
    names = [a["AlarmName"] for a in UPDATE["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    logical = [n.removeprefix("${").removesuffix("Name}") for n in names]
    assert logical == ["EndpointErrorAlarm", "EndpointLatencyAlarm", "SmokeTestAlarm"]
    for resource in logical:
        assert TEMPLATE.resource(resource)["Type"] == "AWS::CloudWatch::Alarm"
    for role in ("EndpointRole", "PipelineStateMachine"):
        (describe,) = _granting(role, "cloudwatch:DescribeAlarms")
        assert sorted(describe["Resource"], key=str) == sorted(
            [{"Fn::GetAtt": [r, "Arn"]} for r in logical], key=str)
    (trip,) = _granting("PipelineStateMachine", "cloudwatch:SetAlarmState")
    assert trip["Resource"] == {"Fn::GetAtt": ["SmokeTestAlarm", "Arn"]}
    (put,) = _granting("PipelineStateMachine", "cloudwatch:PutMetricData")
    alarm = TEMPLATE.resource("SmokeTestAlarm")["Properties"]
    assert put["Condition"]["StringEquals"]["cloudwatch:namespace"] == alarm["Namespace"]
    # The state machine reports the datapoint the alarm watches.
    assert substitutions["SmokeTestMetricNamespace"] == alarm["Namespace"]
    assert substitutions["SmokeTestMetricName"] == alarm["MetricName"]
    assert [d["Name"] for d in alarm["Dimensions"]] == ["EndpointName"]
    assert STATES["Trip smoke test alarm"]["Parameters"]["AlarmName"] == "${SmokeTestAlarmName}"


def test_the_error_alarm_watches_the_models_5xx_not_client_4xx() -> None:
    alarm = TEMPLATE.resource("EndpointErrorAlarm")["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/SageMaker", "Invocation5XXErrors")
    assert [d["Name"] for d in alarm["Dimensions"]] == ["EndpointName", "VariantName"]


@pytest.mark.parametrize(("routing", "instances", "share"), [
    ({"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}, 1, 1.0),
    ({"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}}, 2, 0.25),
    ({"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 50}}, 3, 0.5),
    ({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}}, 4, 0.25),
    ({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 2}}, 4, 0.5),
])
def test_offline_traffic_share(routing: dict[str, Any], instances: int, share: float) -> None:
    assert traffic_share(routing, instances) == share


@pytest.mark.parametrize(("routing", "instances", "message"), [
    ({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}}, 1, "at most 50%"),
    ({"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 1}}, 1, "at most 50%"),
    ({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 3}}, 4, "3 of the variant's 4"),
    ({"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 60}}, 10, "at most 50%"),
    ({"Type": "CANARY", "CanarySize": {"Type": "PERCENT", "Value": 10}}, 10, "INSTANCE_COUNT or CAPACITY_PERCENT"),
    ({"Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 10}}, 1, "not emulated offline"),
])
def test_offline_refuses_a_canary_sagemaker_would_refuse_or_a_mode_it_does_not_emulate(
        routing: dict[str, Any], instances: int, message: str) -> None:
    with pytest.raises(ApiError, match=message):
        traffic_share(routing, instances)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.1, 1.0])
def test_the_offline_split_gives_the_canary_exactly_its_share_of_every_prefix(share: float) -> None:
    canary = _Canary("new-config", server=None, share=share)  # type: ignore[arg-type]
    taken = [canary.takes_next() for _ in range(40)]
    for n in range(1, 41):
        assert abs(sum(taken[:n]) - n * share) < 1
