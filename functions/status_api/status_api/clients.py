"""boto3 clients made once per execution environment, not once per request.

Creating a client loads and parses the service model and builds its endpoint resolver: most of a
small request's time (docs/benchmarks.md, "Status API clients"). AWS's Lambda guidance is to make
SDK clients outside the handler and reuse them across invocations; clients are thread-safe.

The cache is keyed on the process's ``AWS_*`` environment as well as the service: a client keeps
the region, endpoint URL (``AWS_ENDPOINT_URL*``) and credentials it was made with, and in Lambda
those never change within an environment, but the offline runtime and the tests point one process
at several moto servers in turn. A changed environment therefore gets fresh clients, never a client
bound to a server that has gone.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Literal

import boto3

# The services the status API calls (boto3's typed overloads need the name as a literal).
Service = Literal["cloudwatch", "s3", "sagemaker", "stepfunctions"]
# One environment at a time in Lambda; a handful in a test session that starts several runtimes.
MAX_CACHED = 32

_lock = threading.Lock()
_cache: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}


def _aws_environment() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))


def client(service: Service) -> Any:
    """The process's client for ``service`` under the current ``AWS_*`` environment."""
    key = (service, _aws_environment())
    cached = _cache.get(key)
    if cached is not None:
        return cached
    # Creating clients from boto3's shared default session is not thread-safe, and offline other
    # handlers in this process (on the runtime's threads) use that session at the same moment: each
    # client gets a session of its own (boto3's advice for threads). Using a client afterwards is safe.
    with _lock:
        cached = _cache.get(key)
        if cached is None:
            if len(_cache) >= MAX_CACHED:
                _cache.pop(next(iter(_cache)))  # the oldest: an environment the process has left
            cached = _cache[key] = boto3.session.Session().client(service)
        return cached


class Lazy:
    """``client(service)`` made on its first use: a request that calls nothing of the service makes no client
    (GET /runs/{runId} reads CloudWatch only for a run whose training job started)."""

    def __init__(self, service: Service) -> None:
        self.service: Service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(client(self.service), name)


def clear() -> None:
    """Forget every client (tests that swap ``boto3.client`` for a fake)."""
    with _lock:
        _cache.clear()
