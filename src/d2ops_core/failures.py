"""One line for people from whatever a failed step reported (the stack trace stays in the logs).

A Lambda task's error Cause is the function's error document (``errorMessage``,
``errorType``, ``stackTrace``); a SageMaker ``.sync`` task's is the whole Describe…Job answer;
an SDK integration's is the service's message. The notification and ``GET /runs/{id}`` show
one bounded line taken from it: the message, or the job's ``FailureReason``, never a trace.

Standard library only: the describe_failure Lambda and the status API use it through the CoreLayer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from d2ops_core.platform import (
    QUOTA_CONSOLE_SERVICE,
    QUOTA_FIND_CODE,
    QUOTA_REQUEST_INCREASE,
    QuotaRefusal,
    parse_quota_name,
    parse_quota_refusal,
)

MAX_LINE_CHARS = 500
_TRACEBACK = "Traceback (most recent call last):"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_SPACES = re.compile(r"\s+")
# Keys that carry a readable reason, in order of preference, in the JSON causes we know.
_REASON_KEYS = ("errorMessage", "FailureReason", "ExitMessage", "message", "Message")


def _strip_traceback(text: str) -> str:
    """Keep what precedes a Python traceback and the exception line that ends it."""
    if _TRACEBACK not in text:
        return text
    before, _, trace = text.partition(_TRACEBACK)
    # The exception line is the last line that is not indented (frames and source lines are).
    last = next((line for line in reversed(trace.splitlines()) if line.strip() and not line[0].isspace()), "")
    return f"{before} {last}"


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters: no traceback, no control characters."""
    flat = _SPACES.sub(" ", _CONTROL.sub(" ", _strip_traceback(text))).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def reason(cause: Any, limit: int = MAX_LINE_CHARS) -> str | None:
    """The readable reason inside a task's error Cause, as one line (None when there is none)."""
    if cause is None:
        return None
    text = cause if isinstance(cause, str) else json.dumps(cause)
    try:
        document = json.loads(text) if text.lstrip().startswith("{") else None
    except (ValueError, RecursionError):  # truncated, not JSON after all, or nested beyond json's reach: text
        document = None
    if isinstance(document, dict):
        for key in _REASON_KEYS:
            value = document.get(key)
            if isinstance(value, str) and value.strip():
                # errorType is the Catch's Error, which the summary names already.
                return one_line(value, limit) or None
        # A JSON cause without a known reason key (a job description without FailureReason,
        # say): its status, if any, is still one useful word.
        status = next((v for k, v in document.items() if k.endswith("Status") and isinstance(v, str)), None)
        return one_line(f"status {status}", limit) if status else None
    return one_line(text, limit) or None


# ----------------------------------------------------------------------------- refusals
# A service's refusal of a request (a quota, an invalid request, a missing permission) cannot pass on a
# retry: the pipeline fails the run at once, and people get what to do about it. The stack parameters
# that choose what a quota counts (template.yaml's names; tests/unit/test_pipeline_fail_fast.py checks them).
QUOTA_STACK_PARAMETERS: dict[str, str] = {
    "spot training": "UseSpotTraining=false or another TrainingInstanceType",
    "training": "another TrainingInstanceType or a smaller TrainingInstanceCount",
    "processing": "another EvaluationInstanceType",
    "endpoint": "another EndpointInstanceType or a smaller EndpointInstanceCount",
}
# What the AWS SDKs append to a service error's message in a Step Functions Cause: Java v1 (the optimised
# integrations) "(Service: AmazonSageMaker; Status Code: 400; Error Code: X; Request ID: ...; Proxy: null)",
# v2 (aws-sdk integrations) "(Service: SageMaker, Status Code: 400, Request ID: ...)".
_SDK_SUFFIX = re.compile(r"\s*\(Service: [^()]*Status Code: (?P<status>\d+)[^()]*\)\s*$")
_ERROR_CODE = re.compile(r"Error Code: (?P<code>[A-Za-z.]+)")
_NOT_AUTHORIZED = re.compile(r"(?P<who>arn:\S+) is not authorized to perform: (?P<action>[\w-]+:[\w*]+)"
                             r"(?: on resource: (?P<resource>[^\s(]+))?")
_PRINCIPAL = re.compile(r":(?:assumed-role|role|user)/(?:[\w+=,.@-]+/)*?(?P<name>[\w+=,.@-]+)(?:/[^/]*)?$")
_ACCESS_CODES = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError")
# The summary's "(SageMaker.AmazonSageMakerException)": noise beside a refusal's own line.
_ERROR_NAME_TAIL = re.compile(r"\s*\([\w.]+(?:Exception|Error|Exceeded)\)\s*$")


