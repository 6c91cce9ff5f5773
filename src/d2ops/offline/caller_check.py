"""Who may call the offline runtime's AWS endpoint, and what it may ask, checked before any service sees a request.

The endpoint (`d2ops.offline.aws_endpoint`) runs jobs as processes of the developer who started it,
so it answers only its own runtime's callers, the way AWS answers only signed requests:

1. the ``Host`` header is exactly the endpoint's own address (``127.0.0.1:<port>`` or
   ``localhost:<port>``): a web page that reaches the port through a name it controls (DNS
   rebinding) sends its own name and is refused;
2. the request carries a valid SigV4 signature by the runtime's credentials (fresh random ones for
   each runtime, `d2ops.offline.runtime`), verified by `d2ops.sigv4.verify` as the status API's are;
3. every string member the service's botocore model gives a ``pattern`` (job, endpoint and model
   names ...) matches it, as SageMaker's own validation does, before a name becomes a path (with
   the model's enums and maximums: `d2ops.aws_contract.constraint_problems`, the test suite's check
   of every boto3 call);
4. a processing job's ``AppSpecification.ContainerEntrypoint`` is one the pipeline itself runs (the
   state machine's literal entrypoints and the evaluation entrypoint its prepare step plans);
5. a job's (or a model's container's) ``Environment`` sets no variable that decides which code a
   process loads (``PATH``, ``PYTHON*``, ``LD_*`` ...): an allowed entrypoint with ``PYTHONPATH`` of
   the caller's choosing would run the caller's code all the same;
6. the names that become directories of a job (``InputName``, ``OutputName``, ``ChannelName``) are
   plain file names, and no ``LocalPath`` has a ``..`` part (SageMaker's patterns allow ``..``).

Refusals are AWS's own error shapes: the JSON protocols' ``{"__type", "message"}`` (HTTP 400 for
signature and validation errors, as SageMaker and Step Functions answer them), REST services'
``x-amzn-ErrorType`` header with ``{"message"}`` (HTTP 403 for signature errors, 400 for validation);
a foreign Host gets 403 ``AccessDeniedException``.

moto's server, which the runtime's clients reach directly for S3, DynamoDB, SNS and the rest, is
behind `MotoCallerCheck`: its own Host, no web origin, the runtime's signature (or the endpoint's
forward mark), refused in each protocol's own shape.
"""

from __future__ import annotations

import hmac
import io
import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from xml.sax.saxutils import escape as xml_escape

import botocore.session
from botocore.credentials import Credentials
from botocore.model import OperationModel, ServiceModel

from d2ops.aws_contract import constraint_problems
from d2ops.functions import import_handler
from d2ops.offline.aws_endpoint import FORWARDED_HEADER
from d2ops.offline.services.base import WireRequest, WireResponse
from d2ops.sigv4 import SignatureRejected, verify

# The prepare step's code directory (functions/<name>/) and the constant with the evaluation job's entrypoint.
PREPARE_FUNCTION_CODE = "prepare_training"
PREPARE_ENTRYPOINT_NAME = "EVALUATION_ENTRYPOINT"
METHOD = "POST"  # the endpoint serves POST only (its GET answers 404 before dispatch)


class EntrypointsUnknown(Exception):
    """The pipeline's processing-job entrypoints cannot be read from where it defines them."""


@dataclass(frozen=True)
class Operation:
    """The botocore operation a request is, and the members its path carries (REST protocols)."""

    model: OperationModel
    path_members: Mapping[str, str]


