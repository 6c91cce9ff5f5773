"""Fail fast, say why (issue 20): a refusal that cannot pass ends the run within a minute with one line
saying what to do; throttling and internal errors keep a bounded retry budget.

The optimised SageMaker integration keeps the names of the errors SageMaker models (a name in use is
``SageMaker.ResourceInUseException``, a quota ``SageMaker.ResourceLimitExceededException``) and reports
the rest (throttling, 5xx, validation, access) as ``SageMaker.AmazonSageMakerException`` with the code
only in the Cause; a lost answer is ``SageMaker.SdkClientException``. A Retry matches names only, so the
``.sync`` creates have no Retry: their Catch leads to Choices (a name in use: the job the first attempt
started; throttling, internal, 5xx or a lost answer: a counted Wait and the create again; anything else,
a quota included: the failure record at once). The other SageMaker creates and updates keep a
Retry, held here under a budget a quota refusal can afford.

The runs use the Step Functions Local mock cases (tests/fixtures/pipeline/training_pipeline.mock.json)
on the interpreter's virtual clock: a Wait or a retry back-off shows in the history's timestamps as the
time it would take, so "within a minute" is measured on the execution's own clock. The real handlers of
describe_failure and compose_notification write the line. The offline runtime's version, with its
quota-refusing SageMaker, is tests/integration/test_offline_fail_fast.py.
"""

from __future__ import annotations

import json
import random
from datetime import datetime
from typing import Any

import pytest

from d2ops import aws_contract
from d2ops import template as sam
from d2ops.asl.choice import evaluate_rule
from d2ops.asl.interpreter import Execution
from d2ops_core.failures import QUOTA_STACK_PARAMETERS, describe, refusal
from d2ops_core.pipeline_stages import all_states
from d2ops_core.platform import quota_refusal_message
from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import entered_states, run_case, task_parameters

STATES: dict[str, dict[str, Any]] = all_states(json.loads(support.DEFINITION.read_text()))
SYNC = {"training": "Train model", "evaluation": "Evaluate challenger and champion"}
# What a quota, validation or access refusal may cost before the run fails: "within a minute", less the
# failure-describing and notifying steps after it.
REFUSAL_BUDGET_SECONDS = 45
JAVA = "(Service: AmazonSageMaker; Status Code: {status}; Error Code: {code}; Request ID: 5e3c1a0b; Proxy: null)"
QUOTA = quota_refusal_message("ml.g4dn.xlarge for spot training job usage", 0, 0, 2)
CAUSES = {
    "quota": f"{QUOTA} {JAVA.format(status=400, code='ResourceLimitExceeded')}",
    "invalid": ("1 validation error detected: Value 'x' at 'roleArn' failed "
                + JAVA.format(status=400, code="ValidationException")),
    "denied": ("User: arn:aws:sts::123456789012:assumed-role/d2ops-StateMachineRole-AB12/s is not authorized to "
               "perform: iam:PassRole on resource: arn:aws:iam::123456789012:role/d2ops-TrainingJobRole-CD34 "
               + JAVA.format(status=400, code="AccessDeniedException")),
    "throttled": f"Rate exceeded {JAVA.format(status=400, code='ThrottlingException')}",
    "internal": f"We encountered an internal error. {JAVA.format(status=500, code='InternalFailure')}",
    "unavailable": f"Service Unavailable {JAVA.format(status=503, code='ServiceUnavailable')}",
    "lost": "Unable to execute HTTP request: Read timed out",
}
TRANSIENT = {"throttled", "internal", "unavailable", "lost"}
# The names the optimised integration gives them where not SageMaker.AmazonSageMakerException: a modelled error
# keeps its own, a lost answer is the SDK's client error.
ERRORS = {"quota": "SageMaker.ResourceLimitExceededException", "lost": "SageMaker.SdkClientException"}


def _route(state: str, data: dict[str, Any]) -> str:
    choice = STATES[state]
    return next((rule["Next"] for rule in choice["Choices"] if evaluate_rule(rule, data, {})), choice["Default"])


def _when(event: dict[str, Any]) -> datetime:
    stamp = event["timestamp"]
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else stamp


def _seconds(execution: Execution, first: str) -> float:
    """From the first time ``first`` was entered to the end of the execution, on the execution's clock."""
    start = next(e for e in execution.history if e["type"].endswith("StateEntered")
                 and e["stateEnteredEventDetails"]["name"] == first)
    return (_when(execution.history[-1]) - _when(start)).total_seconds()


