"""A local job's log: every host's output lines, each with its host first (``[algo-1] ...``).

The one home of that prefix: the local job runner (``d2ops.local.jobs``) writes it, the readers
(the training-progress follower, the bench) split it off again.
"""

from __future__ import annotations

import re

# At most 64 characters of host name: a line that merely starts with "[" is not taken for a host's.
_HOST = re.compile(r"\[(?P<host>[^\]\n]{0,64})\] ")


def host_line(host: str, line: str) -> str:
    """``[algo-1] line``: one line of a host's output as the job's log holds it."""
    return f"[{host}] {line}"


def split_host_line(line: str) -> tuple[str | None, str]:
    """(host, the host's own line); (None, line) for a line no host printed (the runner's own)."""
    prefix = _HOST.match(line)
    return (prefix["host"], line[prefix.end():]) if prefix else (None, line)
