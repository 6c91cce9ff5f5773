"""What must hold of an API Gateway event before Powertools' resolver may see it.

The resolver assumes an HTTP API (payload format 2.0) event and parses a request body with
``json.loads`` on the decoded text. Each of these raised out of the handler, so API Gateway
answered a bare 500: an event of another shape (a REST API 1.0 event, a console test event:
``KeyError``), a base64 body that is not UTF-8 (``UnicodeDecodeError``), a body nested
100k levels deep (``RecursionError``) or holding a 5000-digit integer (``ValueError``).
``check_event`` finds the first two before the resolver runs (no JSON parse: it only decodes
the text); the body is parsed once, by the resolver, through ``json_body`` (its
``json_body_deserializer``), which turns the last two into BadEnvelope. Either way the answer
is a 400 naming the problem. A body larger than any request the API takes (``MAX_BODY_CHARS``) is
refused before anything reads it: 413.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

# The largest body a route takes is a decision's: a 1000-character reason, each character at most 12 JSON
# characters (a surrogate pair's two \uXXXX escapes). API Gateway passes up to 10 MB; the API reads 64 KiB.
MAX_BODY_CHARS = 64 * 1024


class BadEnvelope(ValueError):
    """The event cannot be served; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _method(event: Mapping[str, Any]) -> str:
    context = event.get("requestContext")
    http = context.get("http") if isinstance(context, Mapping) else None
    method = http.get("method") if isinstance(http, Mapping) else None
    if not isinstance(method, str) or not isinstance(event.get("rawPath"), str):
        shape = ("an API Gateway REST API (payload format 1.0) event" if "httpMethod" in event
                 else "not an API Gateway event")
        raise BadEnvelope(400, f"the status API takes HTTP API requests (payload format 2.0, requestContext.http."
                               f"method and rawPath); this is {shape}")
    return method.upper()


def body_text(event: Mapping[str, Any]) -> str | None:
    """The request body as text (base64 undone), or None; BadEnvelope when it is not UTF-8 text."""
    body = event.get("body")
    if body is None or body == "":
        return None
    if not isinstance(body, str):
        raise BadEnvelope(400, f"request body arrived as {type(body).__name__}, not text")
    if len(body) > MAX_BODY_CHARS:
        raise BadEnvelope(413, f"request body is {len(body)} characters; the status API takes at most "
                               f"{MAX_BODY_CHARS}")
    if not event.get("isBase64Encoded"):
        return body
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadEnvelope(400, f"request body is marked base64 but is not valid base64: {exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadEnvelope(400, f"request body is not UTF-8 text: byte {exc.start} is {raw[exc.start]:#04x}") from exc


def check_event(event: Any) -> None:
    """Raise BadEnvelope when the resolver would fail on ``event``'s shape or body encoding.

    The body's JSON is not parsed here: a route that reads it parses it once, through ``json_body``.
    """
    if not isinstance(event, Mapping):
        raise BadEnvelope(400, f"the event is a JSON {type(event).__name__}, not an API Gateway request object")
    _method(event)
    body_text(event)


def json_body(text: str) -> Any:
    """The resolver's ``json_body_deserializer``: ``json.loads``, with every way it fails a BadEnvelope."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise BadEnvelope(400, "request body is not valid JSON: arrays/objects nest too deeply (the API takes "
                               "flat objects)") from exc
    except json.JSONDecodeError as exc:
        raise BadEnvelope(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno}, column "
                               f"{exc.colno}") from exc
    except ValueError as exc:  # Python's limit on the digits of an integer it converts
        raise BadEnvelope(400, "request body is not valid JSON: a number in it has more digits than any value "
                               "the API takes") from exc
