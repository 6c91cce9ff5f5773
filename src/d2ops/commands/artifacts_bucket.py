"""The artifacts bucket a command reads: the deployed ``--stack``'s, or the offline runtime's in ``--work-dir``.

Shared by ``d2ops label select`` (the endpoint's capture, the champion's report and baseline) and ``d2ops label
import`` (the champion's training snapshot as the base of the next version). Each yields the S3 client, the
bucket's name and the stack's endpoint name.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError

Opened = tuple[Any, str, str]  # (S3 client, artifacts bucket, the stack's endpoint)


@contextlib.contextmanager
def offline(work_dir: Path) -> Iterator[Opened]:
    from d2ops.offline.client import running_runtime
    from d2ops.offline.processes import RuntimeBusy
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.offline.stack import REGION, load_stack

    running = running_runtime(work_dir)
    if running is not None:  # `d2ops demo` or `d2ops run` holds the work dir: read its local S3
        stack = load_stack(parameters=running.parameters)
        yield running.session().client("s3", region_name=REGION, endpoint_url=running.moto), \
            stack.artifacts_bucket, stack.endpoint_name
        return
    try:
        with OfflineRuntime(work_dir) as rt:
            yield rt.client("s3"), rt.stack.artifacts_bucket, rt.stack.endpoint_name
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc


@contextlib.contextmanager
def deployed(args: argparse.Namespace) -> Iterator[Opened]:
    from d2ops.commands.deployed import deployed_stack

    session, stack = deployed_stack(args)
    bucket = stack.outputs.get("ArtifactsBucketName")
    if not bucket:
        raise UsageError(f"--stack {args.stack}: no ArtifactsBucketName output (deployed before d2ops 0.x?)")
    yield session.client("s3"), bucket, stack.endpoint_name


def opened(args: argparse.Namespace) -> contextlib.AbstractContextManager[Opened]:
    """``--stack``'s bucket when given, else the offline runtime's (``add_deployed_stack_arguments``' options)."""
    return deployed(args) if args.stack else offline(args.work_dir)
