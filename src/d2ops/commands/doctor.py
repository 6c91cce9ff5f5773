"""``d2ops doctor --stack NAME``: a read-only preflight of a deployed stack, after ``sam deploy`` and
before the first upload: one line per check (ok / warn / FAIL, what was found, the fix); exit 1
when a check fails.

Without ``--stack`` it checks the offline stack through the offline runtime's APIs (the one holding
``--work-dir``, or one started for the check), as it would a deployed one. The checks live in
:mod:`d2ops.doctor`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from d2ops.commands.deployed import add_deployed_stack_arguments, deployed_stack
from d2ops.commands.errors import UsageError

if TYPE_CHECKING:  # the command's imports stay lazy: `d2ops --help` loads no boto3
    from d2ops.doctor import Clients, Report, StackFacts
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.offline.stack import OfflineStack


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor", help="check a deployed stack before its first run: images, quotas, weights, events, e-mail, "
                       "endpoint name",
        description="Read-only preflight, run after `sam deploy` and before the first upload: one line per "
                    "check (ok / warn / FAIL, what was found, and the fix); exits 1 when a check fails.")
    add_deployed_stack_arguments(p)
    p.set_defaults(func=run)


@contextlib.contextmanager
def _deployed(args: argparse.Namespace) -> Iterator[tuple[Clients, StackFacts]]:
    from d2ops.doctor import Clients

    session, stack = deployed_stack(args)
    yield Clients.from_session(session, session.region_name), stack


def offline_facts(stack: OfflineStack) -> StackFacts:
    """The offline stack has no CloudFormation record: its parameters and outputs come from the template,
    resolved as the offline runtime resolves them."""
    from d2ops.doctor import StackFacts
    from d2ops.offline.stack import REGION, STACK_NAME

    return StackFacts(name=STACK_NAME, region=REGION, parameters=dict(stack.parameters), deployed=False,
                      outputs={"DataBucketName": stack.data_bucket, "ArtifactsBucketName": stack.artifacts_bucket,
                               "NotificationTopicArn": stack.topic_arn,
                               "EndpointName": stack.endpoint_name, "PipelineStateMachineArn": stack.state_machine_arn})


def runtime_target(rt: OfflineRuntime) -> tuple[Clients, StackFacts]:
    """A runtime of this process: its clients (boto3 as the handlers have it) and its stack."""
    from d2ops.doctor import Clients

    return Clients(cloudformation=rt.client("cloudformation"), ecr=rt.client("ecr"),
                   servicequotas=rt.client("service-quotas"), s3=rt.client("s3"), sns=rt.client("sns"),
                   sagemaker=rt.client("sagemaker"), stepfunctions=rt.client("stepfunctions")), offline_facts(rt.stack)


@contextlib.contextmanager
def _offline(work_dir: Path) -> Iterator[tuple[Clients, StackFacts]]:
    from d2ops.doctor import Clients
    from d2ops.offline.client import running_runtime
    from d2ops.offline.processes import RuntimeBusy
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.offline.stack import REGION, load_stack

    running = running_runtime(work_dir)
    if running is not None:  # `d2ops demo` or `d2ops run` holds the work dir: ask its APIs, about its stack
        session = running.session()  # its gateway answers only its own credentials
        moto = Clients.from_session(session, REGION, endpoint_url=running.moto)
        gateway = Clients.from_session(session, REGION, endpoint_url=running.gateway)
        yield Clients(cloudformation=moto.cloudformation, ecr=moto.ecr, s3=moto.s3, sns=moto.sns,
                      servicequotas=gateway.servicequotas, sagemaker=gateway.sagemaker,
                      stepfunctions=gateway.stepfunctions), offline_facts(load_stack(parameters=running.parameters))
        return
    try:
        with OfflineRuntime(work_dir) as rt:
            yield runtime_target(rt)
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc


def print_report(report: Report, stack: StackFacts, where: str) -> int:
    """The report's lines and a summary; the exit status (1 when a check failed)."""
    print(f"d2ops doctor: stack {stack.name} ({where})")
    print("\n".join(report.lines()))
    failed = sum(c.status == "FAIL" for c in report.checks)
    warned = sum(c.status == "warn" for c in report.checks)
    print(f"{failed} check(s) failed" if failed else
          f"no check failed ({warned} warning(s))" if warned else "all checks passed")
    return 1 if report.failed else 0


def run(args: argparse.Namespace) -> int:
    from d2ops.doctor import run_checks

    where = _deployed(args) if args.stack else _offline(args.work_dir)
    with where as (clients, stack):
        report = run_checks(clients, stack)
    return print_report(report, stack, stack.region if args.stack else f"offline, {args.work_dir}")
