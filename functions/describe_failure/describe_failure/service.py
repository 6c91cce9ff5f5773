"""Put the failing step's own reason, as one line, into the run's failure record."""

from __future__ import annotations

from typing import Any

from d2ops_core.failures import describe
from describe_failure.models import FailedRunDocument


def describe_failure(document: FailedRunDocument) -> dict[str, Any]:
    """The document with ``failure.cause`` = summary + the reason from ``error.Cause`` (no trace)."""
    error = document.error.Error if document.error is not None else None
    cause = document.error.Cause if document.error is not None else None
    return document.described(describe(document.failure.cause, cause, error=error))