# ------------------------------------------------------------------------- the definition
@pytest.mark.parametrize("kind", SYNC)
def test_a_refused_sync_create_is_routed_by_the_code_in_its_cause(kind: str) -> None:
    catch = STATES[SYNC[kind]]["Catch"][0]
    assert "Retry" not in STATES[SYNC[kind]]
    failure = STATES[SYNC[kind]]["Catch"][-1]["Next"]
    retry, left = f"Retry creating {kind} job?", f"{kind.capitalize()} job creation retries left?"
    for name, cause in CAUSES.items():
        error = ERRORS.get(name, "SageMaker.AmazonSageMakerException")
        routed = (_route(retry, {"error": {"Error": error, "Cause": cause}}) if error in catch["ErrorEquals"]
                  else failure)  # not the first Catch's: States.ALL, the failure record
        assert routed == (left if name in TRANSIENT else failure), name
    # The name taken by the job a lost answer's first attempt started is still waited for.
    taken = {"error": {"Error": "SageMaker.ResourceInUseException",
                       "Cause": f"Job name must be unique {JAVA.format(status=400, code='ResourceInUse')}"}}
    assert "SageMaker.ResourceInUseException" in catch["ErrorEquals"]
    assert _route(catch["Next"], taken).startswith("Start waiting for created")
    # The old catch-all name with ResourceInUse in its Cause is not SageMaker's way of saying so any more.
    assert _route(catch["Next"], {"error": {**taken["error"], "Error": "SageMaker.AmazonSageMakerException"}}) == retry


@pytest.mark.parametrize("kind", SYNC)
def test_the_sync_create_retry_loop_is_bounded_in_tries_and_time(kind: str) -> None:
    """Walk the loop as the interpreter would: tries and total wait both bounded, neither trivial."""
    left = f"{kind.capitalize()} job creation retries left?"
    start, count = f"Start retrying {kind} job creation", f"Count {kind} job creation retry"
    key = STATES[start]["ResultPath"].removeprefix("$.")
    data: dict[str, Any] = {}
    waits: list[float] = []
    while (routed := _route(left, data)) != STATES[left]["Default"]:
        if routed == start:
            data[key] = dict(STATES[start]["Result"])
        assert STATES[routed]["Type"] == "Wait" or STATES[routed]["Next"].startswith("Wait")
        waits.append(data[key]["seconds"])
        data[key] = {"attempts": data[key]["attempts"] + 1, "seconds": 2 * data[key]["seconds"]}
        assert "MathAdd" in json.dumps(STATES[count]["Parameters"]) and STATES[count]["Next"] == SYNC[kind]
        assert len(waits) < 50, "unbounded"
    assert 3 <= len(waits) <= 8 and 60 <= sum(waits) <= 900, waits


def _worst_delays(retrier: dict[str, Any]) -> float:
    delay, total = float(retrier.get("IntervalSeconds", 1)), 0.0
    for _ in range(int(retrier.get("MaxAttempts", 3))):
        total += min(delay, float(retrier.get("MaxDelaySeconds", delay)))
        delay *= float(retrier.get("BackoffRate", 2))
    return total


def creates_and_updates() -> dict[str, dict[str, Any]]:
    return {name: state for name, state in STATES.items() if state["Type"] == "Task" and ":sagemaker:" in
            state["Resource"] and state["Resource"].rsplit(":", 1)[1].startswith(("create", "update"))}


def test_every_sagemaker_create_or_update_gives_up_on_a_refusal_within_the_budget() -> None:
    states = creates_and_updates()
    assert {"Register model version", "Create model", "Create endpoint config", "Create endpoint",
            "Update endpoint (blue/green)", "Roll back endpoint"} <= set(states)
    for name, state in states.items():
        integration = aws_contract.parse_resource(state["Resource"].replace("${Partition}", "aws"))
        for retrier in state.get("Retry", []):
            # The names a quota, validation or access refusal can have here (aws-sdk: unmodelled errors are
            # SageMaker.SageMakerException; optimised: everything is SageMaker.AmazonSageMakerException).
            refusals = {e for e in retrier["ErrorEquals"] if e in aws_contract.possible_errors(integration)
                        and e.endswith(("SageMakerException", "ResourceLimitExceededException"))}
            if refusals or "States.ALL" in retrier["ErrorEquals"]:
                assert _worst_delays(retrier) <= REFUSAL_BUDGET_SECONDS, (name, retrier)
                assert retrier["MaxAttempts"] >= 2, (name, "throttling keeps a retry budget")
            assert "SageMaker.ResourceLimitExceededException" not in retrier["ErrorEquals"], name


def test_the_quota_line_names_stack_parameters_the_template_has() -> None:
    parameters = set(sam.load_template().document["Parameters"])
    for hint in QUOTA_STACK_PARAMETERS.values():
        named = {word.split("=")[0] for word in hint.replace(",", " ").split() if word[:1].isupper()}
        assert named and named <= parameters, hint


