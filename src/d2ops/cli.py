"""The ``d2ops`` command line.

Each sub-command lives in its own module under ``d2ops.commands`` with two functions:
``register(subparsers)`` adds its parser and ``run(args) -> int`` does the work. Heavy
imports (torch, moto, boto3) happen inside ``run`` so ``d2ops --help`` stays fast.
Exit codes: 0 success, 1 the work itself failed (invalid dataset, failed run), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from d2ops.commands.errors import UsageError

__all__ = ["COMMAND_MODULES", "UsageError", "build_parser", "describe_os_error", "main"]

# One line per sub-command module, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "d2ops.commands.synth",
    "d2ops.commands.validate",
    "d2ops.commands.diff",
    "d2ops.commands.gate",
    "d2ops.commands.asl",
    "d2ops.commands.train_local",
    "d2ops.commands.serve",
    "d2ops.commands.demo",
    "d2ops.commands.label",
    "d2ops.commands.run",
    "d2ops.commands.status",
    "d2ops.commands.monitor",
    "d2ops.commands.decide",
    "d2ops.commands.doctor",
    "d2ops.commands.weights",
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


def describe_os_error(exc: OSError) -> str:
    """One line naming the path and the problem; a file where a directory must be is named as such.

    ``mkdir(".d2ops")`` beside a file called ``.d2ops`` fails with "File exists", and creating
    ``out/hosts/algo-1`` below a file ``out`` with "Not a directory" on the deepest path: neither
    says which path is in the way.
    """
    path = str(exc.filename) if exc.filename is not None else None
    if path and isinstance(exc, FileExistsError | NotADirectoryError):
        blocker = path
        while blocker and not os.path.exists(blocker):
            blocker = os.path.dirname(blocker.rstrip(os.sep))
        if blocker and not os.path.isdir(blocker):
            return f"{blocker} is a file, but a directory is needed there"
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{path}: {reason}" if path else reason


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"d2ops {args.command}: error: {exc}\n")
    except OSError as exc:  # a path the user named cannot be read or written: say which, without a traceback
        print(f"d2ops {args.command}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"d2ops {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
