"""``d2ops graph RUN_ID [-o FILE]``: the run by stage (d2ops_core.state_graph), the states it went through in
each, the ones it never reached folded."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("graph", help="draw a run by stage: the states it went through, the unreached folded "
                                            "(SVG or PNG)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("-o", "--output", type=Path, help="FILE.svg or FILE.png (default <RUN_ID>.svg)")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops.offline.client import connect
    from d2ops.offline.processes import RuntimeBusy
    from d2ops_core.run_ids import execution_arn
    from d2ops_core.state_graph import write_graph

    output = args.output or Path(f"{args.run_id}.svg")
    if output.suffix.lower() not in (".svg", ".png"):
        raise UsageError(f"{output}: write the graph to a .svg or .png file")
    try:
        with connect(args.work_dir) as apis:
            arn = execution_arn(apis.state_machine_arn, args.run_id)
            try:
                described = apis.sfn.describe_execution(executionArn=arn)
            except apis.sfn.exceptions.ExecutionDoesNotExist as exc:
                raise UsageError(f"no run {args.run_id!r} in {args.work_dir}") from exc
            definition = json.loads(apis.sfn.describe_state_machine(stateMachineArn=apis.state_machine_arn)
                                    ["definition"])
            history = []
            for page in apis.sfn.get_paginator("get_execution_history").paginate(executionArn=arn):
                history += page["events"]
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc
    title = f"{args.run_id}: {described['status']}" + (f" ({described['error']})" if described.get("error") else "")
    write_graph(definition, history, described["status"], title, output)
    print(f"wrote {output} ({title})")
    return 0
