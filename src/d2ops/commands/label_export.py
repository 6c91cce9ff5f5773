"""``d2ops label export --to label-studio URL --project NAME --selection DIR``: the selected images into Label Studio.

Creates (or reuses, by title) a project with the dataset's classes and uploads each selected image with the
model's detections as pre-annotations; a re-run uploads only what the project lacks (docs/labelling.md).
Exit codes: 0 exported, 1 a one-line error (server, token, project, image), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="upload a selection to a Label Studio project, pre-annotated")
    p.add_argument("--to", dest="tool", required=True, choices=["label-studio"], help="the labelling tool")
    p.add_argument("url", metavar="URL", help="the Label Studio server, e.g. http://localhost:8080")
    p.add_argument("--project", required=True, help="project title (created if absent, reused if present)")
    p.add_argument("--selection", required=True, metavar="DIR", help="what d2ops label select wrote")
    p.add_argument("--token-env", default=None, metavar="VAR",
                   help="environment variable holding the API token (default LABEL_STUDIO_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops.labelling.labelstudio import DEFAULT_TOKEN_ENV, LabellingError, Server, export_selection

    token_env = args.token_env or DEFAULT_TOKEN_ENV
    if not os.path.isdir(args.selection):
        raise UsageError(f"--selection {args.selection}: not a directory (d2ops label select writes one)")
    try:
        server = Server(args.url, os.environ.get(token_env), token_env)
        summary = export_selection(server, args.project, args.selection,
                                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    except LabellingError as exc:
        print(f"d2ops label export: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(vars(summary)))
    else:
        print(f"project {args.project!r} (id {summary.project_id}): {len(summary.task_ids)} tasks for the selection, "
              f"{summary.uploaded} uploaded now; label them at {server.url}/projects/{summary.project_id}")
    return 0
