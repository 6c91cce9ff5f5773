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
    FAILURE_RECORDS,
    FRAMES,
    LOOPS,
    STAGES,
    all_states,
    definition_states,
    expected_miss,
    loop_of,
    miss_settled,
    stage_of,
)

REPO = Path(__file__).resolve().parents[2]
DEFINITION: dict[str, Any] = json.loads((REPO / "statemachine" / "training_pipeline.asl.json").read_text())


STATES = all_states(DEFINITION)

# The stages people see, in their order: the one pin of them (test_stage_timeline reads it too). A new stage is
# one key here.
STAGE_KEYS = ["validate", "prepare", "train", "evaluate", "gate", "deploy", "notify", "failure"]


def _targets(state: dict[str, Any]) -> set[str]:
    found = {state[k] for k in ("Next", "Default") if k in state}
    found |= {c["Next"] for c in state.get("Choices", [])} | {c["Next"] for c in state.get("Catch", [])}
    return found


def test_every_state_of_the_definition_is_in_exactly_one_stage() -> None:
    staged = Counter(name for stage in STAGES for name in (*stage.frame, *stage.states))
    assert [name for name, n in staged.items() if n > 1] == []
    assert sorted(set(STATES) - set(staged)) == []  # a new state must be given a stage
    assert sorted(set(staged) - set(STATES)) == []  # a renamed or removed state must leave its stage
    assert sorted(definition_states(DEFINITION)) == sorted(STATES)
    assert len({s.key for s in STAGES}) == len(STAGES)
    assert [s.key for s in STAGES] == STAGE_KEYS


def test_stage_of_names_the_state_it_does_not_know() -> None:
    assert stage_of("Find current endpoint").key == "deploy"
    assert stage_of("Check image batch").key == "validate"  # inside the Map's item processor
    with pytest.raises(KeyError, match="'No such state' is in no stage"):
        stage_of("No such state")


def test_the_failure_stage_holds_every_fail_state_but_the_notifications_own() -> None:
    fails = {name for name, s in STATES.items() if s["Type"] == "Fail"} - {"Notification failed"}
    assert fails and all(stage_of(n).key == "failure" for n in fails)
    assert stage_of("Run succeeded").key == "notify" and stage_of("Notification failed").key == "notify"


def _branch_states(branch: dict[str, Any]) -> set[str]:
    return set(definition_states(branch))


def test_the_top_level_is_the_stages_each_a_parallel_holding_exactly_its_states() -> None:
    top = DEFINITION["States"]
    assert list(top) == [name for stage in STAGES for name in stage.frame]
    assert DEFINITION["StartAt"] == STAGES[0].title
    for i, stage in enumerate(STAGES):
        parallel = top[stage.title]
        assert parallel["Type"] == "Parallel" and len(parallel["Branches"]) == 1, stage.title
        assert _branch_states(parallel["Branches"][0]) == set(stage.states), stage.title
        assert parallel["OutputPath"] == "$[0]"  # the branch's document passes on as if written inline
        assert "Catch" not in parallel and "Retry" not in parallel  # errors are the branch's to handle
        if len(stage.frame) == 1:  # the last stage of either ending: the run ends with it
            assert parallel.get("End") is True and stage.key in ("notify", "failure")
            continue
        then = top[stage.frame[1]]
        assert parallel["Next"] == stage.frame[1] and then["Type"] == "Choice"
        assert then["Choices"] == [{"Variable": "$.failure", "IsPresent": True, "Next": "Report failure"}]
        assert then["Default"] == STAGES[i + 1].title
    assert {name for stage in STAGES for name in stage.frame} == FRAMES


def test_the_failure_records_are_the_states_writing_the_failure_document() -> None:
    writers = {name for name, s in STATES.items() if s.get("ResultPath") == "$.failure"}
    assert writers == FAILURE_RECORDS
    # a record ends its stage (or hands over to the rollback's history entry, which ends it)
    for name in writers:
        state = STATES[name]
        assert state.get("End") is True or STATES[state["Next"]].get("End") is True, name


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


def test_a_miss_is_settled_once_the_run_recovers_records_a_failure_or_leaves_the_stage() -> None:
    lookup = "Find current endpoint"
    assert not miss_settled(lookup, []) and not miss_settled(lookup, ["Endpoint missing?"])
    assert miss_settled(lookup, ["Endpoint missing?", "Create endpoint"])  # recovered
    assert miss_settled(lookup, ["Endpoint missing?", "Endpoint lookup failed", "Record deployment failure"])
    assert miss_settled(lookup, ["Deployed?"]) is False  # the stage's own frame: still in the stage
    assert miss_settled(lookup, ["Failure explained?"]) and miss_settled(lookup, ["A state of a newer definition"])


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
