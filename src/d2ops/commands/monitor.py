"""``d2ops monitor``: the endpoint monitor's windows (GET /endpoints/{endpointName}/monitoring) as a table.

Offline by default (the offline runtime's status API: a running runtime's, else one started on its state
directory); ``--stack NAME`` reads a deployed stack's API, signed with the caller's AWS credentials, for the
stack's EndpointName output. Exit code 1 when the newest window drifted (a script or a cron job can alert on it,
as ``d2ops validate`` answers 1 for an invalid dataset); 0 otherwise, also with no windows yet.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from d2ops.commands.deployed import add_deployed_stack_arguments, deployed_stack
from d2ops.commands.errors import UsageError
from d2ops.commands.status import open_status_api


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("monitor", help="the endpoint monitor's windows: each drifted statistic's value "
                                              "against its threshold (exit 1 when the newest window drifted)")
    add_deployed_stack_arguments(p)
    p.add_argument("--state-dir", dest="work_dir", type=Path, metavar="DIR", help="the same as --work-dir")
    p.add_argument("--endpoint", metavar="NAME", help="the endpoint (default: the stack's EndpointName)")
    # The bounds and the default are the status API's (status_api.monitoring); it refuses what it does not take.
    p.add_argument("--limit", type=int, metavar="N", help="the newest N windows (default: the API's, 48; at most 500)")
    p.add_argument("--json", action="store_true", help="print the status API's JSON answer")
    p.set_defaults(func=run)


def _minute(text: Any) -> str:
    try:
        return datetime.fromisoformat(str(text)).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(text)


def drifted_line(window: dict[str, Any]) -> str:
    """The statistics that moved, each as ``name value/threshold (test)``; "-" when none did."""
    moved = [s for s in window.get("statistics") or [] if s.get("drifted")]
    return ", ".join(f"{s['statistic']} {s['value']:.3f}/{s['threshold']:.3f} ({s['test']})" for s in moved) or "-"


def format_monitoring(answer: dict[str, Any]) -> list[str]:
    """The status API's MonitoringView -> a table, newest window first, and what was left out."""
    windows = answer.get("windows") or []
    lines = [f"endpoint {answer.get('endpoint')}: " + (f"{len(windows)} window(s), newest first" if windows else
                                                      "no monitoring windows yet (the monitor writes one per window "
                                                      "of captured traffic: docs/monitoring.md)")]
    if windows:
        lines.append(f"{'START (UTC)':<17} {'RECORDS':>7}  {'VERDICT':<15} {'MODEL RUN':<34} "
                     "DRIFTED: VALUE/THRESHOLD (TEST)")
        for w in windows:
            lines.append(f"{_minute(w.get('window_start')):<17} {w.get('records', 0):>7}  {w.get('verdict', '?'):<15} "
                         f"{w.get('model_run_id') or '-':<34} {drifted_line(w)}")
    for problem in answer.get("problems") or []:
        lines.append(f"unreadable: {problem.get('key')}: {problem.get('message')}")
    if answer.get("truncated"):
        lines.append("older windows left out to keep the answer under the API's size limit: ask a smaller --limit")
    elif answer.get("older_windows"):
        lines.append("older windows exist: raise --limit to see them")
    return lines


def newest_drifted(answer: dict[str, Any]) -> bool:
    windows = answer.get("windows") or []
    return bool(windows) and windows[0].get("verdict") == "drifted"


def _endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        return str(args.endpoint)
    if args.stack:
        _, stack = deployed_stack(args)
        return stack.endpoint_name
    from d2ops.offline.stack import load_stack

    return load_stack().endpoint_name


def run(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from d2ops.sigv4 import StatusApiError

    endpoint = _endpoint(args)
    where = f"stack {args.stack}" if args.stack else str(args.work_dir)
    with open_status_api(args) as api:
        try:
            query = f"?limit={args.limit}" if args.limit is not None else ""
            answer = api.get(f"/endpoints/{quote(endpoint, safe='')}/monitoring{query}")
        except StatusApiError as err:
            if err.status in (400, 404):  # a limit it does not take; a name SageMaker would refuse
                raise UsageError(f"endpoint {endpoint!r} in {where}: {err.message}") from err
            raise UsageError(f"the status API of {where} answered {err}") from err
        except OSError as exc:  # unreachable URL, DNS, TLS: the stack's API cannot be reached from here
            raise UsageError(f"the status API of {where} cannot be reached: {exc}") from exc
    print(json.dumps(answer) if args.json else "\n".join(format_monitoring(answer)))
    return 1 if newest_drifted(answer) else 0
