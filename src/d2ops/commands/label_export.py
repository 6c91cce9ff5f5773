"""``d2ops label export --to label-studio URL --project NAME --selection DIR``: the selected images into Label Studio.

Creates (or reuses, by title) a project with the dataset's classes and uploads each selected image with the
model's detections as pre-annotations; a re-run uploads only what the project lacks (docs/labelling.md).
``--to coco DIR`` writes COCO instances + images instead, for CVAT and other tools.
Exit codes: 0 exported, 1 a one-line error (server, token, project, image), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="upload a selection to a Label Studio project, pre-annotated")
    p.add_argument("--to", dest="tool", required=True, choices=["label-studio", "coco"],
                   help="label-studio: a server; coco: a directory of COCO annotations.json + images/ (CVAT)")
    p.add_argument("destination", metavar="URL_OR_DIR",
                   help="the Label Studio server (http://localhost:8080), or the directory to write (coco)")
    p.add_argument("--project", help="Label Studio project title (created if absent, reused if present)")
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
    if args.tool == "coco":
        from d2ops.labelling.coco_files import ANNOTATIONS_FILE, export_coco

        try:
            count = export_coco(args.selection, Path(args.destination))
        except LabellingError as exc:
            print(f"d2ops label export: error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {count} images to {args.destination}/images and their boxes to {args.destination}/"
              f"{ANNOTATIONS_FILE} (COCO; CVAT: create a task from images/, upload annotations as COCO 1.0)")
        return 0
    if not args.project:
        raise UsageError("--project NAME is required with --to label-studio")
    try:
        server = Server(args.destination, os.environ.get(token_env), token_env)
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
