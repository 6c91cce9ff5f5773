"""``d2ops run DATASET_DIR``: run the whole pipeline offline on one COCO dataset version."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the pipeline offline on a dataset version directory")
    p.add_argument("dataset_dir", metavar="DATASET_DIR", type=Path,
                   help="a dataset version: manifest.json, annotations/, images/")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
    p.add_argument("--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="override a template.yaml stack parameter, e.g. MinMap=0.5 (repeatable)")
    p.add_argument("--hyperparameter", action="append", default=[], metavar="NAME=VALUE",
                   help="a training hyperparameter default for this machine, e.g. min_size=256 (repeatable; "
                        "the manifest's training keys win)")
    p.add_argument("--cpu-profile", type=int, metavar="PX",
                   help="CPU-friendly training defaults for images of about PX pixels (input size, proposals)")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop the run after this many seconds")
    p.add_argument("--json", action="store_true", help="print only the run summary as JSON (progress on stderr)")
    p.set_defaults(func=run)


def parse_pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{option} {item!r}: expected NAME=VALUE")
        pairs[name] = value
    return pairs


def run(args: argparse.Namespace) -> int:
    from d2ops.offline.pipeline import run_pipeline
    from d2ops.offline.processes import RuntimeBusy, install_signal_handlers
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.offline.stack import StackError, cpu_training_profile

    if not (args.dataset_dir / "manifest.json").is_file():
        raise UsageError(f"{args.dataset_dir}: no manifest.json (a dataset version directory holds manifest.json, "
                         "annotations/ and images/)")
    out = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    install_signal_handlers()
    try:
        defaults = cpu_training_profile(args.cpu_profile) if args.cpu_profile else {}
        defaults.update(parse_pairs(args.hyperparameter, "--hyperparameter"))
        runtime = OfflineRuntime(args.work_dir, parameters=parse_pairs(args.parameter, "--parameter"),
                                 training_defaults=defaults)
    except StackError as exc:
        raise UsageError(str(exc)) from exc
    try:
        with runtime as rt:
            for message in rt.messages:
                out(f"note: {message}")
            try:
                summary = run_pipeline(rt, args.dataset_dir, out=out, timeout=args.timeout)
            except ValueError as exc:
                raise UsageError(str(exc)) from exc
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc
    if not args.json:
        failure = f" {summary.error}: {summary.cause}" if summary.error else ""
        print(f"run {summary.run_id}: {summary.status}{failure}")
        print(f"details: d2ops status {summary.run_id}   picture: d2ops graph {summary.run_id}")
    print(json.dumps(summary.to_json()))
    return 0 if summary.status == "SUCCEEDED" else 1
