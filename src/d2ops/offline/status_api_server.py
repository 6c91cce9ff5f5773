"""The status API on loopback: HTTP requests -> API Gateway HTTP API (payload 2.0) events -> handler.

Routes come from the function's ``HttpApi`` events in template.yaml, so the local API answers
exactly the routes the deployed one has (others get API Gateway's 404 ``{"message":"Not
Found"}``). The handler's response document becomes the HTTP response. Like the deployed API's
IAM authorizer, requests must carry a SigV4 signature (service ``execute-api``) by known
credentials: unsigned or badly signed requests get API Gateway's 403 (`d2ops.sigv4.verify`), and
the event's ``iam`` authorizer block names the signer (:class:`IamCaller`).

Who a key signs as is the server's ``callers`` map. The offline runtime's credentials are its one
identity, and it is the developer at the keyboard: they sign as a session of the offline stack's
ReviewerRole (:func:`reviewer_session`), so ``d2ops approve`` and the console may decide a review
offline as a reviewer does in the cloud. A test signs as someone else with :meth:`HttpApi.add_caller`.
"""

from __future__ import annotations

import base64
import getpass
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from botocore.credentials import Credentials

from d2ops.offline.loopback import LoopbackServer
from d2ops.offline.request_body import BadContentLength, content_length
from d2ops.offline.stack import ACCOUNT_ID, HttpRoute, OfflineStack
from d2ops.sigv4 import SignatureRejected, verify

log = logging.getLogger(__name__)
MAX_BODY = 1024 * 1024

Invoke = Callable[[str, dict[str, Any]], Any]  # (function logical id, event) -> response document
# The status API function's variable naming the role that may decide reviews (template.yaml).
REVIEWER_ROLE_VARIABLE = "REVIEWER_ROLE_ARN"
_ROLE_ARN = re.compile(r"^arn:(?P<partition>[^:]+):iam::(?P<account>\d{12}):role/(?:[^/]+/)*(?P<name>[^/]+)$")


@dataclass(frozen=True)
class IamCaller:
    """Who signed a request, as API Gateway's AWS_IAM authorizer reports it (payload 2.0's
    ``requestContext.authorizer.iam``): an IAM user's ARN, or for a role session
    ``arn:<partition>:sts::<account>:assumed-role/<role name>/<session>``."""

    access_key: str
    user_arn: str
    user_id: str  # the principal's unique id; a role session's is "<role id>:<session>"

    def authorizer(self, account_id: str) -> dict[str, Any]:
        return {"iam": {"accessKey": self.access_key, "accountId": account_id, "callerId": self.user_id,
                        "cognitoIdentity": None, "principalOrgId": None, "userArn": self.user_arn,
                        "userId": self.user_id}}


def offline_user(access_key: str, account_id: str) -> IamCaller:
    """A signer the server knows no identity for: an IAM user of the offline account."""
    return IamCaller(access_key, f"arn:aws:iam::{account_id}:user/offline", "AIDAOFFLINE")