# ---------------------------------------------------------------------------- the lines
def test_a_quota_refusal_says_which_quota_its_value_the_request_and_how_to_raise_it() -> None:
    line = describe("training job j failed (SageMaker.ResourceLimitExceededException)", CAUSES["quota"],
                    error="SageMaker.ResourceLimitExceededException")
    # Not "failed": SageMaker refused the create, so there is no such job.
    assert line.startswith("SageMaker refused to create training job j: quota 'ml.g4dn.xlarge for spot training job "
                           "usage' is 0 instances (0 in use, this run asked for 2)")
    assert "UseSpotTraining=false" in line and "TrainingInstanceType" in line
    # list-aws-default-service-quotas lists unchanged quotas too (list-service-quotas only changed ones)
    assert "aws service-quotas list-aws-default-service-quotas --service-code sagemaker" in line
    assert "request-service-quota-increase --service-code sagemaker --quota-code CODE --desired-value 2" in line
    assert "Request ID" not in line and "AmazonSageMakerException" not in line


def test_an_access_refusal_names_the_role_and_what_it_lacks() -> None:
    line = refusal("SageMaker.AmazonSageMakerException", CAUSES["denied"])
    assert line == ("role d2ops-StateMachineRole-AB12 lacks iam:PassRole on "
                    "arn:aws:iam::123456789012:role/d2ops-TrainingJobRole-CD34: add it to that role's policy "
                    "(template.yaml) and redeploy")


def test_an_invalid_request_gets_sagemakers_message_without_the_sdk_tail() -> None:
    assert refusal(None, CAUSES["invalid"]) == ("SageMaker refused the request as invalid: 1 validation error "
                                                "detected: Value 'x' at 'roleArn' failed")
    aws_sdk = "Could not find model package arn:x (Service: SageMaker, Status Code: 400, Request ID: abc)"
    assert refusal("SageMaker.SageMakerException", aws_sdk) is None  # not known to be a refusal: reason() says it


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_errors_that_may_pass_are_not_described_as_refusals(name: str) -> None:
    assert refusal("SageMaker.AmazonSageMakerException", CAUSES[name]) is None


# ------------------------------------------------------------------------------- the runs
def test_a_spot_quota_of_zero_ends_the_run_at_once_with_the_quota_line() -> None:
    ex = run_case("TrainingSpotQuotaRefused")
    assert (ex.status, ex.error) == ("FAILED", "TrainingFailed")
    assert len(task_parameters(ex, "Train model")) == 1  # never sent again
    states = entered_states(ex)
    assert not any(STATES[s]["Type"] == "Wait" for s in states), states
    assert _seconds(ex, "Train model") < 60
    assert ex.cause.startswith("SageMaker refused to create training job shapes-v1-bf3cc289798108cc-train: quota "
                               "'ml.g4dn.xlarge for spot training job usage' is 0 instances (0 in use, this run asked "
                               "for 2): set UseSpotTraining=false")
    assert "Traceback" not in ex.cause and len(ex.cause) <= 500


def test_an_invalid_evaluation_request_ends_the_run_at_once_with_sagemakers_message() -> None:
    ex = run_case("EvaluationRefusedAsInvalid")
    assert (ex.status, ex.error) == ("FAILED", "EvaluationFailed")
    assert len(task_parameters(ex, "Evaluate challenger and champion")) == 1
    assert _seconds(ex, "Evaluate challenger and champion") < 60
    assert "SageMaker refused the request as invalid: 1 validation error detected: Value 'ml.g4dn.mega'" in ex.cause


def test_throttling_is_retried_with_growing_waits_then_trains() -> None:
    ex = run_case("TrainingThrottledThenSucceeds")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    waits = [e for e in ex.history if e["type"] == "WaitStateEntered"
             and e["stateEnteredEventDetails"]["name"] == "Wait to retry creating training job"]
    assert len(waits) == 2 and len(task_parameters(ex, "Train model")) == 3
    seconds = [json.loads(w["stateEnteredEventDetails"]["input"])["training_create_retry"]["seconds"] for w in waits]
    assert seconds[1] == 2 * seconds[0]


def test_throttling_past_the_budget_fails_the_run_with_the_last_refusal() -> None:
    ex = run_case("TrainingThrottledPastBudget")
    assert (ex.status, ex.error) == ("FAILED", "TrainingFailed")
    tries = len(task_parameters(ex, "Train model"))
    assert tries == 1 + STATES["Training job creation retries left?"]["Choices"][1]["NumericLessThan"]
    assert "Rate exceeded" in ex.cause
    assert 60 <= _seconds(ex, "Train model") <= 900  # waited, but not for an hour


class _LongestJitter(random.Random):
    """Full jitter at its longest: the worst case of every retry back-off."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_an_endpoint_quota_refusal_ends_the_run_within_a_minute_even_with_the_longest_back_offs() -> None:
    ex = run_case("EndpointQuotaRefused", rng=_LongestJitter(0))
    assert (ex.status, ex.error) == ("FAILED", "DeploymentFailed")
    # Sent once: the quota keeps its own name (SageMaker.ResourceLimitExceededException), which no Retry names.
    assert len(task_parameters(ex, "Create endpoint")) == 1
    assert _seconds(ex, "Create endpoint") < 60
    assert "quota 'ml.g4dn.xlarge for endpoint usage' is 0 instances" in ex.cause
    assert "another EndpointInstanceType or a smaller EndpointInstanceCount" in ex.cause
