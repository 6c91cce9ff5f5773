"""Write, or check, the state machine definitions generated from ``d2ops.statemachine``.

``python -m d2ops.statemachine`` (``make asl``) writes ``statemachine/training_pipeline.asl.json``
(the path template.yaml's PipelineStateMachine deploys); ``--check`` (``make lint``) writes nothing
and exits 1, naming the first difference, when the committed file is not what the definition generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from d2ops.statemachine.builder import Machine, render

STALE_HINT = "run `make asl` (python -m d2ops.statemachine) and commit the file"


def pipelines() -> dict[str, tuple[Path, Callable[[], Machine]]]:
    """Each generated definition: the template's state machine, its definition file, its builder."""
    from d2ops.statemachine import training_pipeline
    from d2ops.template import load_template

    spec = load_template().state_machine("PipelineStateMachine")
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
    if found:
        return found
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
    args = parser.parse_args(argv)
    definitions = pipelines()
    if args.output and len(definitions) > 1:
        parser.error("--output names one file: there are several definitions")
    stale = 0
    for name, (deployed, build) in definitions.items():
        path = args.output or deployed
        shown = _shown(path)
        text = render(build())
        committed = path.read_text() if path.exists() else ""
        if args.check:
            difference = first_difference(committed, text) if committed else "the file is missing"
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
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