def session_name() -> str:
    """The developer's login name as a role session name (2-64 of ``[\\w+=,.@-]``), else "offline"."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name and no LOGNAME/USER: a bare container
        return "offline"
    name = re.sub(r"[^\w+=,.@-]", "-", name, flags=re.ASCII)[:64]
    return name if len(name) >= 2 else "offline"


def reviewer_session(stack: OfflineStack, access_key: str, session: str | None = None) -> IamCaller:
    """``access_key`` signing as a session of the stack's reviewer role (the status API function's
    ``REVIEWER_ROLE_ARN``); an IAM user when the stack names none."""
    role = next((fn.environment[REVIEWER_ROLE_VARIABLE] for fn in stack.functions.values()
                 if REVIEWER_ROLE_VARIABLE in fn.environment), "")
    found = _ROLE_ARN.match(role)
    if found is None:
        return offline_user(access_key, ACCOUNT_ID)
    session = session or session_name()
    return IamCaller(access_key, f"arn:{found['partition']}:sts::{found['account']}:assumed-role/{found['name']}/"
                                 f"{session}", f"AROAOFFLINEREVIEWER:{session}")


def _route_regex(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[A-Za-z0-9_]+\+?\})", path)
    pattern = ""
    for part in parts:
        if part.startswith("{") and part.endswith("+}"):
            pattern += f"(?P<{part[1:-2]}>.+)"
        elif part.startswith("{"):
            pattern += f"(?P<{part[1:-1]}>[^/]+)"
        else:
            pattern += re.escape(part)
    return re.compile(f"^{pattern}$")


def http_event(method: str, raw_path: str, query: str, headers: dict[str, str], body: bytes,
               route: HttpRoute | None, path_parameters: dict[str, str], account_id: str,
               source_ip: str = "127.0.0.1", access_key: str = "offline",
               caller: IamCaller | None = None) -> dict[str, Any]:
    """An API Gateway HTTP API payload-2.0 event, as the Lambda integration receives it (signed by ``caller``,
    default an IAM user of the account with ``access_key``)."""
    caller = caller or offline_user(access_key, account_id)
    now = datetime.now(UTC)
    lower = {k.lower(): v for k, v in headers.items()}
    query_params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        # Payload 2.0 joins repeated query parameters with commas.
        query_params[key] = f"{query_params[key]},{value}" if key in query_params else value
    text_types = ("application/json", "text/", "application/x-www-form-urlencoded")
    is_text = not body or any(lower.get("content-type", "").startswith(t) for t in text_types)
    if is_text and body:
        try:  # a "text" body that is not UTF-8 travels base64-encoded: the function, not the adapter, refuses it
            body.decode("utf-8")
        except UnicodeDecodeError:
            is_text = False
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": f"{route.method} {route.path}" if route else "$default",
        "rawPath": raw_path,
        "rawQueryString": query,
        "headers": lower,
        "requestContext": {
            "accountId": account_id, "apiId": "offline", "domainName": lower.get("host", "localhost"),
            "domainPrefix": "offline", "requestId": str(uuid.uuid4()),
            "routeKey": f"{route.method} {route.path}" if route else "$default", "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"), "timeEpoch": int(time.time() * 1000),
            "http": {"method": method, "path": raw_path, "protocol": "HTTP/1.1", "sourceIp": source_ip,
                     "userAgent": lower.get("user-agent", "")},
            "authorizer": caller.authorizer(account_id),
        },
        "isBase64Encoded": not is_text,
    }
    if query_params:
        event["queryStringParameters"] = query_params
    if path_parameters:
        event["pathParameters"] = path_parameters
    if body:
        event["body"] = body.decode("utf-8") if is_text else base64.b64encode(body).decode()
    return event


class HttpApi:
    """A ThreadingHTTPServer that turns requests into events for ``invoke``."""

    def __init__(self, routes: list[HttpRoute], invoke: Invoke, account_id: str, host: str = "127.0.0.1",
                 port: int = 0, *, credentials: Mapping[str, Credentials], region: str,
                 callers: Mapping[str, IamCaller] | None = None) -> None:
        self.routes = [(route, _route_regex(route.path)) for route in routes]
        self.invoke = invoke
        self.account_id = account_id
        self.credentials = dict(credentials)  # access key id -> what the IAM authorizer accepts
        self.callers = dict(callers or {})  # access key id -> who it signs as (default: offline_user)
        self.region = region
        self._loopback = LoopbackServer(dict.fromkeys(("GET", "POST", "PUT", "DELETE"), self._handle), host=host,
                                         port=port, thread_name="offline-status-api", log_name="status api",
                                         logger=log)
        self.server = self._loopback.server
        self.url = self._loopback.url

    def start(self) -> None:
        self._loopback.start()

    def stop(self) -> None:
        self._loopback.stop()

    def add_caller(self, credentials: Credentials, user_arn: str) -> None:
        """Accept ``credentials`` as well, signing as ``user_arn`` (tests: a caller who may not decide)."""
        self.callers[credentials.access_key] = IamCaller(credentials.access_key, user_arn, "AIDAOTHER")
        self.credentials[credentials.access_key] = credentials

    def match(self, method: str, path: str) -> tuple[HttpRoute, dict[str, str]] | None:
        for route, regex in self.routes:
            found = regex.match(path)
            if found and route.method == method:
                return route, found.groupdict()
        return None

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        try:
            length = content_length(handler.headers)
        except BadContentLength as exc:
            handler.close_connection = True
            self._send(handler, exc.status, json.dumps({"message": exc.message}).encode(),
                       {"Content-Type": "application/json"})
            return
        if length > MAX_BODY:
            # API Gateway refuses payloads over its limit before the function sees them.
            self._send(handler, 413, b'{"message":"Request Entity Too Large"}', {"Content-Type": "application/json"})
            handler.close_connection = True
            return
        body = handler.rfile.read(length) if length else b""
        found = self.match(handler.command, parts.path)
        if found is None:
            self._send(handler, 404, b'{"message":"Not Found"}', {"Content-Type": "application/json"})
            return
        route, params = found
        # The signature covers the URL the client addressed: its Host header, path and raw query.
        url = f"http://{handler.headers.get('Host') or self.url.partition('://')[2]}{handler.path}"
        try:
            caller = verify(handler.command, url, dict(handler.headers.items()), body, self.credentials, self.region)
        except SignatureRejected as exc:
            self._send(handler, 403, json.dumps({"message": exc.message}).encode(),
                       {"Content-Type": "application/json", "x-amzn-ErrorType": exc.error_type})
            return
        event = http_event(handler.command, parts.path, parts.query, dict(handler.headers.items()), body, route,
                           params, self.account_id, handler.client_address[0], caller.access_key,
                           self.callers.get(caller.access_key))
        try:
            response = self.invoke(route.function, event)
        except Exception:
            log.exception("status API function failed")
            self._send(handler, 500, b'{"message":"Internal Server Error"}', {"Content-Type": "application/json"})
            return
        self._reply(handler, response)

    def _reply(self, handler: BaseHTTPRequestHandler, response: Any) -> None:
        # Payload 2.0: a dict without statusCode is a 200 JSON body (API Gateway's inference).
        if not isinstance(response, dict) or "statusCode" not in response:
            self._send(handler, 200, json.dumps(response).encode(), {"Content-Type": "application/json"})
            return
        raw = response.get("body") or ""
        data = base64.b64decode(raw) if response.get("isBase64Encoded") else str(raw).encode("utf-8")
        headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
        headers.setdefault("Content-Type", "application/json")
        for key, values in (response.get("multiValueHeaders") or {}).items():
            headers[str(key)] = ",".join(str(v) for v in values)
        self._send(handler, int(response["statusCode"]), data, headers)