class CallerCheck:
    """``check(request)``: None when the endpoint may serve ``request``, else the refusal to answer."""

    def __init__(self, *, credentials: Credentials, port: int, region: str, clients: Collection[str],
                 entrypoints: Collection[tuple[str, ...]]) -> None:
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})
        self.known = {credentials.access_key: credentials}
        self.region = region
        self.models = [_service_model(name) for name in dict.fromkeys(clients)]
        self.entrypoints = frozenset(tuple(e) for e in entrypoints)

    def check(self, request: WireRequest) -> WireResponse | None:
        operation = self.operation(request)
        refuse = _Refusal(rest=not request.target,
                          json_version=operation.model.metadata.get("jsonVersion", "1.1") if operation else "1.1")
        host = request.headers.get("Host") or ""
        if host not in self.hosts:
            return refuse(403, "AccessDeniedException", f"Host {host!r} is not this offline endpoint (it answers "
                                                        f"only {' or '.join(sorted(self.hosts))})")
        signing = operation.model.service_model.signing_name if operation else [m.signing_name for m in self.models]
        try:
            verify(METHOD, f"http://{host}{request.path}", request.headers, request.body, self.known, self.region,
                   service=signing)
        except SignatureRejected as exc:
            return refuse(403 if refuse.rest else 400, exc.error_type, exc.message)
        if operation is None:
            return None  # the endpoint answers what no service knows (UnknownOperationException)
        params = dict(operation.path_members)
        if not refuse.rest:
            document = request.json_object()
            if document is None:
                return None  # the service answers the protocol's SerializationException
            params.update(document)
        # The constraints AWS's front end checks and botocore leaves to it (patterns, enums, maximums).
        problems = constraint_problems(params, operation.model.input_shape)
        if problems:
            count = len(problems)
            return refuse(400, "ValidationException",
                          f"{count} validation error{'s' if count > 1 else ''} detected: {'; '.join(problems)}")
        problem = job_request_problem(operation.model.name, params)
        if problem is not None:
            return refuse(400, "ValidationException", problem)
        if operation.model.name == "CreateProcessingJob":
            return self._entrypoint(params, refuse)
        return None

    def _entrypoint(self, params: Mapping[str, Any], refuse: _Refusal) -> WireResponse | None:
        app = params.get("AppSpecification")
        entrypoint = app.get("ContainerEntrypoint") if isinstance(app, dict) else None
        if not entrypoint or any(list(allowed) == entrypoint for allowed in self.entrypoints):
            return None  # none: the image's own entrypoint (the evaluation job's, offline)
        allowed = " or ".join(json.dumps(list(e)) for e in sorted(self.entrypoints)) or "none"
        return refuse(400, "ValidationException",
                      f"entrypoint not allowed offline: {json.dumps(entrypoint)} (the pipeline runs {allowed}; "
                      "a processing job runs on this machine as you)")

    def operation(self, request: WireRequest) -> Operation | None:
        """The operation ``request`` names: its ``X-Amz-Target`` (JSON protocols) or its path (REST)."""
        prefix, _, name = request.target.partition(".")
        for model in self.models:
            if request.target and model.metadata.get("targetPrefix") == prefix and name in model.operation_names:
                return Operation(model.operation_model(name), {})
            if not request.target and model.protocol.startswith("rest"):
                for operation_name in model.operation_names:
                    found = _rest_route(model, operation_name).match(request.route)
                    if found is not None and model.operation_model(operation_name).http.get("method") == METHOD:
                        return Operation(model.operation_model(operation_name), found.groupdict())
        return None


# Variables that decide which code a process loads: the shell's startup files and exported functions,
# the dynamic loader's preloads and search paths, Python's path, startup file, home and flags, other
# interpreters' equivalents, OpenMP's tool libraries, glibc's module paths and tunables. A job's
# Environment is the caller's: with one of these, an allowed entrypoint runs the caller's code.
CODE_LOADING_VARIABLES = frozenset({
    "PATH", "HOME", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH",
    "GCONV_PATH", "LOCPATH", "NLSPATH", "GLIBC_TUNABLES", "HOSTALIASES", "OMP_TOOL", "OMP_TOOL_LIBRARIES",
    "PERL5LIB", "PERLLIB", "PERL5OPT", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "MPLCONFIGDIR", "MPLBACKEND",
})
CODE_LOADING_PREFIXES = ("PYTHON", "LD_", "DYLD_", "BASH_FUNC_")
# What a name that becomes a directory of the job may be (SageMaker's own patterns allow "..", "/" or none).
PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")
# The members that become a directory of the job, by operation: (list member, name member).
_NAMED_DIRECTORIES = {
    "CreateProcessingJob": (("ProcessingInputs", "InputName"),),
    "CreateTrainingJob": (("InputDataConfig", "ChannelName"),),
}


