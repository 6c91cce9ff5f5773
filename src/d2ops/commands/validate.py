"""``d2ops validate PATH_OR_S3_URI``: validate a dataset version, locally or in S3.

Exit codes: 0 valid, 1 invalid (a missing or malformed manifest included) or unreadable, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="validate a COCO dataset version (directory or s3://bucket/prefix/)")
    p.add_argument("source", metavar="PATH_OR_S3_URI", help="dataset version directory or s3://bucket/prefix/")
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    p.add_argument("--no-images", action="store_true",
                   help="check manifest and annotations only (no image files), e.g. before uploading images")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops_core.images import PixelLimitError
    from d2ops_core.validation import DatasetUnreadable, validate_local, validate_s3

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    source: str = args.source
    try:
        if source.startswith("s3://"):
            bucket, _, prefix = source[len("s3://"):].partition("/")
            if not bucket:
                raise UsageError(f"{source!r} has no bucket: use s3://BUCKET/PREFIX/")
            import boto3  # only S3 sources need it

            # Every image is read, pinned to its listed version, as the pipeline does.
            report = validate_s3(boto3.client("s3"), bucket, prefix, check_images=not args.no_images,
                                 progress=progress)
        else:
            if not os.path.exists(source):
                raise UsageError(f"{source} does not exist")
            if not os.path.isdir(source):
                raise UsageError(f"{source} is not a directory (a dataset version is a directory with manifest.json)")
            report = validate_local(source, check_images=not args.no_images, progress=progress)
    except DatasetUnreadable as exc:
        print(f"d2ops validate: cannot read the dataset: {exc}", file=sys.stderr)
        return 1
    except PixelLimitError as exc:  # the environment, not the dataset, is wrong
        print(f"d2ops validate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.model_dump_json(indent=1))
    else:
        print(report.describe())
    return 0 if report.valid else 1
