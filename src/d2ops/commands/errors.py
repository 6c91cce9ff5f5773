"""The one error every sub-command may raise for bad arguments, in a module of its own.

It lives here rather than in ``d2ops.cli`` so the commands need not import the CLI that
imports them (no cycle): ``d2ops.cli`` catches it and exits with status 2.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad arguments discovered after parsing (a missing path, a malformed JSON option)."""
