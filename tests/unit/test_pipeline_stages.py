"""The stages of d2ops_core.pipeline_stages against the committed state machine: every state in exactly one
stage, the expected misses real Catch routes of the definition, the loops real cycles of it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from d2ops_core.pipeline_stages import (
    EXPECTED_MISSES,
    LOOPS,
    STAGES,
    definition_states,
    expected_miss,
    loop_of,
    stage_of,
)

REPO = Path(__file__).resolve().parents[2]
DEFINITION: dict[str, Any] = json.loads((REPO / "statemachine" / "training_pipeline.asl.json").read_text())


def _all_states(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, state in definition["States"].items():
        found[name] = state
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])):
            if inner:
                found.update(_all_states(inner))
    return found


STATES = _all_states(DEFINITION)


def _targets(state: dict[str, Any]) -> set[str]:
    found = {state[k] for k in ("Next", "Default") if k in state}
    found |= {c["Next"] for c in state.get("Choices", [])} | {c["Next"] for c in state.get("Catch", [])}
    return found


def test_every_state_of_the_definition_is_in_exactly_one_stage() -> None:
    staged = Counter(name for stage in STAGES for name in stage.states)
    assert [name for name, n in staged.items() if n > 1] == []
    assert sorted(set(STATES) - set(staged)) == []  # a new state must be given a stage
    assert sorted(set(staged) - set(STATES)) == []  # a renamed or removed state must leave its stage
    assert sorted(definition_states(DEFINITION)) == sorted(STATES)
    assert len({s.key for s in STAGES}) == len(STAGES)
    assert [s.key for s in STAGES] == ["validate", "prepare", "train", "evaluate", "gate", "deploy", "notify",
                                       "failure"]


def test_stage_of_names_the_state_it_does_not_know() -> None:
    assert stage_of("Find current endpoint").key == "deploy"
    assert stage_of("Check image batch").key == "validate"  # inside the Map's item processor
    with pytest.raises(KeyError, match="'No such state' is in no stage"):
        stage_of("No such state")


def test_the_failure_stage_holds_every_fail_state_and_what_leads_only_there() -> None:
    fails = {name for name, s in STATES.items() if s["Type"] == "Fail"}
    assert fails and all(stage_of(n).key == "failure" for n in fails)
    assert stage_of("Run succeeded").key == "notify"


def test_each_expected_miss_is_a_catch_of_the_definition_whose_route_reaches_the_recovering_state() -> None:
    for miss in EXPECTED_MISSES.values():
        state = STATES[miss.state]
        assert state["Type"] == "Task", miss.state
        routes = [c for c in state.get("Catch", []) if set(c["ErrorEquals"]) == set(miss.errors)]
        assert len(routes) == 1, f"{miss.state}: no Catch on exactly {sorted(miss.errors)}"
        # every recovering state is reachable from the catch's target without passing a failure state
        seen, todo = set(), [routes[0]["Next"]]
        while todo:
            name = todo.pop()
            if name in seen or stage_of(name).key == "failure":
                continue
            seen.add(name)
            todo += _targets(STATES[name])
        assert miss.recovered_by <= seen, (miss.state, miss.recovered_by - seen)


def test_an_expected_miss_is_one_only_when_the_run_recovers() -> None:
    # the first run: no endpoint, so it is created
    miss = expected_miss("Find current endpoint", "SageMaker.SageMakerException",
                         ["Endpoint missing?", "Create endpoint", "Start waiting for endpoint"])
    assert miss is not None and "no endpoint" in miss.meaning
    # the lookup failed for another reason: the run goes to the failure path, and so does its reading
    assert expected_miss("Find current endpoint", "SageMaker.SageMakerException",
                         ["Endpoint missing?", "Endpoint lookup failed", "Record deployment failure"]) is None
    assert expected_miss("Find current endpoint", "States.TaskFailed", ["Record deployment failure"]) is None
    assert expected_miss("Validate dataset", "DatasetNotFound", ["Record unreadable dataset"]) is None
    assert expected_miss("Find current endpoint", "SageMaker.SageMakerException", []) is None


def test_each_loop_is_a_cycle_of_the_definition_through_its_head() -> None:
    for loop in LOOPS:
        assert loop.head in loop.states and loop.states <= set(STATES), loop.title
        # from the head, the states of the loop lead back to the head
        inside = loop.states | ({loop.retries} if loop.retries else set())
        seen, todo, back = set(), list(_targets(STATES[loop.head]) & inside), False
        while todo:
            name = todo.pop()
            if name == loop.head:
                back = True
                continue
            if name in seen:
                continue
            seen.add(name)
            todo += list(_targets(STATES[name]) & inside)
        assert back, f"{loop.title}: no way back to {loop.head} inside the loop"
        assert STATES[loop.head]["Type"] == "Wait"
        assert len({stage_of(n).key for n in inside}) == 1  # a loop stays inside its stage
    assert loop_of("Count endpoint check") is not None and loop_of("Count endpoint check").title == "Wait for endpoint"
    assert loop_of("Smoke test endpoint") is None
