"""A server outlives no d2ops process that was killed without stopping it.

``d2ops serve``, ``d2ops demo`` and the tests start the serving entry point in a session of its own (so that
stopping it reaches TorchServe's JVM and Ray's dozen processes). Killed with SIGKILL, the starter cannot stop
it; the entry point, started with D2OPS_STOP_WITH_PARENT=1 by LocalEndpoint, sees it has been reparented and
stops its server's whole group. Without that, every cut-short run left servers holding ports and gigabytes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from model_code.serving import backends
from model_code.serving.backends import BACKENDS
from tests.fixtures.serving.support import cached_artifact, still_running

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
STARTER = """
import sys, time
from d2ops.local.serving import LocalEndpoint
endpoint = LocalEndpoint(sys.argv[1], workdir=sys.argv[2], startup_timeout=240, backend=sys.argv[3]).start()
print(endpoint.proc.pid, flush=True)
time.sleep(3600)
"""


def group_members(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_stops_when_the_process_that_started_it_is_killed(tmp_path: Path, backend: str) -> None:
    # Mutation caught: the entry point not watching its parent (or LocalEndpoint not asking it to): the server's
    # processes are still running a minute after their starter died.
    workdir = tmp_path / "serve"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(cached_artifact()), str(workdir), backend],
                               stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    processes: list[psutil.Process] = []
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()  # after /ping answered 200
        assert line.strip().isdigit(), f"the starter did not start the server: {line!r}"
        entry = psutil.Process(int(line))
        server_group = int((workdir / backends.PID_FILE).read_text())
        processes = [entry, *entry.children(recursive=True), *group_members(server_group)]
        assert len(processes) > 2
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=30)
        deadline = time.monotonic() + 90
        while still_running(processes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert still_running(processes) == [], "the server outlived the process that started it"
        assert "has exited; stopping" in (workdir / "serve.log").read_text(errors="replace")
    finally:
        if starter.poll() is None:
            starter.kill()
        for p in processes:  # whatever a failed run left
            try:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                continue
