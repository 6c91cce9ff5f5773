"""The length of a request body, for the local HTTP servers (offline gateway, API Gateway, console).

``int(headers["Content-Length"] or 0)`` raised ValueError on "abc" or on two comma-joined values
(the handler thread died, the client got no answer), and a negative length made ``rfile.read(-1)``
read to the end of the stream, which on a kept-alive connection waits forever. A chunked body is
not decoded by ``http.server``: its bytes would be parsed as the next request.
"""

from __future__ import annotations

from collections.abc import Mapping


class BadContentLength(ValueError):
    """The body's length cannot be known: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def content_length(headers: Mapping[str, str]) -> int:
    """The Content-Length as a non-negative int (0 when absent); BadContentLength when it is not one."""
    encoding = (headers.get("Transfer-Encoding") or "").strip().lower()
    if encoding and encoding != "identity":
        raise BadContentLength(411, f"Transfer-Encoding {encoding!r} is not supported: send the body with a "
                                    "Content-Length")
    raw = headers.get("Content-Length")
    if raw is None or raw.strip() == "":
        return 0
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise BadContentLength(400, f"Content-Length {raw[:40]!r} is not a non-negative integer")
    return int(text)