def job_request_problem(operation: str, params: Mapping[str, Any]) -> str | None:
    """Why a job (or model) request may not run on this machine, in one line; None when it may."""
    for where, environment in _environments(operation, params):
        for key in environment if isinstance(environment, dict) else ():
            name = str(key).upper()
            if name in CODE_LOADING_VARIABLES or name.startswith(CODE_LOADING_PREFIXES):
                return (f"{where}: variable {key!r} not allowed offline: it decides which code the process "
                        "loads (a job runs on this machine as you)")
    named = [(member, params.get(member), key) for member, key in _NAMED_DIRECTORIES.get(operation, ())]
    outputs = params.get("ProcessingOutputConfig") if operation == "CreateProcessingJob" else None
    if isinstance(outputs, dict):
        named.append(("ProcessingOutputConfig.Outputs", outputs.get("Outputs"), "OutputName"))
    for member, items, key in named:
        for index, item in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(item, dict):
                continue
            value = item.get(key)
            if isinstance(value, str) and (not PLAIN_NAME.fullmatch(value) or value in (".", "..")):
                return (f"{member}[{index}].{key}: {value!r} not allowed offline: it names a directory of "
                        f"the job, so it must match {PLAIN_NAME.pattern} and not be '.' or '..'")
            for s3 in ("S3Input", "S3Output"):
                local = item.get(s3, {}).get("LocalPath") if isinstance(item.get(s3), dict) else None
                if isinstance(local, str) and ".." in local.split("/"):
                    return (f"{member}[{index}].{s3}.LocalPath: {local!r} not allowed offline: "
                            "a '..' part leaves the job's directory")
    return None


