"""SigV4 for the status API: sign requests as a caller (``d2ops status --stack``, the console) and
verify them as API Gateway's IAM authorizer does (the offline status API; the offline runtime's AWS
endpoint and moto's server verify with the same `verify`, `d2ops.offline.caller_check`).

Both sides compute the signature with botocore's ``SigV4Auth`` (service ``execute-api``), so the
offline check exercises exactly the signing path a deployed stack sees.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.auth import SIGV4_TIMESTAMP, S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials

SERVICE = "execute-api"
# API Gateway refuses signatures more than five minutes away from its clock.
MAX_SKEW = timedelta(minutes=5)
STATUS_API_OUTPUT = "StatusApiUrl"  # the stack output (template.yaml) that holds the API's base URL

# API Gateway's answers to unsigned or badly signed requests (HTTP 403, {"message": ...}).
MISSING_TOKEN = "Missing Authentication Token"
BAD_SIGNATURE = ("The request signature we calculated does not match the signature you provided. Check your AWS "
                 "Secret Access Key and signing method. Consult the service documentation for details.")
INVALID_TOKEN = "The security token included in the request is invalid."
# S3's x-amz-content-sha256 values that stand for a body the signature does not cover (botocore sends the
# first over TLS, the second with a trailing flexible checksum in an aws-chunked body).
S3_UNSIGNED_PAYLOADS = frozenset({"UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"})

_AUTHORIZATION = re.compile(r"^AWS4-HMAC-SHA256 Credential=(?P<credential>[^,\s]+),"
                            r"\s*SignedHeaders=(?P<signed>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]{64})$")


class StatusApiError(Exception):
    """A status API answer other than 2xx: the HTTP status and the body's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class StackError(Exception):
    """The stack named on the command line cannot give a status API URL (missing stack, output, access)."""


