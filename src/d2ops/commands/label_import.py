"""``d2ops label import --from label-studio URL --project NAME [--dataset BASE] --out DIR``: labels into a new version.

Reads the project's completed, non-skipped tasks, reports conflicts between annotators, and writes the base
dataset version (by default the champion's training snapshot) plus the labelled images as a new version,
validated like any upload; ``--upload s3://BUCKET`` then puts it under datasets/<name>/<version>/, manifest
last, which starts the next run (docs/labelling.md).
``--from coco FILE [--images DIR]`` reads a labelling tool's COCO export (CVAT's COCO 1.0) instead.
Exit codes: 0 written, 1 a one-line error or an invalid new version (its report printed), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from d2ops.commands.deployed import add_deployed_stack_arguments
from d2ops.commands.errors import UsageError

CHAMPION = "champion"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("import", help="read finished Label Studio tasks back as a new dataset version")
    p.add_argument("--from", dest="tool", required=True, choices=["label-studio", "coco"],
                   help="label-studio: a server; coco: a COCO instances file (CVAT's COCO 1.0 export)")
    p.add_argument("source", metavar="URL_OR_FILE",
                   help="the Label Studio server (http://localhost:8080), or the COCO file (coco)")
    p.add_argument("--project", help="Label Studio project title")
    p.add_argument("--images", type=Path, metavar="DIR", help="coco: the directory file_name values are relative "
                                                               "to (default: images/ beside the file or its parent)")
    p.add_argument("--dataset", default=CHAMPION, metavar="DIR_OR_S3_URI",
                   help="the base dataset version: a directory, s3://BUCKET/datasets/NAME/VERSION/, or "
                        f"{CHAMPION!r} (the default): the serving model's training snapshot, read from --stack's "
                        "artifacts bucket or the offline runtime's in --work-dir")
    add_deployed_stack_arguments(p)
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the new version is written "
                                                                           "(must not exist)")
    p.add_argument("--version", default=None, help="the new version's name (default: the base's, plus one: v1 -> v2)")
    p.add_argument("--upload", default=None, metavar="s3://BUCKET",
                   help="also upload it to the data bucket, manifest.json last (starts the next run)")
    p.add_argument("--token-env", default=None, metavar="VAR",
                   help="environment variable holding the API token (default LABEL_STUDIO_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the validation report as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops.labelling import new_version as nv
    from d2ops.labelling.labelstudio import DEFAULT_TOKEN_ENV, LabellingError, Server, read_labels
    from d2ops_core.validation.manifest import SEGMENT_PATTERN

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    token_env = args.token_env or DEFAULT_TOKEN_ENV
    if args.upload is not None and not args.upload.startswith("s3://"):
        raise UsageError(f"--upload {args.upload}: expected s3://BUCKET")
    scratch = None
    try:
        if args.dataset == CHAMPION:
            scratch = nv.scratch_dir()
            base_root = _champion_snapshot(args, scratch, say)
        elif args.dataset.startswith("s3://"):
            import boto3

            scratch = nv.scratch_dir()
            base_root = nv.download_base(boto3.client("s3"), args.dataset, scratch, say)
        else:
            base_root = Path(args.dataset)
            if not base_root.is_dir():
                raise UsageError(f"--dataset {args.dataset}: not a directory or s3:// URI")
        base = nv.open_base(base_root)
        version = args.version or nv.next_version(base.version)
        if not re.fullmatch(SEGMENT_PATTERN, version):
            raise UsageError(f"--version {version!r}: must match {SEGMENT_PATTERN}")
        classes = sorted(base.classes, key=base.classes.__getitem__)
        if args.tool == "coco":
            labelled, counts = _from_coco(Path(args.source), args.images, classes)
        else:
            if not args.project:
                raise UsageError("--project NAME is required with --from label-studio")
            server = Server(args.source, os.environ.get(token_env), token_env)
            back = read_labels(server, args.project, classes, progress=say)
            for conflict in back.conflicts:
                say(f"conflict: {conflict.describe()}")
            if not back.labelled:
                raise LabellingError(f"project {args.project!r} has no completed task to import ({back.pending} not "
                                     f"completed, {back.skipped} skipped, {len(back.conflicts)} conflicts)")
            labelled = back.labelled
            counts = (f"from {len(back.labelled)} completed tasks ({len(back.conflicts)} conflicts left out, "
                      f"{back.skipped} skipped, {back.pending} not completed)")
        try:
            written = nv.write_version(base, labelled, args.out, version=version, progress=say)
        except nv.InvalidVersion as exc:
            print(exc.report.model_dump_json(indent=1) if args.json else exc.report.describe())
            raise
        for item in written.already_in_base:
            say(f"already in {base.name}/{base.version}, not added again: {item}")
        assert written.report is not None
        print(written.report.model_dump_json(indent=1) if args.json else written.report.describe())
        say(f"wrote {written.name}/{written.version} to {written.path}: {written.added_train} new train and "
            f"{written.added_val} new val images, {written.added_boxes} boxes, {counts}")
        if args.upload:
            import boto3

            try:
                uri = nv.upload_version(boto3.client("s3"), written, args.upload, say)
            except Exception as exc:
                if not _from_aws_sdk(exc):
                    raise
                raise LabellingError(f"uploading {written.path} to {args.upload}: S3: {exc}; no run started (the "
                                     "manifest goes last): import again with a new --out to finish the upload"
                                     ) from None
            say(f"uploaded to {uri}: its manifest starts the next run")
    except LabellingError as exc:
        print(f"d2ops label import: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # S3 (botocore) failures: one line naming the bucket's problem, not a traceback
        if not _from_aws_sdk(exc):
            raise
        print(f"d2ops label import: error: S3: {exc}", file=sys.stderr)
        return 1
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _from_aws_sdk(exc: Exception) -> bool:
    return type(exc).__module__.split(".")[0] in ("botocore", "boto3")


def _champion_snapshot(args: argparse.Namespace, into: Path, say: Any) -> Path:
    """The champion's training snapshot in ``--stack``'s artifacts bucket, or the offline runtime's."""
    from d2ops.commands import artifacts_bucket
    from d2ops.labelling import new_version as nv

    if not args.stack and not args.work_dir.is_dir():
        raise UsageError(f"--work-dir {args.work_dir}: no offline runtime state there, so no champion to build on; "
                         "name the base with --dataset DIR_OR_S3_URI, or the deployed stack with --stack NAME")
    with artifacts_bucket.opened(args) as (s3, bucket, _):
        return nv.download_champion_snapshot(s3, bucket, into, say)


def _from_coco(path: Path, images: Path | None, classes: list[str]) -> tuple[list[Any], str]:
    from d2ops.labelling.coco_files import read_coco_labels
    from d2ops.labelling.labelstudio import LabellingError

    if not path.is_file():
        raise UsageError(f"{path}: no such COCO file")
    if images is None:
        images = next((d for d in (path.parent / "images", path.parent.parent / "images") if d.is_dir()), None)
        if images is None:
            raise UsageError(f"no images/ beside {path} or its parent: name the directory with --images")
    read = read_coco_labels(path, images, classes)
    if not read.labelled:
        raise LabellingError(f"{path}: no image with a box to import ({read.without_boxes} without annotations)")
    return list(read.labelled), f"from {path} ({read.without_boxes} images without boxes left out)"
