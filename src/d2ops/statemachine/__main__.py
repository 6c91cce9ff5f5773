"""Write, or check, the state machine definitions generated from ``d2ops.statemachine``.

``python -m d2ops.statemachine`` (``make asl``) writes ``statemachine/training_pipeline.asl.json``
(the path template.yaml's PipelineStateMachine deploys) and its stage table,
``src/d2ops_core/pipeline_stage_table.py`` (d2ops.statemachine.stage_table); ``--check`` (``make lint``)
writes nothing and exits 1, naming the first difference, when a committed file is not what the definition
generates.
Both exit 1 naming what template.yaml lacks when its DefinitionSubstitutions or LambdaInvokePolicy list
is out of step with the Lambdas the definition invokes (``d2ops.functions.template_problems``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from d2ops.functions import template_problems
from d2ops.statemachine import stage_table
from d2ops.statemachine.asl import Machine, render

STALE_HINT = "run `make asl` (python -m d2ops.statemachine) and commit the file"
# The state machine whose stages d2ops_core.pipeline_stages reads.
STAGED = "PipelineStateMachine"


def pipelines() -> dict[str, tuple[Path, Callable[[], Machine]]]:
    """Each generated definition: the template's state machine, its definition file, its builder."""
    from d2ops.statemachine import training_pipeline
    from d2ops.template import load_template

    spec = load_template().state_machine(STAGED)
    return {spec.logical_id: (spec.definition_path, training_pipeline.definition)}


def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f"[{json.dumps(part)}]"
    return out or "the document"


def _first_value_difference(committed: Any, generated: Any, path: tuple[Any, ...] = ()) -> str | None:
    if isinstance(committed, dict) and isinstance(generated, dict):
        for key in committed:
            if key not in generated:
                return f"{_where((*path, key))}: in the committed file, not generated"
            found = _first_value_difference(committed[key], generated[key], (*path, key))
            if found:
                return found
        for key in generated:
            if key not in committed:
                return f"{_where((*path, key))}: generated, not in the committed file"
        return None
    if isinstance(committed, list) and isinstance(generated, list):
        for index, (a, b) in enumerate(zip(committed, generated, strict=False)):
            found = _first_value_difference(a, b, (*path, index))
            if found:
                return found
        if len(committed) != len(generated):
            return f"{_where(path)}: {len(committed)} items committed, {len(generated)} generated"
        return None
    if committed != generated or type(committed) is not type(generated):
        return f"{_where(path)}: committed {json.dumps(committed)[:200]}, generated {json.dumps(generated)[:200]}"
    return None


def first_difference(committed: str, generated: str) -> str | None:
    """None when equal; else where they first differ: a JSON path when the values differ, else a line
    (order of keys or states, formatting)."""
    if committed == generated:
        return None
    try:
        found = _first_value_difference(json.loads(committed), json.loads(generated))
    except json.JSONDecodeError as exc:
        found = f"the committed file is not JSON ({exc})"
    return found or first_line_difference(committed, generated)


def first_line_difference(committed: str, generated: str) -> str | None:
    """None when equal; else the first line that differs (or the line counts)."""
    if committed == generated:
        return None
    for number, (a, b) in enumerate(zip(committed.splitlines(), generated.splitlines(), strict=False), start=1):
        if a != b:
            return f"line {number}: committed {a.strip()[:200]!r}, generated {b.strip()[:200]!r}"
    lines = len(committed.splitlines()), len(generated.splitlines())
    return f"the committed file has {lines[0]} lines, the generated one {lines[1]}"


def _shown(path: Path) -> str:
    """The path as the user would type it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.statemachine", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the first difference when a committed file is stale")
    parser.add_argument("--output", type=Path, metavar="PATH",
                        help="write or check PATH instead of the file template.yaml deploys")
    parser.add_argument("--stage-table", type=Path, metavar="PATH",
                        help=f"write or check PATH instead of {_shown(stage_table.STAGE_TABLE_PATH)}")
    args = parser.parse_args(argv)
    definitions = pipelines()
    if args.output and len(definitions) > 1:
        parser.error("--output names one file: there are several definitions")
    # Each file to write: what it is, where, its text. The stage table is checked like a definition: a state
    # renamed in the generator and not in the table is as stale as one in the JSON.
    files: list[tuple[str, Path, str, Callable[[str, str], str | None]]] = []
    for name, (deployed, build) in definitions.items():
        machine = build()
        files.append((name, args.output or deployed, render(machine), first_difference))
        if name == STAGED:
            files.append((f"{name} stage table", args.stage_table or stage_table.STAGE_TABLE_PATH,
                          stage_table.render(machine), first_line_difference))
    stale = 0
    for name, path, text, differ in files:
        shown = _shown(path)
        committed = path.read_text() if path.exists() else ""
        if args.check:
            difference = differ(committed, text) if committed else "the file is missing"
            if difference:
                print(f"{shown}: stale ({name}): {difference}; {STALE_HINT}", file=sys.stderr)
                stale += 1
            else:
                print(f"{shown}: up to date")
        elif committed != text:
            path.write_text(text)
            print(f"wrote {shown}")
        else:
            print(f"{shown}: up to date")
    # The template invokes what the definition invokes: each Lambda of d2ops.functions.PIPELINE_LAMBDAS has its
    # ARN substitution and its invoke policy (checked, not written: template.yaml is commented, hand-laid YAML).
    problems = template_problems()
    for problem in problems:
        print(f"{problem}; add it to template.yaml (or the Lambda to d2ops.functions)", file=sys.stderr)
    return 1 if stale or problems else 0


if __name__ == "__main__":
    sys.exit(main())
