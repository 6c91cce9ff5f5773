"""Waiting for a server's ``/ping`` and signalling its process group: one implementation.

Used by the serving image's TorchServe supervisor (``model_code.serving.launch``) and by the
local endpoints of the offline runtime (``d2ops.local.serving``), which run that image's entry
point. Standard library only, so the developer tooling can import it without torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request


class HealthWaitError(Exception):
    """The server did not become healthy; the caller adds where to look (logs)."""


class ServerExited(HealthWaitError):
    def __init__(self, name: str, returncode: int | None) -> None:
        super().__init__(f"{name} exited (code {returncode}) before /ping was healthy")
        self.returncode = returncode


class NotHealthyInTime(HealthWaitError):
    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(f"{url} not healthy after {timeout:.0f} s")


def ping(url: str, timeout: float = 2.0) -> int | None:
    """The status code ``url`` answers, or None while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout: float, *, name: str = "the server",
                 interval: float = 0.25) -> float:
    """Block until ``url`` answers 200; returns the seconds waited. Fails early if ``proc`` (``name``) exits."""
    started = time.monotonic()
    while True:
        if proc is None or proc.poll() is not None:
            raise ServerExited(name, None if proc is None else proc.returncode)
        if ping(url) == 200:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise NotHealthyInTime(url, timeout)
        time.sleep(interval)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; one that is already gone (or no longer ours) is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
