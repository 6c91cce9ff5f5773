"""``d2ops approve RUN_ID`` / ``d2ops reject RUN_ID --reason TEXT``: decide a run the quality gate sent to review.

Both post to the status API's ``POST /runs/{runId}/decision``. Offline (the default) they talk to the
runtime of ``d2ops demo`` / ``d2ops run`` that holds the work dir: a run waits for review only while the
runtime that runs it is up, so none running is an error, not a runtime started for the occasion. Its
credentials sign as a session of the offline stack's reviewer role (d2ops.offline.status_api_server).

With ``--stack NAME`` they read the deployed stack's ``StatusApiUrl`` and ``ReviewerRoleArn`` outputs and
sign with the caller's AWS credentials (SigV4). Only sessions of the reviewer role may decide, so a caller
who is not in it yet assumes it first (sts:AssumeRole, the session named after the caller: the decision
records ``assumed-role/<ReviewerRole>/<you>``); the stack's ``ReviewerPrincipals`` parameter says who may.

Exit codes: 0 decided (or this caller's same decision was recorded before), 1 the API refused or could not
decide (not waiting, already decided by someone else, no longer waiting, not a reviewer, unreachable),
2 usage (arguments, no such stack, no credentials).
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError
from d2ops_core.documents.review import MAX_REASON
from d2ops_core.run_ids import RUN_ID_PATTERN

REVIEWER_OUTPUT = "ReviewerRoleArn"  # the stack output (template.yaml) naming the role that may decide
ASSUMED_SECONDS = 900  # AssumeRole's shortest session: one decision needs a single request


class DecisionRefused(Exception):
    """The decision was not taken (the API refused it, or the caller cannot become a reviewer): exit 1."""


def register(subparsers: argparse._SubParsersAction) -> None:
    from d2ops.commands.status import add_stack_arguments

    for verb, required, help_text in (
            ("approve", False, "approve a run waiting for review: it deploys as if the gate had approved"),
            ("reject", True, "reject a run waiting for review: it ends QualityGateFailed naming you and why")):
        p = subparsers.add_parser(verb, help=help_text, description=help_text)
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("--reason", required=required, metavar="TEXT",
                       help=f"why, one line of at most {MAX_REASON} characters (recorded in the run, the registry "
                            "entry and the endpoint history)" + ("" if required else "; default \"approved\""))
        p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
        p.add_argument("--json", action="store_true", help="print the status API's JSON answer")
        add_stack_arguments(p)
        p.set_defaults(func=run, decision=verb)


def check_reason(reason: str | None) -> str | None:
    """The reason as the API takes it (stripped), or a UsageError saying what is wrong with it."""
    if reason is None:
        return None
    text = reason.strip()
    if not text:
        raise UsageError("--reason is blank")
    if len(text) > MAX_REASON:
        raise UsageError(f"--reason is {len(text)} characters; at most {MAX_REASON}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise UsageError("--reason must be one line of printable text (no newlines or control characters)")
    return text


def _stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    try:
        stacks = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except cloudformation.exceptions.ClientError as exc:
        raise UsageError(f"--stack {stack}: {exc.response.get('Error', {}).get('Message', exc)}") from exc
    return {o["OutputKey"]: str(o.get("OutputValue")) for o in (stacks[0].get("Outputs") or [])} if stacks else {}


def reviewer_api(session: Any, stack: str) -> Any:
    """A SignedStatusApi for ``stack``'s status API, signing as a session of its reviewer role: the caller's own
    credentials when they are one, else credentials of the role assumed for the caller."""
    from botocore.credentials import Credentials
    from botocore.exceptions import BotoCoreError, ClientError

    from d2ops.sigv4 import STATUS_API_OUTPUT, SignedStatusApi
    from d2ops_core.reviewer import is_session_of, session_name_for

    credentials = session.get_credentials()
    if credentials is None:
        raise UsageError("no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run `aws configure`)")
    if not session.region_name:
        raise UsageError("no AWS region configured (set AWS_REGION or AWS_DEFAULT_REGION, or use --region)")
    try:
        outputs = _stack_outputs(session.client("cloudformation"), stack)
        url, role = outputs.get(STATUS_API_OUTPUT), outputs.get(REVIEWER_OUTPUT)
        if not url or not role:
            raise UsageError(f"--stack {stack}: no {STATUS_API_OUTPUT} and {REVIEWER_OUTPUT} outputs (is it a d2ops "
                             "stack with reviews, and is its deployment finished?)")
        sts = session.client("sts")
        caller = str(sts.get_caller_identity()["Arn"])
        if is_session_of(caller, role):
            return SignedStatusApi(url, credentials.get_frozen_credentials(), session.region_name)
        try:
            assumed = sts.assume_role(RoleArn=role, RoleSessionName=session_name_for(caller),
                                      DurationSeconds=ASSUMED_SECONDS)["Credentials"]
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise DecisionRefused(
                f"{caller} may not assume the reviewer role {role} ({error.get('Code')}: {error.get('Message')}); "
                f"reviewers are the stack's ReviewerPrincipals, or principals allowed sts:AssumeRole on the role"
            ) from exc
    except (BotoCoreError, ClientError) as exc:
        raise UsageError(f"--stack {stack}: {exc}") from exc
    return SignedStatusApi(url, Credentials(assumed["AccessKeyId"], assumed["SecretAccessKey"],
                                            assumed["SessionToken"]), session.region_name)


def _offline_api(work_dir: Path) -> Any:
    from d2ops.offline.client import OfflineApis, running_runtime

    found = running_runtime(work_dir)
    if found is None or not found.status_api:
        raise DecisionRefused(f"no offline runtime is running on {work_dir}: a run waits for review only while the "
                              "`d2ops demo` or `d2ops run` that started it runs (pass --work-dir if it uses another)")
    return OfflineApis(status_api=found.status_api, sfn=None, state_machine_arn="", credentials=found.credentials)


def describe(answer: dict[str, Any]) -> str:
    """The API's answer in one line: who decided what, when and why."""
    line = (f"run {answer.get('run_id')} {answer.get('decision')} by {answer.get('decided_by')} at "
            f"{answer.get('decided_at')}: {answer.get('reason')}")
    return line + (" (recorded before: this is your earlier decision)" if answer.get("already_decided") else "")