@dataclass(frozen=True)
class SignedStatusApi:
    """A status API client whose every request carries a SigV4 signature (service ``execute-api``)."""

    base_url: str
    credentials: Credentials | ReadOnlyCredentials
    region: str
    timeout: float = 30.0

    def signed_headers(self, method: str, url: str, body: bytes = b"",
                       headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """The headers (Authorization, X-Amz-Date, X-Amz-Security-Token ...) to send with this request."""
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
        credentials = self.credentials
        if isinstance(credentials, ReadOnlyCredentials):
            credentials = Credentials(str(credentials.access_key), str(credentials.secret_key), credentials.token)
        SigV4Auth(credentials, SERVICE, self.region).add_auth(request)
        return dict(request.headers.items())

    def request(self, method: str, path: str, body: bytes = b"",
                headers: Mapping[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers) of one signed request; 4xx/5xx answers are returned, not raised."""
        url = self.base_url.rstrip("/") + path
        signed = self.signed_headers(method, url, body, headers)
        request = urllib.request.Request(url, data=body or None, headers=signed, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read(), dict(response.headers.items())
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers.items())

    def call(self, method: str, path: str, document: Any = None) -> Any:
        """A JSON request -> the JSON answer; non-2xx answers raise :class:`StatusApiError`."""
        body = json.dumps(document).encode() if document is not None else b""
        headers = {"Content-Type": "application/json"} if body else {}
        status, data, _ = self.request(method, path, body, headers)
        if not 200 <= status < 300:
            text = data.decode("utf-8", "replace")
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise StatusApiError(status, str(message))
        return json.loads(data) if data else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)


def status_api_url(cloudformation: Any, stack_name: str) -> str:
    """The stack's ``StatusApiUrl`` output (CloudFormation DescribeStacks)."""
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except cloudformation.exceptions.ClientError as exc:
        raise StackError(f"stack {stack_name!r}: {exc.response.get('Error', {}).get('Message', exc)}") from exc
    outputs = {o["OutputKey"]: o.get("OutputValue") for o in (stacks[0].get("Outputs") or [])} if stacks else {}
    url = outputs.get(STATUS_API_OUTPUT)
    if not url:
        raise StackError(f"stack {stack_name!r} has no {STATUS_API_OUTPUT} output (is it a d2ops stack, and is "
                         f"its deployment finished?)")
    return str(url)


def for_stack(stack_name: str, session: Any = None) -> SignedStatusApi:
    """A signed client for a deployed stack's status API, with the caller's AWS credentials and region."""
    import boto3  # here, not at import time: the offline server imports this module too

    session = session or boto3.session.Session()
    credentials = session.get_credentials()
    if credentials is None:
        raise StackError("no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run `aws configure`)")
    if not session.region_name:
        raise StackError("no AWS region configured (set AWS_REGION or AWS_DEFAULT_REGION, or use a profile with one)")
    url = status_api_url(session.client("cloudformation"), stack_name)
    return SignedStatusApi(url, credentials.get_frozen_credentials(), session.region_name)


# ----- verification (the offline IAM authorizer) -----------------------------------------------------
class SignatureRejected(Exception):
    """API Gateway's 403 for a request its IAM authorizer refuses.

    ``message`` is the body's message, ``error_type`` its ``x-amzn-ErrorType`` header.
    """

    status = 403

    def __init__(self, message: str, error_type: str = "InvalidSignatureException") -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type


@dataclass(frozen=True)
class Caller:
    """Who signed a verified request (what the ``iam`` authorizer block of the event reports)."""

    access_key: str


def verify(method: str, url: str, headers: Mapping[str, str], body: bytes, known: Mapping[str, Credentials],
           region: str, now: datetime | None = None, service: str | Collection[str] | None = SERVICE) -> Caller:
    """Recompute the request's signature with the signer's secret; raise :class:`SignatureRejected` unless equal.

    ``known`` maps access key ids to their credentials (the offline runtime knows only its own).
    ``url`` is the URL as the client addressed it (scheme, Host header, path and raw query, as sent).
    ``service``: the signing name the credential scope must name (any of several, when a collection; any
    at all when None, as moto's server, which serves every service, takes them). A scope naming ``s3`` is
    checked by S3's rules, as botocore's ``S3SigV4Auth`` signs: the path as sent (not normalised), and the
    ``x-amz-content-sha256`` header (required) as the payload hash, which is the body's SHA-256 unless it
    is one of `S3_UNSIGNED_PAYLOADS`.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    authorization = lower.get("authorization")
    if not authorization:
        raise SignatureRejected(MISSING_TOKEN, "MissingAuthenticationTokenException")
    match = _AUTHORIZATION.match(authorization.strip())
    if match is None:
        raise SignatureRejected(f"Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
                                f"parameters of AWS4-HMAC-SHA256. Authorization={authorization[:200]}",
                                "IncompleteSignatureException")
    access_key, _, scope = match["credential"].partition("/")
    date, _, rest = scope.partition("/")
    scope_region, _, rest = rest.partition("/")
    scope_service, _, terminator = rest.partition("/")
    services = (service,) if isinstance(service, str) else tuple(service) if service is not None else (scope_service,)
    if scope_service not in services or not scope_service or terminator != "aws4_request":
        raise SignatureRejected(f"Credential should be scoped to correct service: '{services[0]}'.")
    if scope_region != region:
        raise SignatureRejected(f"Credential should be scoped to a valid region, not '{scope_region}'.")
    amz_date = lower.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(amz_date, SIGV4_TIMESTAMP).replace(tzinfo=UTC)
    except ValueError:
        raise SignatureRejected("Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' "
                                "header.", "IncompleteSignatureException") from None
    if date != amz_date[:8]:
        raise SignatureRejected(f"Credential should be scoped to a valid date: '{amz_date[:8]}'.")
    now = now or datetime.now(UTC)
    if signed_at < now - MAX_SKEW:
        raise SignatureRejected(f"Signature expired: {amz_date} is now earlier than "
                                f"{(now - MAX_SKEW).strftime(SIGV4_TIMESTAMP)} ({now.strftime(SIGV4_TIMESTAMP)} - "
                                f"5 min.)")
    if signed_at > now + MAX_SKEW:
        raise SignatureRejected(f"Signature not yet current: {amz_date} is still later than "
                                f"{(now + MAX_SKEW).strftime(SIGV4_TIMESTAMP)} ({now.strftime(SIGV4_TIMESTAMP)} + "
                                f"5 min.)")
    credentials = known.get(access_key)
    if credentials is None:
        raise SignatureRejected(INVALID_TOKEN, "UnrecognizedClientException")
    # Secrets compared in constant time: how long a refusal takes says nothing about how much matched.
    if credentials.token and not hmac.compare_digest(lower.get("x-amz-security-token", "").encode(),
                                                     credentials.token.encode()):
        raise SignatureRejected(INVALID_TOKEN, "UnrecognizedClientException")
    signed_names = match["signed"].split(";")
    if "host" not in signed_names:
        raise SignatureRejected("'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.")
    missing = [name for name in signed_names if name not in lower]
    if missing:
        raise SignatureRejected(BAD_SIGNATURE)
    claimed = lower.get("x-amz-content-sha256")
    s3 = scope_service == "s3"
    if s3 and claimed is None:
        raise SignatureRejected("Missing required header for this request: x-amz-content-sha256",
                                "IncompleteSignatureException")
    if s3 and claimed is not None and claimed.startswith("STREAMING-") and claimed not in S3_UNSIGNED_PAYLOADS:
        # Each chunk of such a body carries its own signature; botocore never sends one, so none is checked here.
        raise SignatureRejected(f"x-amz-content-sha256 {claimed!r}: chunk-signed payloads are not accepted offline "
                                "(send the body's SHA-256, UNSIGNED-PAYLOAD or STREAMING-UNSIGNED-PAYLOAD-TRAILER)")
    if claimed is not None and not (s3 and claimed in S3_UNSIGNED_PAYLOADS) \
            and not hmac.compare_digest(claimed.encode(), hashlib.sha256(body).hexdigest().encode()):
        # botocore signs this header's value in place of the body: it must be the body's hash.
        raise SignatureRejected(BAD_SIGNATURE)
    # Rebuild the request from the signed headers alone, as the signer saw it, and sign it again.
    request = AWSRequest(method=method, url=url, data=body, headers={name: lower[name] for name in signed_names})
    request.context["timestamp"] = amz_date
    signer = (S3SigV4Auth if s3 else SigV4Auth)(credentials, scope_service, region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    if not hmac.compare_digest(expected.encode(), match["signature"].encode()):
        raise SignatureRejected(BAD_SIGNATURE)
    return Caller(access_key=access_key)
