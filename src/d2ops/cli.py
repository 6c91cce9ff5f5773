"""The ``d2ops`` command line.

Each sub-command lives in its own module under ``d2ops.commands`` with two functions:
``register(subparsers)`` adds its parser and ``run(args) -> int`` does the work. Heavy
imports (torch, moto, boto3) happen inside ``run`` so ``d2ops --help`` stays fast.
Exit codes: 0 success, 1 the work itself failed (invalid dataset, failed run), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from d2ops.commands.errors import UsageError

__all__ = ["COMMAND_MODULES", "UsageError", "build_parser", "main"]

# One line per sub-command module, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "d2ops.commands.synth",
    "d2ops.commands.validate",
    "d2ops.commands.asl",
    "d2ops.commands.train_local",
    "d2ops.commands.serve",
    "d2ops.commands.demo",
    "d2ops.commands.run",
    "d2ops.commands.status",
    "d2ops.commands.graph",
    "d2ops.commands.console",
    "d2ops.commands.predict",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="d2ops", description=__doc__.splitlines()[0] if __doc__ else None)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"d2ops {args.command}: error: {exc}\n")
    except KeyboardInterrupt:
        print(f"d2ops {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
