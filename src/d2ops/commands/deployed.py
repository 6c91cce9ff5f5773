"""A deployed stack named on the command line (``--stack``), for the commands that act on one or on the
offline stack: its arguments, and its session and CloudFormation record, refused in one line when unreachable."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from d2ops.commands.errors import UsageError

if TYPE_CHECKING:
    from d2ops.doctor import StackFacts


def add_deployed_stack_arguments(p: argparse.ArgumentParser) -> None:
    """``--stack`` (with ``--profile``, ``--region``) or, without it, the offline runtime's ``--work-dir``."""
    p.add_argument("--stack", metavar="NAME", help="the deployed d2ops stack (default: the offline stack)")
    p.add_argument("--profile", help="AWS profile for --stack (default: the usual AWS_PROFILE / credential chain)")
    p.add_argument("--region", help="AWS region of --stack (default: the profile's or AWS_REGION)")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"),
                   help="offline runtime state, without --stack (default .d2ops)")


def deployed_stack(args: argparse.Namespace) -> tuple[Any, StackFacts]:
    """The boto3 session of ``--profile``/``--region`` and ``--stack``'s record; a UsageError when there are
    no credentials, no region, or no such stack."""
    import boto3
    from botocore.exceptions import BotoCoreError

    from d2ops.doctor import StackNotFound, read_stack

    try:
        session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
        if session.get_credentials() is None:
            raise UsageError("no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run `aws configure`)")
        if not session.region_name:
            raise UsageError("no AWS region (pass --region, or set AWS_REGION or a profile with one)")
        stack = read_stack(session.client("cloudformation"), args.stack, session.region_name)
    except (StackNotFound, BotoCoreError) as exc:
        raise UsageError(f"--stack {args.stack}: {exc}") from exc
    return session, stack
