"""The run state document (d2ops_core.documents.run_state) against what the pipeline really writes.

Every path test (tests.fixtures.pipeline.support.run_case, which every case of the Step Functions
Local mock config goes through) checks that each state's output reads as a :class:`RunState`; here one
succeeding and one failing path are read the way the notification and the status API read them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from d2ops_core.documents.run_state import Plan, RunState
from tests.fixtures.pipeline import support

CASES = ["FirstDeployment", "TrainingFailed"]  # the other cases: through run_case in the path tests


def _outputs(case: str) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    execution = support.run_case(case)
    outputs = [(event["stateExitedEventDetails"]["name"], json.loads(event["stateExitedEventDetails"]["output"]))
               for event in execution.history if event["type"].endswith("StateExited")]
    return execution, outputs


@pytest.mark.parametrize("case", CASES)
def test_every_state_output_of_every_path_reads_as_the_run_state(case: str) -> None:
    execution, outputs = _outputs(case)
    assert outputs, case
    for state, output in outputs:
        # Strict here (model_validate, not the readers' section-by-section read): nothing may be left out.
        document = RunState.model_validate(output)
        if "plan" in output:
            assert document.plan is not None and document.plan.names.training_job, (case, state)
        if "failure" in output:
            assert document.failure is not None and document.failure.error, (case, state)
    final = RunState.model_validate(outputs[-1][1])
    assert final.dataset == support.DATASET  # the input's reference survives every path
    if execution.status == "SUCCEEDED":
        assert final.deployment is not None and final.deployment.started_at is not None
        assert final.deployment.started_at.tzinfo is not None
        assert final.champion is not None and final.plan is not None and final.training is not None
    else:
        assert final.failure is not None and final.failure.error == execution.error


def test_the_mocked_plan_is_what_prepare_writes() -> None:
    # The mock config's plan stands in for the prepare Lambda's answer in the path tests.
    plan = Plan.model_validate(support.plan_document())
    assert plan.names.training_job.endswith("-train")


def test_a_malformed_section_is_left_out_saying_where_and_the_rest_reads() -> None:
    document = {"dataset": support.DATASET.model_dump(), "plan": {"names": {"training_job": "t"}},
                "deployment": {"mode": "update", "started_at": "yesterday"}, "failure": "not an object",
                "gate": {"decision": "rejected", "approval_status": "Rejected", "reason": "r"},
                "some_future_section": {"x": 1}}
    state = RunState.read(document)
    assert state.plan is None and state.deployment is None and state.failure is None
    assert state.dataset == support.DATASET and state.gate is not None and state.gate.decision == "rejected"
    assert set(state.unreadable) == {"plan", "deployment", "failure"}
    assert state.unreadable["deployment"].startswith("$.deployment.started_at: ")
    assert state.unreadable["plan"].startswith("$.plan.")
    assert RunState.read("not a document").unreadable == {} and RunState.read(None).plan is None
    with pytest.raises(ValueError, match="started_at"):
        RunState.model_validate(document)


def test_a_naive_deployment_time_is_read_as_utc() -> None:
    state = RunState.read({"deployment": {"mode": "create", "started_at": "2026-01-01T12:00:00"}})
    assert state.deployment is not None and state.deployment.started_at is not None
    assert state.deployment.started_at.utcoffset() is not None and state.deployment.started_at.hour == 12
