"""``d2ops label select|export|import``: captured images back into a dataset version (issue 32; docs/labelling.md).

Each sub-command lives in its own module with ``register(subparsers)`` and ``run(args) -> int``, as the
top-level commands do (d2ops.cli); this module only groups them under ``label``.
"""

from __future__ import annotations

import argparse
import importlib

# One line per sub-command module, in --help's order. select: which captured images to label next.
LABEL_COMMAND_MODULES: tuple[str, ...] = (
    "d2ops.commands.label_select",
    "d2ops.commands.label_export",  # export: the selection into a Label Studio project, pre-annotated
    "d2ops.commands.label_import",  # import: its finished tasks back as a new dataset version
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("label", help="select captured images to label, export them to Label Studio and "
                                            "import the labels as a new dataset version")
    commands = p.add_subparsers(dest="label_command", metavar="LABEL_COMMAND", required=True)
    for name in LABEL_COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    for name, parser in commands.choices.items():
        parser.set_defaults(command=f"label {name}")  # errors say "d2ops label select: error: ..."
