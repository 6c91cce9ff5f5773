"""``d2ops console``: a small web page on loopback to follow runs, read their reports and try the endpoint.

The page (``d2ops/console/``: HTML, plain JavaScript and CSS, nothing fetched from elsewhere)
reads everything through the status API, proxied by this server: the offline runtime's, or a
deployed stack's with ``--stack`` (requests signed with the caller's AWS credentials). The
"try an image" box posts the picture here and this server calls the endpoint's InvokeEndpoint
(the offline endpoint through the runtime's gateway, or SageMaker's with ``--stack``). On a run waiting for
review, the Approve / Reject pair posts the decision here and this server sends it to the status API's
``POST /runs/{runId}/decision`` as the console's caller (offline: the runtime's user, a session of the offline
reviewer role; ``--stack``: your AWS credentials, which must be a session of the stack's ReviewerRole).

The server listens on 127.0.0.1 only. It answers only requests addressed to it by that host
(a page elsewhere cannot reach it through DNS rebinding), and a POST must carry the
``X-D2ops-Console`` header, which a cross-site form cannot set.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from d2ops.commands.errors import UsageError
from d2ops.commands.status import StatusApi, add_stack_arguments, open_status_api
from d2ops.offline.loopback import LoopbackServer
from d2ops_core.run_ids import RUN_ID_CHARS

log = logging.getLogger(__name__)

STATIC_FILES = {"index.html": "text/html; charset=utf-8", "console.js": "text/javascript; charset=utf-8",
                "console.css": "text/css; charset=utf-8"}
# The status API routes the page may read (GET); anything else is not proxied.
API_ROUTES = re.compile(rf"^/(runs|models|runs/{RUN_ID_CHARS}(/(graph|validation|evaluation))?|"
                        r"endpoints/[A-Za-z0-9-]{1,63}/(history|monitoring))$")
INVOKE_ROUTE = re.compile(r"^/api/endpoints/(?P<name>[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})/invocations$")
DECISION_ROUTE = re.compile(rf"^/api/runs/(?P<run>{RUN_ID_CHARS})/decision$")
MAX_DECISION_BYTES = 16 * 1024  # {"decision", "reason"}: a reason is at most 1000 characters
MAX_IMAGE_BYTES = 6 * 1024 * 1024  # SageMaker's real-time InvokeEndpoint payload limit
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/gif", "image/tiff")
CONSOLE_HEADER = "X-D2ops-Console"

# InvokeEndpoint(endpoint_name, body, content_type, custom_attributes) -> (status, JSON answer)
Invoke = Callable[[str, bytes, str, str | None], tuple[int, Any]]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("console", help="a web page on 127.0.0.1 showing runs, their graph and reports, the "
                                              "endpoint's history, and a box to try an image")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one, printed)")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
    add_stack_arguments(p)
    p.set_defaults(func=run)


def static_file(name: str) -> bytes:
    return resources.files("d2ops.console").joinpath(name).read_bytes()


def _problem(status: int, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"statusCode": status, "message": message}


def invoke_with(runtime: Any) -> Invoke:
    """An :data:`Invoke` over a boto3 ``sagemaker-runtime`` client, errors as the endpoint's answer."""
    from botocore.exceptions import BotoCoreError, ClientError

    def invoke(name: str, body: bytes, content_type: str, custom_attributes: str | None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"EndpointName": name, "Body": body, "ContentType": content_type,
                                  "Accept": "application/json"}
        if custom_attributes:
            kwargs["CustomAttributes"] = custom_attributes
        try:
            answer = runtime.invoke_endpoint(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if error.get("Code") == "ModelError":  # the container's own 4xx (undecodable image ...)
                original = exc.response.get("OriginalStatusCode")
                status = int(original) if isinstance(original, int) and 400 <= original < 500 else 502
                return _problem(status, str(exc.response.get("OriginalMessage") or error.get("Message")))
            if error.get("Code") == "ValidationError":  # SageMaker's answer for a missing endpoint
                return _problem(404, str(error.get("Message") or f"no endpoint {name!r}"))
            return _problem(502, f"InvokeEndpoint failed: {error.get('Code')}: {error.get('Message')}")
        except BotoCoreError as exc:
            return _problem(502, f"the endpoint could not be reached: {exc}")
        data = answer["Body"].read()
        try:
            return 200, json.loads(data)
        except ValueError:
            return _problem(502, f"the endpoint answered {answer.get('ContentType')}, not JSON")

    return invoke


@dataclass
class Console:
    """The HTTP server: static page, status API proxy, endpoint proxy."""

    api: StatusApi
    invoke: Invoke
    port: int = 0

    def __post_init__(self) -> None:
        self._loopback = LoopbackServer({"GET": self._get, "POST": self._post}, port=self.port,
                                         thread_name="d2ops-console", log_name="console", logger=log)
        self.server = self._loopback.server
        self.url = self._loopback.url + "/"

    def start(self) -> Console:
        self._loopback.start()
        return self

    def stop(self) -> None:
        self._loopback.stop()

    def __enter__(self) -> Console:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- request handling ---------------------------------------------------------------
    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Cache-Control", "no-store")
        handler.send_header("X-Content-Type-Options", "nosniff")
        handler.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' blob: data:; "
                                                       "style-src 'self'; script-src 'self'")
        handler.end_headers()
        handler.wfile.write(body)

    def _json(self, handler: BaseHTTPRequestHandler, status: int, document: Any) -> None:
        self._send(handler, status, json.dumps(document).encode(), "application/json")

    def _addressed_to_us(self, handler: BaseHTTPRequestHandler) -> bool:
        port = self.server.server_address[1]
        if handler.headers.get("Host") in (f"127.0.0.1:{port}", f"localhost:{port}"):
            return True
        self._json(handler, 403, {"message": "the console answers only requests to 127.0.0.1 or localhost"})
        return False

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        if not self._addressed_to_us(handler):
            return
        parts = urlsplit(handler.path)
        name = "index.html" if parts.path == "/" else parts.path.lstrip("/")
        if name in STATIC_FILES:
            self._send(handler, 200, static_file(name), STATIC_FILES[name])
            return
        if not parts.path.startswith("/api/"):
            self._json(handler, 404, {"message": f"nothing at {parts.path}"})
            return
        route = parts.path[len("/api"):]
        if not API_ROUTES.match(route):
            self._json(handler, 404, {"message": f"the console does not proxy {route}"})
            return
        self._json(handler, *self._read_api(route + (f"?{parts.query}" if parts.query else "")))

    def _read_api(self, path: str) -> tuple[int, Any]:
        from d2ops.sigv4 import StatusApiError

        try:
            return 200, self.api.get(path)
        except StatusApiError as err:
            return _problem(err.status, err.message)
        except OSError as exc:  # the status API went away (the runtime stopped)
            return _problem(502, f"the status API could not be reached: {exc}")

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        if not self._addressed_to_us(handler):
            return
        from d2ops.offline.request_body import BadContentLength, content_length

        try:
            length = content_length(handler.headers)
        except BadContentLength as exc:
            handler.close_connection = True
            self._json(handler, exc.status, {"message": exc.message})
            return
        path = urlsplit(handler.path).path
        found, decision = INVOKE_ROUTE.match(path), DECISION_ROUTE.match(path)
        if found is None and decision is None:
            handler.close_connection = True
            self._json(handler, 404, {"message": "only POST /api/endpoints/<name>/invocations and "
                                                 "/api/runs/<run id>/decision"})
            return
        if handler.headers.get(CONSOLE_HEADER) != "1":
            handler.close_connection = True
            self._json(handler, 403, {"message": f"requests from the console page carry {CONSOLE_HEADER}: 1"})
            return
        if decision is not None:
            self._decide(handler, decision["run"], length)
            return
        assert found is not None
        if length > MAX_IMAGE_BYTES:
            handler.close_connection = True  # the body is not read
            self._json(handler, 413, {"message": f"the image is {length} bytes; the endpoint takes at most "
                                                 f"{MAX_IMAGE_BYTES}"})
            return
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        body = handler.rfile.read(length) if length else b""
        if content_type not in IMAGE_TYPES:
            self._json(handler, 415, {"message": f"send an image ({', '.join(IMAGE_TYPES)}), not "
                                                 f"{content_type or 'no Content-Type'}"})
            return
        if not body:
            self._json(handler, 400, {"message": "the request has no image"})
            return
        threshold = handler.headers.get("X-Score-Threshold")
        attributes = None
        if threshold:
            try:
                value = float(threshold)
            except ValueError:
                value = -1.0
            if not 0.0 <= value <= 1.0:
                self._json(handler, 400, {"message": f"X-Score-Threshold {threshold!r}: a number from 0 to 1"})
                return
            attributes = f"score_threshold={value}"
        self._json(handler, *self.invoke(found["name"], body, content_type, attributes))

    def _decide(self, handler: BaseHTTPRequestHandler, run_id: str, length: int) -> None:
        """The page's Approve / Reject: the JSON body passed on to the status API's decision route, its answer
        (or refusal: 403 not a reviewer, 404 not waiting, 409 decided) passed back."""
        from d2ops.sigv4 import StatusApiError

        if length > MAX_DECISION_BYTES:
            handler.close_connection = True  # the body is not read
            self._json(handler, 413, {"message": f"the decision is {length} bytes; at most {MAX_DECISION_BYTES}"})
            return
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        body = handler.rfile.read(length) if length else b""
        if content_type != "application/json":
            self._json(handler, 415, {"message": f"send JSON, not {content_type or 'no Content-Type'}"})
            return
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            self._json(handler, 400, {"message": "the decision is not JSON: {\"decision\": \"approve\"|\"reject\", "
                                                 "\"reason\": ...}"})
            return
        try:
            self._json(handler, 200, self.api.call("POST", f"/runs/{run_id}/decision", document))
        except StatusApiError as err:
            self._json(handler, *_problem(err.status, err.message))
        except OSError as exc:  # the status API went away (the runtime stopped)
            self._json(handler, *_problem(502, f"the status API could not be reached: {exc}"))


def run(args: argparse.Namespace) -> int:
    import time

    with open_status_api(args) as api, Console(api, _invoker(args, api), port=args.port) as console:
        print(f"d2ops console: {console.url}  (Ctrl-C to stop)", flush=True)
        try:
            # Short sleeps: the kernel may hand Ctrl-C's SIGINT to a server thread, and Python then raises
            # KeyboardInterrupt here only once this thread wakes (a one-hour sleep kept it up to an hour).
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopped", flush=True)
    return 0


def _invoker(args: argparse.Namespace, api: Any) -> Invoke:
    import boto3

    if getattr(args, "stack", None):
        session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
        return invoke_with(session.client("sagemaker-runtime"))
    # Offline: the runtime's gateway serves SageMaker Runtime beside Step Functions.
    from d2ops.offline.stack import REGION

    gateway = getattr(getattr(api, "sfn", None), "meta", None)
    if gateway is None:
        raise UsageError("the offline runtime exposes no gateway to reach its endpoint")
    # The runtime's own credentials (OfflineApis): its gateway answers no others.
    session = api.session()
    return invoke_with(session.client("sagemaker-runtime", region_name=REGION, endpoint_url=gateway.endpoint_url))
