"""model_code.serving.process: the one /ping wait and process-group signal both servers use."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from model_code.serving import process


@pytest.fixture
def server() -> Iterator[tuple[str, list[int]]]:
    """A loopback server whose /ping answers the last code in the list."""
    codes = [503]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(codes[-1])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # fast shutdown()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/ping", codes
    finally:
        httpd.shutdown()


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_ping_reports_the_status_or_none_when_nothing_listens(server: tuple[str, list[int]]) -> None:
    url, codes = server
    assert process.ping(url) == 503
    codes.append(200)
    assert process.ping(url) == 200
    assert process.ping("http://127.0.0.1:9/ping", timeout=0.5) is None


def test_wait_healthy_returns_once_ping_is_200(server: tuple[str, list[int]]) -> None:
    url, codes = server
    codes.append(200)
    proc = _sleeper()
    try:
        assert process.wait_healthy(url, proc, timeout=30) >= 0
    finally:
        process.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def test_wait_healthy_fails_early_when_the_server_exits(server: tuple[str, list[int]]) -> None:
    url, _ = server
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(process.ServerExited, match=r"the server exited \(code 3\)"):
        process.wait_healthy(url, proc, timeout=30)


def test_wait_healthy_gives_up_after_the_timeout(server: tuple[str, list[int]]) -> None:
    url, _ = server  # stays 503: loading
    proc = _sleeper()
    try:
        with pytest.raises(process.NotHealthyInTime, match="not healthy after"):
            process.wait_healthy(url, proc, timeout=0.3, interval=0.05)
    finally:
        process.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    process.signal_group(proc.pid, signal.SIGKILL)  # gone already: not an error
