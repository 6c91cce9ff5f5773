"""One loopback HTTP endpoint for the AWS APIs moto cannot serve the way the pipeline needs.

The services it serves are `d2ops.offline.services.SERVICES` (Step Functions, SageMaker's jobs and
endpoints, SageMaker Runtime, SageMaker's Service Quotas), each in its own module; a request goes
to the first that accepts it (by its ``X-Amz-Target`` prefix or its REST path), and what a service
leaves to moto is forwarded to the moto server (marked as forwarded: `MotoUpstream`). boto3 reaches
it through each service's ``AWS_ENDPOINT_URL_*`` variable. Before any service sees a request,
``check`` (the runtime sets `d2ops.offline.caller_check.CallerCheck`) may refuse it: foreign Host, no
valid signature by the runtime's credentials, a member outside its pattern, an entrypoint the
pipeline does not run.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from d2ops.offline.loopback import LoopbackServer
from d2ops.offline.request_body import BadContentLength, content_length
from d2ops.offline.services.base import EmulatedService, WireRequest, WireResponse

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # generous for images; refuses absurd requests before reading them
# Marks a request the endpoint forwards to moto, whose signature the endpoint's check verified; its value is
# the runtime's forward secret (`d2ops.offline.caller_check.MotoCallerCheck` compares and removes it).
FORWARDED_HEADER = "X-D2ops-Forwarded"


class MotoUpstream:
    """moto's server, reached with the request's own headers and, when given, the runtime's forward secret.

    moto's port answers only requests signed with the runtime's credentials (`caller_check.MotoCallerCheck`);
    a forwarded request's signature no longer matches (its Host is moto's, its X-Amz-Target or body may be
    rewritten). The endpoint's own check verified it before any service saw it, so it travels with
    `FORWARDED_HEADER` instead of a new signature: one secret compared in constant time, where re-signing
    would mean signing with the runtime's own credentials whatever the forwarder built, which proves no
    more, and would change which service moto dispatches to if the scope were rebuilt differently
    (moto picks the service from the caller's credential scope, kept here as sent).
    """

    def __init__(self, moto_url: str, forward_secret: str | None = None) -> None:
        self.url = moto_url.rstrip("/")
        self.forward_secret = forward_secret

    def forward(self, request: WireRequest, *, target: str | None = None,
                body: bytes | None = None) -> WireResponse:
        headers = {k: (target if target is not None and k.lower() == "x-amz-target" else v)
                   for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", FORWARDED_HEADER.lower())}
        if self.forward_secret is not None:
            headers[FORWARDED_HEADER] = self.forward_secret
        upstream = urllib.request.Request(self.url + request.path, data=request.body if body is None else body,
                                          headers=headers, method="POST")
        try:
            with urllib.request.urlopen(upstream, timeout=60) as response:
                status, data, content_type = response.status, response.read(), response.headers.get("Content-Type")
        except urllib.error.HTTPError as err:
            status, data, content_type = err.code, err.read(), err.headers.get("Content-Type")
        return WireResponse(status, data, content_type or "application/x-amz-json-1.1")


class AwsEndpoint:
    """Owns the HTTP server thread; services are added (`add`) before or after it starts."""

    def __init__(self, moto_url: str, host: str = "127.0.0.1", port: int = 0, *,
                 forward_secret: str | None = None) -> None:
        self.moto_url = moto_url.rstrip("/")
        self.upstream = MotoUpstream(self.moto_url, forward_secret)
        self.services: list[EmulatedService] = []
        # Asked first for every request: None lets it through, else its answer is the refusal (caller_check).
        self.check: Callable[[WireRequest], WireResponse | None] | None = None
        self._loopback = LoopbackServer(
            {"POST": self._handle,
             "GET": lambda handler: self._reply(handler, WireResponse(404, b'{"message":"not found"}',
                                                                      "application/json"))},
            host=host, port=port, thread_name="offline-gateway", log_name="gateway", logger=log)
        self.server = self._loopback.server
        self.url = self._loopback.url

    def add(self, service: EmulatedService) -> None:
        """Serve ``service``'s requests (asked after those added before it)."""
        self.services.append(service)

    def start(self) -> None:
        self._loopback.start()

    def stop(self) -> None:
        self._loopback.stop()

    # ----- request handling ----------------------------------------------------------------
    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, response: WireResponse) -> None:
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.content_type)
        handler.send_header("Content-Length", str(len(response.body)))
        for key, value in response.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(response.body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            length = content_length(handler.headers)
        except BadContentLength as exc:
            handler.close_connection = True
            self._reply(handler, WireResponse.json(exc.status, {"message": exc.message}, "application/json"))
            return
        if length > MAX_BODY:
            self._reply(handler, WireResponse.json(413, {"message": f"request body over {MAX_BODY} bytes"},
                                                   "application/json"))
            handler.close_connection = True
            return
        body = handler.rfile.read(length) if length else b""
        self._reply(handler, self.dispatch(WireRequest(handler.path, handler.headers, body)))

    def dispatch(self, request: WireRequest) -> WireResponse:
        """The answer of the first service that accepts ``request`` (once ``check`` lets it through)."""
        refusal = self.check(request) if self.check is not None else None
        if refusal is not None:
            return refusal
        for service in self.services:
            if service.accepts(request):
                return service.handle(request, self.upstream)
        return WireResponse(400, json.dumps({"__type": "UnknownOperationException",
                                             "message": f"no offline service for {request.target or request.path}"})
                            .encode(), "application/x-amz-json-1.0")
