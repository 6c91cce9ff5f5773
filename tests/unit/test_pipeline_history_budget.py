"""The longest run the stack's limits allow fits Step Functions' 25,000-event execution history.

Past the limit AWS fails the execution with States.Runtime, which no Catch sees: no notification, a
lease left to the release function. So every loop's largest pass count (the template parameter's
MaxValue, the prepare step's pydantic bound, or the literal in the ASL), times the events of its
most expensive pass, plus every state once with all its retries, must stay under the limit. "Every
state" is every depth of the definition: the stages' Parallel frames (Entered, Started, Succeeded,
Exited) and the routing Choices after them (Entered, Exited) write events of their own.

Events per state come from the embedded interpreter (tests/unit/test_asl_history.py holds it to
AWS's GetExecutionHistory shape), measured on one-state machines, not typed in here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from d2ops import template as sam
from d2ops.asl import StateMachine, TaskContext, TaskFailed, TaskTokens
from d2ops_core.pipeline_stages import FRAMES, all_states
from tests.fixtures.pipeline import support

HISTORY_LIMIT = 25_000  # Step Functions quota: events in one execution's history
STATES: dict[str, dict[str, Any]] = all_states(json.loads(support.DEFINITION.read_text()))


def _events_of(original: dict[str, Any], *, fail_first: bool = False) -> int:
    """History events one visit of a state writes (Entered .. Exited), run alone in the interpreter."""
    # The state's kind is what decides its events; its paths and parameters would need a real input.
    state: dict[str, Any] = {"Type": original["Type"]}
    if "Resource" in original:
        state["Resource"] = original["Resource"].replace("${Partition}", "aws")
    if state["Type"] in ("Succeed", "Fail"):
        ended = StateMachine.from_definition({"StartAt": "S", "States": {"S": state}}, name="Budget").run({})
        return len(ended.history) - 2  # ExecutionStarted, ExecutionSucceeded/Failed
    if state["Type"] == "Choice":
        state.update(Choices=[{"Variable": "$.x", "IsPresent": True, "Next": "Done"}], Default="Done")
    elif state["Type"] == "Wait":
        state = {"Type": "Wait", "Seconds": 1, "Next": "Done"}
    elif state["Type"] == "Map":
        # A Distributed Map's children are executions of their own: the parent's history holds the Map
        # state's and the Map Run's events, however many items and retries the children have.
        state = {"Type": "Map", "ItemsPath": "$.items", "Next": "Done",
                 "ItemProcessor": {"ProcessorConfig": {"Mode": original["ItemProcessor"]["ProcessorConfig"]["Mode"],
                                                       "ExecutionType": "EXPRESS"},
                                   "StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}}
    elif state["Type"] == "Parallel":
        # A stage's frame: its branch's own states are counted where they are visited, so the branch here is
        # one Pass, taken off again below.
        state = {"Type": "Parallel", "Next": "Done",
                 "Branches": [{"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}]}
    elif state["Type"] == "Task":
        state = {"Type": "Task", "Resource": state["Resource"], "Next": "Done"}
        if fail_first:
            state["Retry"] = [{"ErrorEquals": ["Boom"], "IntervalSeconds": 1, "MaxAttempts": 1}]
    else:
        state["Next"] = "Done"
    calls: list[str] = []
    tokens = TaskTokens()

    def service(resource: str, parameters: Any, context: TaskContext) -> Any:
        calls.append(resource)
        if fail_first and len(calls) == 1:
            raise TaskFailed("Boom", "first attempt fails")
        if resource.endswith(".sync"):
            context.submitted({})
        if resource.endswith(".waitForTaskToken"):  # the callback (a person's decision) comes at once
            assert context.task_token is not None
            tokens.succeed(context.task_token, {})
        return {}

    machine = StateMachine.from_definition({"StartAt": "S", "States": {"S": state, "Done": {"Type": "Succeed"}}},
                                           name="Budget")
    execution = machine.run({"x": 1, "items": [1, 2]}, executors={"arn:*": service}, execution_name="budget",
                            callbacks=tokens)
    assert execution.status == "SUCCEEDED", (state, execution.cause)
    branch = events_per_visit({"Type": "Pass"}) if state["Type"] == "Parallel" else 0
    return len(execution.history) - 4 - branch  # ExecutionStarted, Succeed entered/exited, ExecutionSucceeded


_MEASURED: dict[str, int] = {}


def events_per_visit(state: dict[str, Any]) -> int:
    kind = state.get("Resource", state["Type"])  # each integration measured on its own
    if kind not in _MEASURED:
        _MEASURED[kind] = _events_of(state)
    return _MEASURED[kind]


def events_per_retry() -> int:
    if "retry" not in _MEASURED:
        task = {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:getItem"}
        _MEASURED["retry"] = _events_of(task, fail_first=True) - _events_of(task)
    return _MEASURED["retry"]


def successors(state: dict[str, Any]) -> set[str]:
    targets = {state.get("Next"), state.get("Default")}
    targets |= {rule.get("Next") for rule in state.get("Choices", [])}
    targets |= {catcher["Next"] for catcher in state.get("Catch", [])}
    return {t for t in targets if t}


def _reachable(start: str, step: Any) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles_through(start: str) -> Iterator[list[str]]:
    """Every simple cycle of the definition's top level that passes through ``start``."""
    predecessors: dict[str, set[str]] = {}
    for name, state in STATES.items():
        for nxt in successors(state):
            predecessors.setdefault(nxt, set()).add(name)
    # Only states on some way back to ``start`` can be on a cycle through it.
    component = (_reachable(start, lambda s: successors(STATES[s]))
                 & _reachable(start, lambda s: predecessors.get(s, ())))

    def walk(path: list[str]) -> Iterator[list[str]]:
        for nxt in sorted(successors(STATES[path[-1]]) & component):
            if nxt == start:
                yield path
            elif nxt not in path:
                yield from walk([*path, nxt])
    yield from walk([start])