def _instances(count: float) -> str:
    return f"{count:g} instance" + ("" if count == 1 else "s")


def quota_line(refusal: QuotaRefusal) -> str:
    """Which quota, its value, what the run asked for, and what to do: the stack parameter to change, or how
    to raise the quota (the console first; the CLI last, as the part a cut line can best lose)."""
    used = refusal.used or 0
    asked = refusal.requested if refusal.requested is not None else 1
    desired = used + asked
    parsed = parse_quota_name(refusal.name)
    instead = f"set {QUOTA_STACK_PARAMETERS[parsed[1]]}, or " if parsed else ""
    return (f"quota '{refusal.name}' is {_instances(refusal.value)} ({used:g} in use, this run asked for "
            f"{asked:g}): {instead}raise it to {desired:g} in Service Quotas (console: {QUOTA_CONSOLE_SERVICE}; "
            f"CLI: find its CODE with `{QUOTA_FIND_CODE}`, then "
            f"`{QUOTA_REQUEST_INCREASE.format(desired=f'{desired:g}')}`)")


def _principal(arn: str) -> str:
    match = _PRINCIPAL.search(arn)
    return f"role {match['name']}" if match and ":user/" not in arn else (match["name"] if match else arn)


def refusal(error: str | None, cause: Any) -> str | None:
    """What to do about a refused request, as one line: a quota (which, its value, the request, how to raise
    it), a missing permission (who lacks what), an invalid request (the service's message). None for any
    other error (a failed job, a throttled call), which :func:`reason` describes."""
    if not isinstance(cause, str) or not cause.strip():
        return None
    quota = parse_quota_refusal(cause)
    if quota is not None:
        return quota_line(quota)
    code_match = _ERROR_CODE.search(cause)
    code = code_match["code"] if code_match else (error or "").rpartition(".")[2]
    message = _SDK_SUFFIX.sub("", cause).strip()
    denied = _NOT_AUTHORIZED.search(cause)
    if denied is not None:
        on = f" on {denied['resource']}" if denied["resource"] else ""
        return (f"{_principal(denied['who'])} lacks {denied['action']}{on}: add it to that role's policy "
                "(template.yaml) and redeploy")
    if code in _ACCESS_CODES:
        return f"access denied: {message}"
    if code in ("ValidationException", "ValidationError"):
        return f"SageMaker refused the request as invalid: {message}"
    return None


# The errors that reach a job's failure record only from its refused Create…Job (the optimised .sync
# integration's names), never from the job or the aws-sdk Describe…Job calls after a lost answer: a quota, the
# catch-all (validation, access, throttling past its retries), a name in use by another job. SageMaker started
# nothing for this run. ResourceNotFound and SdkClientException are left out: Describe…Job can report them too,
# and a lost answer may have started the job. tests/unit/test_pipeline_describe_failure.py holds them to
# d2ops.aws_contract.
CREATE_REFUSALS = frozenset({"SageMaker.ResourceLimitExceededException", "SageMaker.AmazonSageMakerException",
                             "SageMaker.ResourceInUseException"})
# The summary the training and evaluation failure records write: "training job NAME failed (ERROR)".
_JOB_SUMMARY = re.compile(r"^(?P<job>\w+ job \S+) failed \((?P<error>[\w.]+)\)$")


def _refused_create(head: str, error: str | None) -> tuple[str, str] | None:
    """(the job, the error) when ``head`` calls a job failed that SageMaker refused to create (the error, the
    Catch's or else the summary's, one of CREATE_REFUSALS); else None."""
    match = _JOB_SUMMARY.match(head)
    name = error or (match["error"] if match else None)
    if match is None or name is None or name not in CREATE_REFUSALS:
        return None
    return match["job"], name


def describe(summary: str, cause: Any, limit: int = MAX_LINE_CHARS, error: str | None = None) -> str:
    """``summary`` (what failed, one line) followed by the reason the failing step gave, if any: for a refused
    request (``error`` is the Catch's error name) what to do about it."""
    head = one_line(summary, limit)
    refused = refusal(error, cause)
    never_created = _refused_create(head, error)
    if never_created is not None:  # not "failed": there is no such job. A refusal's own line names the refusal.
        job, name = never_created
        if refused is not None:
            return one_line(f"SageMaker refused to create {job}: {refused}", limit)
        why = reason(_SDK_SUFFIX.sub("", cause) if isinstance(cause, str) else cause, limit)
        return one_line(f"SageMaker refused to create {job} ({name})" + (f": {why}" if why else ""), limit)
    if refused is not None:
        return one_line(f"{_ERROR_NAME_TAIL.sub('', head)}: {refused}", limit)
    why = reason(cause, limit)
    if not why or why in head:
        return head
    return one_line(f"{head}: {why}", limit)
