"""A client that hangs up on the offline runtime's HTTP servers (gateway, status API, console) costs one log line,
never a traceback on the user's stderr; a handler's real error still reaches the log with its traceback."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from d2ops.offline.loopback import LoopbackServer

# Outside the "d2ops" hierarchy on purpose: with POWERTOOLS_SERVICE_NAME=d2ops, a handler test earlier in the
# session leaves Powertools' "d2ops" logger writing to a capture stream pytest has closed since.
LOGGER = "tests.loopback_hangup"


def _answer(handler: BaseHTTPRequestHandler) -> None:
    length = int(handler.headers.get("Content-Length", 0))
    handler.rfile.read(length)
    if handler.path == "/hang-up":
        # answer only once the client has reset the connection, so the write meets the reset (no sleep race)
        _client_gone.wait(5)
    if handler.path == "/boom":
        raise RuntimeError("handler bug")
    body = b"x" * 200_000
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


_client_gone = threading.Event()


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    _client_gone.clear()
    loopback = LoopbackServer({"POST": _answer}, thread_name="test-loopback", log_name="gateway",
                              logger=logging.getLogger(LOGGER))
    loopback.start()
    try:
        yield loopback
    finally:
        loopback.stop()


def _reset_after_request(url: str, path: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends a RST
    client.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode())
    time.sleep(0.05)  # let the server read the request before the reset (else it only sees a reset request line)
    client.close()
    _client_gone.set()


def _wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_client_reset_is_one_debug_line_and_server_keeps_answering(
        server: LoopbackServer, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # Catches: handle_error back to socketserver's default / no ConnectionError catch (traceback on stderr).
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    _reset_after_request(server.url, "/hang-up")
    _wait_for(lambda: any("hung up" in r.getMessage() for r in caplog.records))
    hung_up = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert len(hung_up) == 1
    assert hung_up[0].levelno == logging.DEBUG and hung_up[0].exc_info is None
    assert "/hang-up" in hung_up[0].getMessage() and "127.0.0.1:" in hung_up[0].getMessage()

    with urllib.request.urlopen(urllib.request.Request(server.url + "/next", data=b"abc"), timeout=5) as answer:
        assert answer.status == 200 and len(answer.read()) == 200_000
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err


def test_handler_error_goes_to_the_log_with_its_traceback(
        server: LoopbackServer, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # Catches: a handle_error that swallows real errors (lost) or prints them to stderr (the default).
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(urllib.request.Request(server.url + "/boom", data=b"abc"), timeout=5)
    _wait_for(lambda: any(r.levelno == logging.ERROR for r in caplog.records))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert isinstance(errors[0].exc_info[1], RuntimeError)
    assert "Traceback" not in capfd.readouterr().err