def comparisons(rule: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield rule
    for key in ("And", "Or"):
        for sub in rule.get(key, []):
            yield from comparisons(sub)
    if "Not" in rule:
        yield from comparisons(rule["Not"])


def _prepare_bound(field: str) -> int:
    support.function_path("prepare_training")
    from prepare_training.models import PrepareSettings

    (le,) = [m.le for m in PrepareSettings.model_fields[field].metadata if getattr(m, "le", None) is not None]
    return int(le)


def _parameter_max(name: str) -> int:
    return int(sam.load_template().document["Parameters"][name]["MaxValue"])


# Where each counter's largest value is set: a stack parameter or a prepare-step field.
COUNTER_BOUNDS = {
    "$.lease_wait.max_waits": lambda: _parameter_max("LeaseMaxWaits"),
    "$.plan.endpoint.max_wait_attempts": lambda: _prepare_bound("endpoint_max_wait_attempts"),
}


def loop_bound(cycle: tuple[str, ...]) -> int:
    """Most passes the loop's counter allows: the Choice comparison of a counter on the way round."""
    bounds = []
    for name in cycle:
        for rule in STATES[name].get("Choices", []):
            for c in comparisons(rule):
                if "NumericLessThan" in c:
                    bounds.append(int(c["NumericLessThan"]))
                for key in ("NumericLessThanPath", "NumericGreaterThanEqualsPath"):
                    if key in c:
                        bounds.append(COUNTER_BOUNDS[c[key]]())
    assert bounds, f"the loop {cycle} has no counter: unbounded history"
    return min(bounds)


@functools.cache
def loop_shapes() -> dict[str, tuple[tuple[str, ...], ...]]:
    """Wait state -> the simple cycles through it (the definition's loops that wait)."""
    return {name: tuple(tuple(c) for c in cycles_through(name))
            for name, state in STATES.items() if state["Type"] == "Wait"}


def wait_loops() -> dict[str, tuple[int, int]]:
    """Wait state -> (most passes, events of its most expensive pass)."""
    loops = {}
    for name, cycles in loop_shapes().items():
        if not cycles:
            continue
        passes = min(loop_bound(c) for c in cycles)
        loops[name] = (passes, max(sum(events_per_visit(STATES[s]) for s in c) for c in cycles))
    return loops


def straight_path() -> int:
    """Every state once, each with all its retries spent once: more than any path without loops writes.
    The stages' frames are among them: a run enters each stage's Parallel once at most (the top level has no loop)."""
    total = 2  # ExecutionStarted, ExecutionSucceeded/Failed
    for state in STATES.values():
        total += events_per_visit(state)
        total += sum(int(r.get("MaxAttempts", 3)) for r in state.get("Retry", [])) * events_per_retry()
    return total


def test_event_costs_are_measured_from_the_interpreter() -> None:
    # Guards the measurement: a Pass writes entered/exited; a task at least scheduled/started/succeeded too.
    assert events_per_visit({"Type": "Pass"}) == 2
    assert events_per_visit({"Type": "Task", "Resource": "arn:aws:states:::dynamodb:getItem"}) >= 5
    assert events_per_visit({"Type": "Task", "Resource": "arn:aws:states:::sagemaker:createTrainingJob.sync"}) >= 6
    assert events_per_retry() >= 3  # failed, scheduled, started
    # A stage's frame, its branch's states left out: ParallelStateEntered, Started, Succeeded, Exited.
    assert events_per_visit({"Type": "Parallel"}) == 4
    assert events_per_visit({"Type": "Choice"}) == 2


def test_every_wait_loop_of_the_pipeline_is_found_and_bounded() -> None:
    loops = wait_loops()
    assert set(loops) == {"Wait for endpoint lease", "Wait for created training job", "Wait for created evaluation job",
                          "Wait to retry creating training job", "Wait to retry creating evaluation job",
                          "Wait for endpoint", "Wait for rollback"}, sorted(loops)
    for name, (passes, events) in loops.items():
        assert passes >= 1 and events >= 8, name


def worst_case_events() -> tuple[int, dict[str, int]]:
    """Events of the longest run the limits allow, and each loop's share.

    One run can go through every loop: wait for the lease, have the CreateTrainingJob and the
    CreateProcessingJob throttled and their answers lost, wait for the endpoint, fail the smoke test
    and wait for the rollback. The last check after the last wait is one more pass.
    """
    in_loops = {name: (passes + 1) * events for name, (passes, events) in wait_loops().items()}
    return straight_path() + sum(in_loops.values()), in_loops


def test_the_longest_run_the_limits_allow_fits_the_execution_history() -> None:
    # The frames are counted once (straight_path): no way leads back into a stage.
    assert set(STATES) >= FRAMES and not any(next(cycles_through(frame), None) for frame in FRAMES)
    total, in_loops = worst_case_events()
    assert total < HISTORY_LIMIT, f"{total} events at the limits' maximums: {in_loops}, straight {straight_path()}"


def test_the_budget_sees_the_bounds_where_the_stack_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # The maximums before this test existed (LeaseMaxWaits 1000, endpoint_max_wait_attempts 1000) overflow.
    for counter in COUNTER_BOUNDS:
        monkeypatch.setitem(COUNTER_BOUNDS, counter, lambda: 1000)
    total, _ = worst_case_events()
    assert total > HISTORY_LIMIT
