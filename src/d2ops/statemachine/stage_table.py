"""The stage table: how people read the pipeline's states, written from its definition by ``make asl``.

``d2ops status``, ``d2ops graph``, the status API and the console group a run's states by stage without reading
the definition: they read ``d2ops_core/pipeline_stage_table.py`` (standard library only, shipped in the
CoreLayer), which ``render`` writes from the ``Machine``, so a state's name lives in the generator alone.

Derived from the definition: each stage (a ``StageParallel`` at the top level) with its frame (the Parallel and
the Choice after it) and its states (its branch's, a Map's item processor's included), and the failure records
(the states that write ``$.failure``). Declared beside the states they talk about, in the generator: a stage's
key and reading order, the loops (``LoopReading``) and the expected misses (``ExpectedCatch``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import d2ops_core
from d2ops.statemachine.asl import DistributedMap, Json, Machine, Named, SingleBranchParallel, Task
from d2ops.statemachine.patterns import FAILURE_PATH, ExpectedCatch, LoopReading, StageParallel

# The file d2ops_core.pipeline_stages reads (the layer build ships every file of the package).
STAGE_TABLE_PATH = Path(d2ops_core.__file__).parent / "pipeline_stage_table.py"


@dataclass(frozen=True)
class StageRow:
    key: str
    title: str
    frame: tuple[str, ...]
    states: tuple[str, ...]


@dataclass(frozen=True)
class LoopRow:
    title: str
    head: str
    states: tuple[str, ...]
    retries: str | None


@dataclass(frozen=True)
class MissRow:
    state: str
    errors: tuple[str, ...]
    recovered_by: tuple[str, ...]
    meaning: str


@dataclass(frozen=True)
class StageTable:
    stages: tuple[StageRow, ...]
    loops: tuple[LoopRow, ...]
    expected_misses: tuple[MissRow, ...]
    failure_records: tuple[str, ...]


def _flat(machine: Machine) -> Iterator[Named]:
    """Every state of ``machine`` in the order written, those of Map item processors and Parallel branches after
    their state."""
    for name, state in machine.states:
        yield name, state
        if isinstance(state, DistributedMap):
            yield from _flat(state.processor)
        elif isinstance(state, SingleBranchParallel):
            yield from _flat(state.branch)


def _targets(state: Json) -> set[str]:
    found = {state[key] for key in ("Next", "Default") if key in state}
    return found | {rule["Next"] for rule in state.get("Choices", []) + state.get("Catch", [])}


def _reading_order(stage: str, states: list[str], moves: Iterable[tuple[str, tuple[str, ...]]]) -> tuple[str, ...]:
    order = list(states)
    for after, moved in moves:
        for name in (after, *moved):
            if name not in states:
                raise ValueError(f"stage {stage!r}: its reading order names {name!r}, which is not one of its states")
        order = [name for name in order if name not in moved]
        at = order.index(after) + 1
        order[at:at] = moved
    return tuple(order)


def _loop(stage: str, loop: LoopReading, states: list[str], graph: dict[str, set[str]]) -> LoopRow:
    """The loop's states: those on a cycle through its head (reached from it and reaching it, inside the stage),
    with its entry, without the task it retries and the work set apart."""
    for name in (loop.head, loop.entry, loop.retries, *loop.apart):
        if name is not None and name not in graph:
            raise ValueError(f"stage {stage!r}: loop {loop.head!r} names {name!r}, which is not one of its states")

    def reach(start: str, edges: dict[str, set[str]]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += edges.get(name, set())
        return seen

    backward: dict[str, set[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            backward.setdefault(target, set()).add(name)
    cycle = reach(loop.head, graph) & reach(loop.head, backward)
    if len(cycle) < 2:
        raise ValueError(f"stage {stage!r}: loop {loop.head!r} is on no cycle")
    members = (cycle | ({loop.entry} if loop.entry else set())) - {loop.retries} - set(loop.apart)
    return LoopRow(loop.title or loop.head, loop.head, tuple(n for n in states if n in members), loop.retries)


def stage_table(machine: Machine) -> StageTable:
    stages: list[StageRow] = []
    loops: list[LoopRow] = []
    misses: list[MissRow] = []
    records: list[str] = []
    top = dict(machine.states)
    for name, state in machine.states:
        if not isinstance(state, StageParallel):
            continue
        if isinstance(top.get(state.next or ""), StageParallel):
            # The frame's second state is the stage's check (the Choice _unless_failed adds): without it the next
            # stage would be read as this one's frame, and a failure recorded here would never reach Report failure.
            raise ValueError(f"stage {name!r} goes straight on to stage {state.next!r}: follow it with its check "
                             "(training_pipeline._unless_failed), as every other stage is")
        frame = (name,) if state.next is None else (name, state.next)
        inner = list(_flat(state.branch))
        names = [n for n, _ in inner]
        stages.append(StageRow(state.key, name, frame, _reading_order(name, names, state.reading_order)))
        graph = {n: _targets(s.asl()) & set(names) for n, s in inner}
        loops += [_loop(name, loop, names, graph) for loop in state.loops]
        for inner_name, inner_state in inner:
            if isinstance(inner_state, Task):
                expected = [c for c in inner_state.catch if isinstance(c, ExpectedCatch)]
                if len(expected) > 1:
                    raise ValueError(f"{inner_name!r}: one expected miss a state")
                misses += [MissRow(inner_name, c.errors, c.recovering_states(), c.meaning) for c in expected]
            if inner_state.asl().get("ResultPath") == FAILURE_PATH:
                records.append(inner_name)
    staged = [n for row in stages for n in (*row.frame, *row.states)]
    unstaged = [n for n in machine.names() if n not in staged]
    if unstaged:
        raise ValueError(f"states in no stage: {unstaged}")
    return StageTable(tuple(stages), tuple(loops), tuple(misses), tuple(records))


# --- the generated module --------------------------------------------------------------------------------------


def _text(value: str | None) -> str:
    return "None" if value is None else json.dumps(value, ensure_ascii=False)


def _names(names: tuple[str, ...], indent: str) -> str:
    """A tuple of names, one a line."""
    return "(\n" + "".join(f"{indent}    {_text(n)},\n" for n in names) + f"{indent})"


def _short(names: tuple[str, ...]) -> str:
    return "(" + ", ".join(_text(n) for n in names) + ("," if len(names) == 1 else "") + ")"


def _fitted(names: tuple[str, ...], indent: str) -> str:
    """On one line when it fits (a field of its own at ``indent``), else one name a line."""
    short = _short(names)
    return short if len(indent) + len(short) + 1 <= 120 else _names(names, indent)


HEADER = '''"""The pipeline's stages, loops, expected misses and failure records, as its state machine has them.

