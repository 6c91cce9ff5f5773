"""Lambda functions run in-process: the real handler modules, imported from ``functions/<fn>/``.

Each function's code directory goes on ``sys.path`` (``d2ops.functions.import_handler``: its
package name is unique, see the house layout), the handler is imported once, and invoked with a JSON round trip of the
event and the result, as the Lambda runtime does. Errors come back the way Step Functions
sees a failed Lambda: the exception class name as the error, and the runtime's JSON error
document (errorMessage, errorType, stackTrace) as the cause.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from d2ops.functions import import_handler
from d2ops.offline.stack import LocalFunction

LOG_GROUP_PREFIX = "/aws/lambda/"


class _ThreadRoutedStdout:
    """sys.stdout that sends what a thread running a handler prints to that handler's log stream.

    Powertools Metrics prints its EMF documents with ``print`` (Lambda ships stdout to CloudWatch
    Logs); offline they belong in the log file, while the demo's own thread keeps the terminal.
    Everything but writing (``buffer``, ``fileno``, ``isatty`` ...) is the original stream's.
    """

    def __init__(self, default: TextIO) -> None:
        self.default = default
        self.local = threading.local()

    def _target(self) -> TextIO:
        return getattr(self.local, "stream", None) or self.default

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.default, name)


_ROUTE_LOCK = threading.Lock()


@contextlib.contextmanager
def _stdout_to(stream: TextIO | None) -> Iterator[None]:
    if stream is None:
        yield
        return
    with _ROUTE_LOCK:
        router = sys.stdout
        if not isinstance(router, _ThreadRoutedStdout):
            router = _ThreadRoutedStdout(sys.stdout)
            sys.stdout = router
    previous = getattr(router.local, "stream", None)
    router.local.stream = stream
    try:
        yield
    finally:
        router.local.stream = previous


@dataclass
class LambdaContext:
    """The attributes of the Lambda runtime's context object that handlers and Powertools read."""

    function_name: str
    function_version: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    log_group_name: str
    log_stream_name: str
    timeout_seconds: int
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self._started)) * 1000))


class FunctionError(Exception):
    """A handler raised: ``error`` is its exception class name, ``cause`` the runtime's error JSON."""

    def __init__(self, error: str, cause: str) -> None:
        super().__init__(f"{error}: {cause}")
        self.error = error
        self.cause = cause


class LocalLambdas:
    def __init__(self, functions: dict[str, LocalFunction], log_stream: TextIO | None = None) -> None:
        self.functions = functions
        self.log_stream = log_stream
        self._handlers: dict[str, Callable[[Any, Any], Any]] = {}
        self._lock = threading.Lock()
        # One execution environment per function: Lambda never hands an environment a second request
        # while it runs one, and handlers rely on that (Powertools' resolver keeps the current route's
        # arguments on its module-level app; two requests on threads at once failed with a KeyError).
        self._environments: dict[str, threading.RLock] = {}

    def _environment(self, fn: LocalFunction) -> threading.RLock:
        with self._lock:
            return self._environments.setdefault(fn.logical_id, threading.RLock())

    def _handler(self, fn: LocalFunction) -> Callable[[Any, Any], Any]:
        with self._lock:
            if fn.logical_id not in self._handlers:
                module = import_handler(fn.handler_module, fn.code_dir)
                self._redirect_logs()
                self._handlers[fn.logical_id] = getattr(module, fn.handler_name)
            return self._handlers[fn.logical_id]

    def _redirect_logs(self) -> None:
        """Handler logs go where CloudWatch Logs would keep them: a file, not the user's terminal.

        Powertools loggers write to the process's stdout (Lambda ships stdout to CloudWatch);
        offline that is the terminal the demo's progress lines are printed on.
        """
        if self.log_stream is None:
            return
        for name in {os.environ.get("POWERTOOLS_SERVICE_NAME", "service_undefined"), "service_undefined"}:
            for handler in logging.getLogger(name).handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr,
                                                                                     sys.__stdout__):
                    handler.setStream(self.log_stream)

    def restore_logs(self) -> None:
        if self.log_stream is None:
            return
        for name in {os.environ.get("POWERTOOLS_SERVICE_NAME", "service_undefined"), "service_undefined"}:
            for handler in logging.getLogger(name).handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is self.log_stream:
                    handler.setStream(sys.stdout)

    def find(self, name_or_arn: str) -> LocalFunction:
        for fn in self.functions.values():
            if name_or_arn in (fn.arn, fn.name, fn.logical_id) or name_or_arn.startswith(fn.arn + ":"):
                return fn
        raise KeyError(f"no function {name_or_arn!r} in the offline stack "
                       f"(known: {', '.join(f.name for f in self.functions.values())})")

    def invoke(self, name_or_arn: str, event: Any) -> Any:
        fn = self.find(name_or_arn)
        handler = self._handler(fn)
        request_id = str(uuid.uuid4())
        context = LambdaContext(function_name=fn.name, function_version="$LATEST", invoked_function_arn=fn.arn,
                                memory_limit_in_mb=fn.memory_size, aws_request_id=request_id,
                                log_group_name=f"{LOG_GROUP_PREFIX}{fn.name}",
                                log_stream_name=f"offline/[$LATEST]{request_id.replace('-', '')}",
                                timeout_seconds=fn.timeout)
        payload = json.loads(json.dumps(event))  # what the runtime deserialises for the handler
        try:
            with self._environment(fn), _stdout_to(self.log_stream):
                result = handler(payload, context)
        except Exception as exc:
            error_type = type(exc).__name__
            cause = json.dumps({"errorMessage": str(exc), "errorType": error_type, "requestId": request_id,
                                "stackTrace": traceback.format_tb(exc.__traceback__)[-5:]})
            raise FunctionError(error_type, cause) from exc
        try:
            return json.loads(json.dumps(result))
        except (TypeError, ValueError) as exc:
            cause = json.dumps({"errorMessage": f"Unable to marshal response: {exc}",
                                "errorType": "Runtime.MarshalError", "requestId": request_id})
            raise FunctionError("Runtime.MarshalError", cause) from exc