def _environments(operation: str, params: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(member path, Environment) of each process a request would start on this machine."""
    if operation in ("CreateProcessingJob", "CreateTrainingJob"):
        yield "Environment", params.get("Environment")
    elif operation == "CreateModel":
        primary = params.get("PrimaryContainer")
        if isinstance(primary, dict):
            yield "PrimaryContainer.Environment", primary.get("Environment")
        containers = params.get("Containers")
        for index, container in enumerate(containers if isinstance(containers, list) else ()):
            if isinstance(container, dict):
                yield f"Containers[{index}].Environment", container.get("Environment")


@dataclass(frozen=True)
class _Refusal:
    """An error answer in the request's protocol: AWS JSON's ``{"__type", "message"}`` in its version's
    Content-Type, or REST JSON's ``{"message"}`` with the type in ``x-amzn-ErrorType``."""

    rest: bool
    json_version: str

    def __call__(self, status: int, code: str, message: str) -> WireResponse:
        if self.rest:
            return WireResponse.json(status, {"message": message}, "application/json", {"x-amzn-ErrorType": code})
        return WireResponse.json(status, {"__type": code, "message": message},
                                 f"application/x-amz-json-{self.json_version}")


@cache
def _service_model(client: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(client)


@cache
def _rest_route(model: ServiceModel, operation: str) -> re.Pattern[str]:
    """``/endpoints/{EndpointName}/invocations`` -> a regex whose groups are the path's members."""
    operation_model = model.operation_model(operation)
    uri = operation_model.http.get("requestUri", "").split("?")[0]
    shape = operation_model.input_shape
    members = {member.serialization.get("name", name): name for name, member in shape.members.items()
               if member.serialization.get("location") == "uri"} if shape is not None else {}
    pattern = ""
    for part in re.split(r"(\{[A-Za-z0-9_]+\+?\})", uri):
        if part.startswith("{"):
            label = part.strip("{}+")
            pattern += f"(?P<{members.get(label, label)}>{'.+' if part.endswith('+}') else '[^/]+'})"
        else:
            pattern += re.escape(part)
    return re.compile(f"^{pattern}$")


def pipeline_entrypoints(definition: Mapping[str, Any], functions: Mapping[str, Any]) -> frozenset[tuple[str, ...]]:
    """The processing-job entrypoints the pipeline runs, from where it defines them.

    ``definition``: the state machine (any literal ``ContainerEntrypoint`` in its states' parameters);
    ``functions``: the stack's functions (`d2ops.offline.stack.LocalFunction` by logical id), whose
    prepare step plans the evaluation job and names its entrypoint.
    """
    found = {tuple(value) for value in _literal_entrypoints(definition)}
    prepare = next((f for f in functions.values() if f.code_dir.name == PREPARE_FUNCTION_CODE), None)
    if prepare is not None:
        service = import_handler(f"{PREPARE_FUNCTION_CODE}.service", prepare.code_dir)
        planned = getattr(service, PREPARE_ENTRYPOINT_NAME, None)
        if planned is not None:
            found.add(tuple(planned))
    if not found:
        raise EntrypointsUnknown(f"neither the state machine nor functions/{PREPARE_FUNCTION_CODE} "
                                 f"({PREPARE_ENTRYPOINT_NAME}) names a processing-job ContainerEntrypoint")
    return frozenset(found)


def _literal_entrypoints(node: Any) -> Iterator[list[str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "ContainerEntrypoint" and isinstance(value, list) and all(isinstance(v, str) for v in value):
                yield value
            else:
                yield from _literal_entrypoints(value)
    elif isinstance(node, list):
        for item in node:
            yield from _literal_entrypoints(item)


class MotoCallerCheck:
    """WSGI middleware around moto's server app: its own Host, no web page, and only the runtime's signature.

    moto answers every web origin (flask-cors on each service's app) and checks no signature; a page
    could read the offline buckets, or reach the port by a name it controls (DNS rebinding), and any
    local process that finds the port could read and write them. So, before moto sees a request:

    1. a foreign ``Host`` is refused, and so is any ``Origin`` but the port's own (boto3 sends none; a
       browser sends one with every cross-origin request, a CORS preflight included), with no
       ``Access-Control-Allow-*`` header on any answer;
    2. the request carries a SigV4 signature (``Authorization`` header) by the runtime's credentials
       for the runtime's region, verified by `d2ops.sigv4.verify` for whichever service its credential
       scope names (S3's by S3's rules). Presigned (query-string) requests are not accepted: nothing
       offline makes them;
    3. or it is one the runtime's AWS endpoint forwards (`d2ops.offline.aws_endpoint.MotoUpstream`),
       marked by the per-runtime secret in `FORWARDED_HEADER`, which is removed before moto sees it.

    Refusals are AWS's per protocol, so botocore raises a ClientError naming the problem: S3's XML
    ``<Error>`` (403 ``AccessDenied`` unsigned, ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``), the
    query protocol's ``<ErrorResponse>`` (403 ``MissingAuthenticationToken``, ``InvalidClientTokenId``,
    ``SignatureDoesNotMatch``), the JSON protocols' ``{"__type", "message"}`` and RPC v2 CBOR's same map
    (400 ``MissingAuthenticationTokenException``, ``UnrecognizedClientException``,
    ``InvalidSignatureException``).
    """

    def __init__(self, app: Any, port: int, *, credentials: Credentials, region: str, forward_secret: str) -> None:
        self.app = app
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})
        self.origins = frozenset(f"http://{host}" for host in self.hosts)
        self.known = {credentials.access_key: credentials}
        self.region = region
        self.forward_secret = forward_secret.encode()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        host = environ.get("HTTP_HOST", "")
        origin = environ.get("HTTP_ORIGIN")
        if host not in self.hosts:
            return _xml_refusal(start_response, 403, "AccessDenied", f"Host {host!r} is not this offline endpoint")
        if origin is not None and origin not in self.origins:
            return _xml_refusal(start_response, 403, "AccessDenied",
                                f"requests from the web origin {origin!r} are not served offline")
        body = _read_body(environ)
        forwarded = environ.pop(FORWARDED_ENVIRON, None)
        try:
            if forwarded is not None:
                # Checked by CallerCheck at the endpoint, then changed by the forwarder (Host, X-Amz-Target).
                if not hmac.compare_digest(forwarded.encode(), self.forward_secret):
                    raise SignatureRejected(f"{FORWARDED_HEADER}: not this runtime's forwarded request",
                                            "InvalidSignatureException")
            else:
                raw_path = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
                verify(environ.get("REQUEST_METHOD", "GET"), f"http://{host}{raw_path}", _wsgi_headers(environ),
                       body, self.known, self.region, service=None)
        except SignatureRejected as exc:
            return _aws_refusal(start_response, environ, body, exc)

        def start_without_cors(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, *rest)

        return self.app(environ, start_without_cors)


# The environ key of aws_endpoint.FORWARDED_HEADER, as a WSGI server names a request header.
FORWARDED_ENVIRON = "HTTP_" + FORWARDED_HEADER.upper().replace("-", "_")
# A refusal's code by verify's error type, for the XML protocols (S3's names, the query protocol's names).
_S3_CODES = {"MissingAuthenticationTokenException": "AccessDenied", "UnrecognizedClientException": "InvalidAccessKeyId"}
_QUERY_CODES = {"MissingAuthenticationTokenException": "MissingAuthenticationToken",
                "UnrecognizedClientException": "InvalidClientTokenId",
                "IncompleteSignatureException": "IncompleteSignature"}
_S3_MESSAGES = {"AccessDenied": "Access Denied (the offline runtime answers only requests signed with its "
                                "credentials: runtime.json)",
                "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records."}


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request's body, read whole and put back (moto reads it after the check)."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    if environ.get("wsgi.input_terminated"):
        body = stream.read()
    else:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = stream.read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return bytes(body)


def _wsgi_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers, lower-case, from a WSGI environ (the server drops names with ``_``)."""
    headers = {key[5:].lower().replace("_", "-"): str(value) for key, value in environ.items()
               if key.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers[key.lower().replace("_", "-")] = str(environ[key])
    return headers


def _aws_refusal(start_response: Any, environ: Mapping[str, Any], body: bytes, exc: SignatureRejected) -> list[bytes]:
    """``exc`` in the protocol of the service the request is for (what botocore will parse)."""
    if environ.get("HTTP_SMITHY_PROTOCOL") == "rpc-v2-cbor":
        return _respond(start_response, 400, _cbor_strings({"__type": exc.error_type, "message": exc.message}),
                        "application/cbor", [("smithy-protocol", "rpc-v2-cbor")])
    if environ.get("HTTP_X_AMZ_TARGET"):
        document = json.dumps({"__type": exc.error_type, "message": exc.message}).encode()
        return _respond(start_response, 400, document, "application/x-amz-json-1.0")
    form = str(environ.get("CONTENT_TYPE", "")).startswith("application/x-www-form-urlencoded")
    if "Action=" in str(environ.get("QUERY_STRING", "")) or (form and b"Action=" in body):
        code = _QUERY_CODES.get(exc.error_type, "SignatureDoesNotMatch")
        return _respond(start_response, 403, (
            '<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{xml_escape(exc.message)}</Message></Error></ErrorResponse>").encode(),
                        "text/xml")
    code = _S3_CODES.get(exc.error_type, "SignatureDoesNotMatch")
    return _xml_refusal(start_response, 403, code, _S3_MESSAGES.get(code, exc.message))


def _xml_refusal(start_response: Any, status: int, code: str, message: str) -> list[bytes]:
    """S3's error document."""
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{xml_escape(message)}</Message></Error>").encode()
    return _respond(start_response, status, body, "application/xml")


def _respond(start_response: Any, status: int, body: bytes, content_type: str,
             extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    reason = {400: "Bad Request", 403: "Forbidden"}[status]
    start_response(f"{status} {reason}", [("Content-Type", content_type), ("Content-Length", str(len(body))),
                                           *(extra or [])])
    return [body]


def _cbor_strings(document: Mapping[str, str]) -> bytes:
    """A map of text strings in CBOR (RFC 8949): what an RPC v2 CBOR error body is."""

    def head(major: int, length: int) -> bytes:
        if length < 24:
            return bytes([major << 5 | length])
        for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if length < 1 << (8 * size):
                return bytes([major << 5 | extra]) + length.to_bytes(size, "big")
        raise ValueError("too long")

    out = head(5, len(document))
    for key, value in document.items():
        for text in (key.encode(), value.encode()):
            out += head(3, len(text)) + text
    return out


