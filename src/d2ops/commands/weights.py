"""``d2ops weights upload FILE --stack NAME``: put a pretrained detectron2 checkpoint where the stack's
runs fine-tune from (its data bucket, at its ``PretrainedWeightsKey``).

Without ``--stack`` it uploads into the offline stack's data bucket: through the runtime holding
``--work-dir`` when one runs, else through one started for the upload (the local S3 is saved with the
work directory, so later offline runs find the file).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from d2ops.commands.deployed import add_deployed_stack_arguments, deployed_stack
from d2ops.commands.errors import UsageError

PARAMETER = "PretrainedWeightsKey"


def register(subparsers: argparse._SubParsersAction) -> None:
    from d2ops.weights import help_text

    group = subparsers.add_parser("weights", help="pretrained weights the stack's runs fine-tune from",
                                  description="Pretrained weights the stack's runs fine-tune from.",
                                  epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = group.add_subparsers(dest="weights_command", metavar="ACTION", required=True)
    p = commands.add_parser(
        "upload", help="check a detectron2 checkpoint and put it at the stack's PretrainedWeightsKey",
        description="Check that FILE is a detectron2 checkpoint (.pkl from the model zoo, or .pth) and upload it to "
                    "the stack's data bucket at its PretrainedWeightsKey, where every run's training job gets it as "
                    "the `pretrained` channel.",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", type=Path, help="the checkpoint, e.g. model_final_280758.pkl")
    add_deployed_stack_arguments(p)
    p.set_defaults(func=run)


@contextlib.contextmanager
def _deployed(args: argparse.Namespace) -> Iterator[tuple[Any, str, str]]:
    session, stack = deployed_stack(args)
    bucket, key = stack.outputs.get("DataBucketName"), stack.parameters.get(PARAMETER)
    if not bucket or not key:
        raise UsageError(f"--stack {args.stack}: no DataBucketName output or no {PARAMETER} parameter; deploy the "
                         "current template.yaml first")
    yield session.client("s3"), bucket, key


@contextlib.contextmanager
def _offline(work_dir: Path) -> Iterator[tuple[Any, str, str]]:
    from d2ops.offline.client import running_runtime
    from d2ops.offline.processes import RuntimeBusy
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.offline.stack import REGION, load_stack

    running = running_runtime(work_dir)
    if running is not None:  # `d2ops demo` or `d2ops run` holds the work dir: its local S3, its stack's key
        stack = load_stack(parameters=running.parameters)
        s3 = running.session().client("s3", region_name=REGION, endpoint_url=running.moto)
        yield s3, stack.data_bucket, stack.parameters[PARAMETER]
        return
    try:
        with OfflineRuntime(work_dir) as rt:
            yield rt.client("s3"), rt.stack.data_bucket, rt.stack.parameters[PARAMETER]
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    from d2ops.weights import CheckpointError, inspect_checkpoint, upload
    from d2ops_core import pretrained

    where = _deployed(args) if args.stack else _offline(args.work_dir)
    with where as (s3, bucket, key):
        if key == pretrained.SCRATCH:
            raise UsageError(f"the stack's {PARAMETER} is {pretrained.SCRATCH!r}: it trains from scratch and reads no "
                             f"weights; redeploy with {PARAMETER}={pretrained.DEFAULT_KEY} (the default) to fine-tune")
        try:
            checkpoint = inspect_checkpoint(args.file, key)
        except CheckpointError as exc:
            raise UsageError(str(exc)) from exc
        try:
            upload(s3, checkpoint, bucket, key)
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            print(f"d2ops weights: error: uploading to s3://{bucket}/{key} failed: {exc}", file=sys.stderr)
            return 1
    return 0