Generated by `make asl` (python -m d2ops.statemachine) from src/d2ops/statemachine/: do not edit. Rename or
add a state there; d2ops_core.pipeline_stages reads these rows into its types.
"""

from __future__ import annotations
'''


def render(machine: Machine) -> str:
    """The text of ``d2ops_core/pipeline_stage_table.py``."""
    table = stage_table(machine)
    out = [HEADER]
    out.append("\n# (key, title, frame, states): the frame is the stage's Parallel (named by its title) and the Choice "
               "after it,\n# the states are its branch's in the order people read them.\n"
               "STAGES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (\n")
    for s in table.stages:
        out.append(f"    ({_text(s.key)}, {_text(s.title)}, {_short(s.frame)}, {_names(s.states, '    ')}),\n")
    out.append(")\n")
    out.append("\n# (title, head, states, retries): a wait/count/check cycle read as one line, counted by its head's "
               "visits.\nLOOPS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (\n")
    for loop in table.loops:
        out.append(f"    ({_text(loop.title)}, {_text(loop.head)}, {_names(loop.states, '    ')}, "
                   f"{_text(loop.retries)}),\n")
    out.append(")\n")
    out.append("\n# (state, errors, recovered_by, meaning): a caught error that is a normal outcome when the run "
               "goes on to\n# one of recovered_by.\n"
               "EXPECTED_MISSES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (\n")
    for miss in table.expected_misses:
        out.append(f"    (\n        {_text(miss.state)},\n        {_fitted(miss.errors, '        ')},\n"
                   f"        {_fitted(miss.recovered_by, '        ')},\n        {_text(miss.meaning)},\n    ),\n")
    out.append(")\n")
    out.append("\n# The states that record $.failure: a stage that enters one has failed.\n"
               f"FAILURE_RECORDS: tuple[str, ...] = {_names(table.failure_records, '')}\n")
    return "".join(out)
