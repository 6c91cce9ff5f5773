"""The one place that finds, migrates and starts a Label Studio server on loopback: SQLite in a directory, a
generated token, no browser, stopped (its whole process group) when the block ends. Used by
``d2ops demo --loop`` and the labelling tests' session fixture (tests/fixtures/label_studio.py).

Label Studio pins Django and much else, so it runs from its own environment (``make setup`` creates
``.venv-tools/label-studio``), never from the product's; ``D2OPS_LABEL_STUDIO`` may name another ``label-studio``
executable. Its first user and a legacy API token come from Label Studio's own variables (LABEL_STUDIO_USERNAME,
LABEL_STUDIO_PASSWORD, LABEL_STUDIO_USER_TOKEN with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true; 1.23.2).

Django's migrations of a fresh database are most of a start (90-140 s on 2 busy cores, against ~10 s from a
migrated copy), so an empty, migrated database is kept once beside the executable's environment,
``<env>/d2ops-migrated-db/label_studio.sqlite3`` (gone with the environment when its lock changes; ``make setup``
makes it with ``python -m d2ops.labelling.studio_server migrate``), and every server starts from a copy of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from d2ops.setup_check import tool_env_executable

ENV_OVERRIDE = "D2OPS_LABEL_STUDIO"
START_TIMEOUT_S = 300.0  # without a template a fresh SQLite database runs every migration first
DATABASE = "label_studio.sqlite3"  # Label Studio's default name in its data directory
MIGRATED_DIR = "d2ops-migrated-db"
QUIET = {"LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false", "LOG_LEVEL": "WARNING"}


class StudioUnavailable(RuntimeError):
    """No label-studio executable, or the server did not come up: one line saying which (``log``: its log)."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class StudioServer:
    url: str
    token: str
    user: str
    start_seconds: float  # from spawning the process to /health answering
    migrate_seconds: float  # migrating the template database for this start (0: an earlier one was used)
    log: Path


def executable() -> Path | None:
    """``$D2OPS_LABEL_STUDIO``, else the tool environment's ``label-studio``; None when neither is there."""
    candidates = [Path(os.environ[ENV_OVERRIDE])] if os.environ.get(ENV_OVERRIDE) else []
    candidates.append(tool_env_executable("label-studio"))
    return next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


def template_path(tool: Path) -> Path:
    """Where the migrated empty database of ``tool``'s environment lives (``<env>/bin/label-studio``)."""
    return tool.parent.parent / MIGRATED_DIR / DATABASE


def migrated_database(tool: Path) -> tuple[Path | None, float]:
    """(an empty, fully migrated database for ``tool``, seconds spent migrating it now: 0 when it was there);
    (None, seconds) where it cannot be made (a read-only environment, a failed run): a server then migrates its own.

    ``label-studio version`` migrates its data directory and exits; it runs in a scratch directory and the
    database is moved into place with one rename, so a concurrent start sees a whole database or none."""
    target = template_path(tool)
    if target.is_file():
        return target, 0.0
    began = time.monotonic()
    try:
        target.parent.mkdir(exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".migrating-", dir=target.parent))
    except OSError:
        return None, 0.0
    try:
        done = subprocess.run([str(tool), "version"], env={**os.environ, **QUIET,
                                                           "LABEL_STUDIO_BASE_DATA_DIR": str(scratch)},
                              capture_output=True, timeout=START_TIMEOUT_S, check=False)
        if done.returncode != 0 or not (scratch / DATABASE).is_file():
            return None, time.monotonic() - began
        os.replace(scratch / DATABASE, target)
        return target, time.monotonic() - began
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - began
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
def studio_server(data_dir: Path, tool: Path, user: str = "labeller@d2ops.local") -> Iterator[StudioServer]:
    """Start ``tool`` with its data in ``data_dir`` (from a copy of the migrated template where one can be had),
    yield once /health answers, always stop it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    template, migrate_seconds = migrated_database(tool)
    if template is not None and not (data_dir / DATABASE).exists():
        shutil.copyfile(template, data_dir / DATABASE)
    url = f"http://127.0.0.1:{_free_port()}"
    password, token = secrets.token_urlsafe(16), secrets.token_hex(20)
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir), "LABEL_STUDIO_USERNAME": user,
           "LABEL_STUDIO_PASSWORD": password, "LABEL_STUDIO_USER_TOKEN": token,
           "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", **QUIET}
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
                                        f"its log: {log}", log)
            if time.monotonic() - started > START_TIMEOUT_S:
                raise StudioUnavailable(f"Label Studio did not answer {url}/health within {START_TIMEOUT_S:.0f} s; "
                                        f"its log: {log}", log)
            time.sleep(0.5)
        yield StudioServer(url=url, token=token, user=user, start_seconds=time.monotonic() - started,
                           migrate_seconds=migrate_seconds, log=log)
    finally:
        _stop(process)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.labelling.studio_server",
                                     description="Label Studio's migrated empty database (make setup runs it once).")
    parser.add_argument("command", choices=["migrate"])
    parser.parse_args(argv)
    tool = executable()
    if tool is None:
        print(f"label-studio not found (make setup creates .venv-tools/label-studio, or set {ENV_OVERRIDE})",
              file=sys.stderr)
        return 1
    template, seconds = migrated_database(tool)
    if template is None:
        print(f"migrating Label Studio's database with {tool} failed after {seconds:.1f} s "
              f"(run `{tool} version` to see why)", file=sys.stderr)
        return 1
    print(f"{template}: migrated in {seconds:.1f} s" if seconds else f"{template}: already migrated (0.0 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
