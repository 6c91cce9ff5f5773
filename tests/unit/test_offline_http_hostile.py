"""Hostile Content-Length headers at the local HTTP servers: an answer naming the problem, never a hang.

``int(Content-Length)`` raised on "abc" (the client got no answer) and "-1" made the server read
to the end of a kept-alive connection, waiting forever.
"""

from __future__ import annotations

import socket

import pytest

from d2ops.commands.console import Console
from d2ops.offline.aws_endpoint import AwsEndpoint
from d2ops.offline.request_body import BadContentLength, content_length

HOSTILE = [("-1", 400), ("abc", 400), ("5, 5", 400), ("1" * 40, 400), ("\u0661", 400)]


def exchange(port: int, path: str, headers: dict[str, str]) -> bytes:
    """Send one POST with ``headers`` on a connection kept open, and read the answer (5 s at most)."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


@pytest.mark.parametrize(("value", "status"), HOSTILE)
def test_content_length_must_be_a_non_negative_integer(value: str, status: int) -> None:
    with pytest.raises(BadContentLength) as info:
        content_length({"Content-Length": value})
    assert info.value.status == status and "Content-Length" in info.value.message


def test_absent_and_plain_lengths_and_chunked_bodies() -> None:
    assert content_length({}) == 0 and content_length({"Content-Length": " 12 "}) == 12
    with pytest.raises(BadContentLength) as info:
        content_length({"Transfer-Encoding": "chunked"})
    assert info.value.status == 411


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "status"), HOSTILE[:2])
def test_the_gateway_and_the_console_answer_instead_of_waiting(value: str, status: int) -> None:
    gateway = AwsEndpoint("http://127.0.0.1:9")
    gateway.start()
    try:
        answer = exchange(gateway.server.server_address[1], "/", {"Content-Length": value,
                                                                  "X-Amz-Target": "AWSStepFunctions.ListExecutions"})
        assert answer.startswith(f"HTTP/1.1 {status}".encode()) and b"Content-Length" in answer, answer
    finally:
        gateway.stop()
    with Console(api=object(), invoke=lambda *a: (200, {})) as console:  # type: ignore[arg-type]
        port = console.server.server_address[1]
        answer = exchange(port, "/api/endpoints/e/invocations", {"Content-Length": value, "X-D2ops-Console": "1",
                                                                 "Content-Type": "image/png"})
        assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer
