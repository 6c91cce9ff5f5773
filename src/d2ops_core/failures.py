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


def describe(summary: str, cause: Any, limit: int = MAX_LINE_CHARS) -> str:
    """``summary`` (what failed, one line) followed by the reason the failing step gave, if any."""
    head = one_line(summary, limit)
    why = reason(cause, limit)
    if not why or why in head:
        return head
    return one_line(f"{head}: {why}", limit)
