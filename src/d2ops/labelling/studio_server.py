"""A throwaway Label Studio server on loopback, for ``d2ops demo --loop``: SQLite in a directory, a generated
token, no browser, stopped when the block ends.

Label Studio pins Django and much else, so it runs from its own environment (``make setup`` creates
``.venv-tools/label-studio``), never from the product's; ``D2OPS_LABEL_STUDIO`` may name another ``label-studio``
executable. Its first user and a legacy API token come from Label Studio's own variables (LABEL_STUDIO_USERNAME,
LABEL_STUDIO_PASSWORD, LABEL_STUDIO_USER_TOKEN with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_OVERRIDE = "D2OPS_LABEL_STUDIO"
TOOL = Path(".venv-tools") / "label-studio" / "bin" / "label-studio"
START_TIMEOUT_S = 240.0  # a fresh SQLite database runs every migration first (about 45 s on 2 busy cores)


class StudioUnavailable(RuntimeError):
    """No label-studio executable, or the server did not come up: one line saying which."""


@dataclass(frozen=True)
class StudioServer:
    url: str
    token: str
    user: str
    start_seconds: float
    log: Path


def executable(repo: Path | None = None) -> Path | None:
    """``$D2OPS_LABEL_STUDIO``, else ``.venv-tools/label-studio/bin/label-studio`` under ``repo`` (default: the
    checkout this module is in) or the current directory; None when none is there."""
    here = repo or Path(__file__).resolve().parents[3]
    candidates = [Path(os.environ[ENV_OVERRIDE])] if os.environ.get(ENV_OVERRIDE) else []
    candidates += [here / TOOL, Path.cwd() / TOOL]
    return next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:  # loopback http
            return bool(response.status == 200)
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)  # its own session: the Django server and whatever it started
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


@contextlib.contextmanager
def studio_server(data_dir: Path, tool: Path) -> Iterator[StudioServer]:
    """Start ``tool`` with its data in ``data_dir``, yield once /health answers, always stop it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{_free_port()}"
    user, password, token = "labeller@d2ops.demo", secrets.token_urlsafe(16), secrets.token_hex(20)
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir), "LABEL_STUDIO_USERNAME": user,
           "LABEL_STUDIO_PASSWORD": password, "LABEL_STUDIO_USER_TOKEN": token,
           "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", "LATEST_VERSION_CHECK": "false",
           "COLLECT_ANALYTICS": "false", "LOG_LEVEL": "WARNING"}
    log = data_dir / "server.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(  # the tool environment's own executable
            [str(tool), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]],
            env=env, cwd=data_dir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        while not _healthy(url):
            if process.poll() is not None:
                raise StudioUnavailable(f"Label Studio ({tool}) exited with {process.returncode} before answering; "
                                        f"its log: {log}")
            if time.monotonic() - started > START_TIMEOUT_S:
                raise StudioUnavailable(f"Label Studio did not answer {url}/health within {START_TIMEOUT_S:.0f} s; "
                                        f"its log: {log}")
            time.sleep(0.5)
        yield StudioServer(url=url, token=token, user=user, start_seconds=time.monotonic() - started, log=log)
    finally:
        _stop(process)
