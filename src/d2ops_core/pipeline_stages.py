"""The stages a user thinks of a run in, and which of the pipeline's states belong to each.

People read a run as validate -> prepare -> train -> evaluate -> gate -> deploy -> notify (or: its
failure reported), and the definition is written that way: its top level is one Parallel state per
stage, named by the stage's title, each followed by the Choice that goes on or to Report failure,
with the stage's own states (recovery, retry and wait machinery included) inside the branch.
``STAGES`` lists each stage's states (its branch's, a Map's item processor's included) and the
frame around them, the Parallel and the Choice after it, so ``d2ops status``, ``d2ops graph`` and the
console group a run the same way without reading the definition. ``FAILURE_RECORDS`` are the states that record
``$.failure``: a stage that enters one has failed, and goes on to Report failure.

``EXPECTED_MISSES`` are task errors the definition catches as a normal outcome (the first run's
"Find current endpoint" finds no endpoint, a create that finds its resource already created on a
redelivered run): a reader sees them as misses, not failures. ``LOOPS`` are the wait / count /
check cycles a reader wants as one line (the Wait state, its rounds and their total time).

The names are not written here: ``make asl`` writes them from the definition (src/d2ops/statemachine/,
the one home of the state names) to ``d2ops_core.pipeline_stage_table``, and this module reads those
rows into its types. Standard library only: the status API (through the CoreLayer) and the CLI both
read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from d2ops_core import pipeline_stage_table as _table


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    states: tuple[str, ...]  # the stage's own states: its Parallel's branch
    # The states that only frame the stage: its Parallel (named by the title) and the Choice after it. A run's
    # timeline leaves them out (the Parallel's visit spans the stage's, the Choice decides in no time).
    frame: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExpectedMiss:
    """A task error that is a normal outcome of ``state`` when the run goes on to one of ``recovered_by``.

    The same error routed to the failure path (a lookup that failed for another reason) stays a failure:
    the error alone does not say which it was, where the run went next does.
    """

    state: str
    errors: frozenset[str]
    recovered_by: frozenset[str]
    meaning: str


@dataclass(frozen=True)
class Loop:
    """A wait/count/check cycle: consecutive visits of ``states`` read as one line titled ``title``,
    counted by the visits of ``head`` (the Wait state: one per round)."""

    title: str
    head: str
    states: frozenset[str]
    retries: str | None = None  # the task a retry loop starts again (a line of its own: it does the work)


# The rows `make asl` writes from the definition (d2ops.statemachine.stage_table), read into the types above.
STAGES: tuple[Stage, ...] = tuple(Stage(key, title, states, frame=frame)
                                  for key, title, frame, states in _table.STAGES)

_BY_STATE: dict[str, Stage] = {name: stage for stage in STAGES for name in (*stage.frame, *stage.states)}
FRAMES = frozenset(name for stage in STAGES for name in stage.frame)

FAILURE_RECORDS = frozenset(_table.FAILURE_RECORDS)
_BY_KEY: dict[str, Stage] = {stage.key: stage for stage in STAGES}


def stage_of(state_name: str) -> Stage:
    """The stage ``state_name`` belongs to (KeyError naming it when the definition has a state no stage holds)."""
    try:
        return _BY_STATE[state_name]
    except KeyError:
        raise KeyError(f"state {state_name!r} is in no stage of d2ops_core.pipeline_stages.STAGES") from None


def stage(key: str) -> Stage:
    return _BY_KEY[key]


EXPECTED_MISSES: Mapping[str, ExpectedMiss] = {
    state: ExpectedMiss(state, frozenset(errors), frozenset(recovered_by), meaning)
    for state, errors, recovered_by, meaning in _table.EXPECTED_MISSES}


def expected_miss(state_name: str, error: str | None, later_states: Iterable[str]) -> ExpectedMiss | None:
    """The expected miss a failed visit of ``state_name`` with ``error`` was, given the states the run
    entered after it (in order), or None when it was a failure. The run must reach a recovering state
    before it records a failure or leaves the stage (or ends)."""
    miss = EXPECTED_MISSES.get(state_name)
    if miss is None or error not in miss.errors:
        return None
    return miss if _recovered(miss, later_states) else None


def miss_settled(state_name: str, later_states: Iterable[str]) -> bool:
    """Whether the states entered after ``state_name`` (one of EXPECTED_MISSES) already tell what its error
    was: the run recovered, recorded a failure or left the stage (a live reader waits until then)."""
    return _recovered(EXPECTED_MISSES[state_name], later_states) is not None


def _recovered(miss: ExpectedMiss, later_states: Iterable[str]) -> bool | None:
    """True: the run reached a recovering state; False: it recorded a failure or left the stage first;
    None: neither yet."""
    home = stage_of(miss.state)
    for name in later_states:
        if name in miss.recovered_by:
            return True
        if name in FAILURE_RECORDS or _BY_STATE.get(name) is not home:
            return False
    return None


LOOPS: tuple[Loop, ...] = tuple(Loop(title, head, frozenset(states), retries)
                                for title, head, states, retries in _table.LOOPS)


def loop_of(state_name: str) -> Loop | None:
    return next((loop for loop in LOOPS if state_name in loop.states), None)


def all_states(definition: Mapping[str, Any]) -> dict[str, Any]:
    """Every state of an ASL definition by name, those of Map item processors and Parallel branches (the
    stages) included: a state's name is unique in the whole machine."""
    found: dict[str, Any] = {}
    for name, state in definition.get("States", {}).items():
        found[name] = state
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])):
            if isinstance(inner, Mapping):
                found.update(all_states(inner))
    return found


def definition_states(definition: Mapping[str, Any]) -> list[str]:
    """Every state name of an ASL definition, those of Map item processors and Parallel branches included."""
    return list(all_states(definition))