def run(args: argparse.Namespace) -> int:
    import re

    from d2ops.sigv4 import StatusApiError

    if not re.fullmatch(RUN_ID_PATTERN, args.run_id):
        raise UsageError(f"{args.run_id!r} is not a run id (1-80 letters, digits, '-' or '_')")
    reason = check_reason(args.reason)
    body: dict[str, Any] = {"decision": args.decision, **({"reason": reason} if reason is not None else {})}
    where = f"stack {args.stack}" if args.stack else str(args.work_dir)
    try:
        if args.stack:
            import boto3
            from botocore.exceptions import BotoCoreError

            try:
                session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
            except BotoCoreError as exc:
                raise UsageError(f"--stack {args.stack}: {exc}") from exc
            api = reviewer_api(session, args.stack)
        else:
            api = _offline_api(args.work_dir)
        try:
            answer = api.call("POST", f"/runs/{args.run_id}/decision", body)
        except StatusApiError as err:
            if err.status in (400, 413):  # the request itself: what the user typed
                raise UsageError(f"the status API of {where} refused the request: {err.message}") from err
            raise DecisionRefused(f"{err.message} (HTTP {err.status} from the status API of {where})") from err
        except OSError as exc:  # unreachable URL, DNS, TLS; the runtime stopped
            raise DecisionRefused(f"the status API of {where} cannot be reached: {exc}") from exc
    except DecisionRefused as exc:
        print(f"d2ops {args.decision}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer) if args.json else describe(answer))
    return 0
