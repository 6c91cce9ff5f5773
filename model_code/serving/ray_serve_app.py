"""Ray Serve adapter: the only module that imports Ray. All logic is in ``service``, as for TorchServe.

``python -m model_code.serving.ray_serve_app --model-dir DIR --port P ...`` is the server process the
entry point supervises (``model_code.serving.ray_launch``): it starts a local Ray instance (no
dashboard, no usage report, its temp dir under the serving work dir), runs one HTTP
deployment on ``host:port`` and, on SIGTERM or SIGINT, shuts Serve and Ray down.

The deployment answers exactly what the TorchServe path answers (docs/serving.md):

- ``GET /ping``: 503 ``{"status": "Unhealthy", "reason": ...}`` until the artifact is loaded and warmed
  up, 200 ``{"status": "Healthy"}`` after. The replica loads in a background thread so that its route
  answers (and says why not) while it loads; where a GPU is required and CUDA is unusable it never
  loads, and ``/ping`` keeps answering 503 with the reason;
- ``POST /invocations`` (and ``/predictions/model``, TorchServe's route for the same model): the
  request becomes the same :class:`RawRequest`, the answer is the same :class:`Response`;
- dynamic batching with ``@serve.batch``, sized by the same ``BatchSettings`` (``D2OPS_BATCH_SIZE``,
  ``D2OPS_MAX_BATCH_DELAY_MS``); ``X-D2ops-Batch-Size`` is the size of the batch Serve assembled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, cast

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response as HttpResponse

from model_code.artifact import load_artifact
from model_code.serving.device import GpuUnavailableError, select_device
from model_code.serving.errors import RequestError, too_large
from model_code.serving.service import DetectionService, RawRequest, Response, error_response

logger = logging.getLogger(__name__)

MODEL_NAME = "model"  # launch.MODEL_NAME: the one model, as TorchServe registers it
APP_NAME = "d2ops"
INVOCATION_PATHS = frozenset({"/invocations", f"/predictions/{MODEL_NAME}"})


def _log_to_stderr() -> None:
    """The service's INFO lines (warm-up, batches) on the replica's stderr, which Ray forwards to the driver."""
    package = logging.getLogger("model_code")
    if not package.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.INFO)
        package.propagate = False


def _ping_body(reason: str | None) -> bytes:
    # The document the TorchServe image's /ping plugin (resources/ReadinessPing.java) answers, same spacing.
    document = {"status": "Healthy"} if reason is None else {"status": "Unhealthy", "reason": reason}
    return (json.dumps(document) + "\n").encode()


def _http(response: Response) -> HttpResponse:
    return HttpResponse(content=response.body, status_code=response.status, headers=response.headers)


def _not_found(status: int, message: str) -> HttpResponse:
    return _http(error_response(RequestError(status, "not_found" if status == 404 else "method_not_allowed",
                                             message), {}))


@serve.deployment(name="detector")
class DetectionDeployment:
    """One replica: the service, loaded and warmed up in the background; ``/ping`` says when it is ready."""

    def __init__(self, model_dir: str, batch_size: int, max_batch_delay_ms: int, max_request_bytes: int,
                 threads: int) -> None:
        _log_to_stderr()
        self.model_dir = model_dir
        self.max_request_bytes = max_request_bytes
        self.service: DetectionService | None = None
        self.failure: str | None = None
        self.batch_size = batch_size
        batcher = cast(Any, self._predict_batch)  # @serve.batch's wrapper (its setters are not in its type)
        batcher.set_max_batch_size(batch_size)
        batcher.set_batch_wait_timeout_s(max_batch_delay_ms / 1000)
        torch_threads = max(1, threads)
        threading.Thread(target=self._load, args=(torch_threads,), name="d2ops-load", daemon=True).start()

    def _load(self, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS to the replica's CPUs; say so to torch too
        try:
            # Never a silent CPU fallback where a GPU is needed: /ping stays unhealthy with this reason.
            decision = select_device(None)
        except GpuUnavailableError as exc:
            logger.error("d2ops serving: %s: %s", type(exc).__name__, exc)
            self.failure = f"{type(exc).__name__}: {exc}"
            return
        except Exception as exc:  # a bad D2OPS_REQUIRE_GPU is refused by the entry point before this runs
            logger.exception("d2ops serving: choosing the device failed")
            self.failure = str(exc)
            return
        logger.info(decision.log_line())
        try:
            service = DetectionService(load_artifact(self.model_dir, device=decision.device), device=decision.device)
            meta = service.metadata
            logger.info("loaded %s (%s, %d classes) on %s; batch_size=%s", meta.model, meta.task,
                        len(meta.class_names), decision.device, self.batch_size)
            service.warm_up()
        except Exception as exc:
            logger.exception("d2ops serving: loading the model failed")
            self.failure = f"{type(exc).__name__}: {exc}"
            return
        self.service = service

    def _unready_reason(self) -> str | None:
        if self.service is not None:
            return None
        # TorchServe's plugin says "no worker ready" in both cases: its worker is retried, never healthy.
        if self.failure is not None:
            return f"model {MODEL_NAME} failed to load (no worker ready): {self.failure}"
        return f"model {MODEL_NAME} is still loading (no worker ready)"

    async def __call__(self, request: Request) -> HttpResponse:
        """Three routes, as the TorchServe image answers them; a plain HTTP deployment rather than a FastAPI
        ingress: FastAPI 0.16x apps hold locks, so Serve cannot pickle one for a class-based ingress."""
        path, method = request.url.path, request.method
        if path == "/ping":
            return await self.ping() if method in ("GET", "HEAD") else _not_found(405, f"{method} {path}: use GET")
        if path in INVOCATION_PATHS:
            return await self.invocations(request) if method == "POST" else _not_found(405, f"{method} {path}: "
                                                                                           "use POST")
        return _not_found(404, f"{path} is not a route of this endpoint: GET /ping, POST /invocations")

    async def ping(self) -> HttpResponse:
        reason = self._unready_reason()
        return HttpResponse(content=_ping_body(reason), status_code=200 if reason is None else 503,
                            media_type="application/json")

    async def invocations(self, request: Request) -> HttpResponse:
        reason = self._unready_reason()
        if reason is not None:
            return _http(error_response(RequestError(503, "model_unavailable", reason), {}))
        try:
            body = await self._read_body(request)
        except RequestError as exc:
            return _http(error_response(exc, {}))
        raw = RawRequest(body=body, content_type=request.headers.get("content-type"),
                         query=dict(request.query_params), headers=dict(request.headers))
        try:
            response: Response = await self._predict_batch(raw)
        except Exception:  # handle_batch answers every request itself; this is a bug, still answered as JSON
            logger.exception("the batch failed outside the service")
            response = error_response(RequestError(500, "internal_error", "the server failed on this request; see "
                                                                          "the endpoint logs"), {})
        return _http(response)

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused (413, with a JSON message) past the limit TorchServe's frontend applies."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise too_large("body_too_large", f"request body is {int(declared)} bytes; the server takes at most "
                                              f"{limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large("body_too_large", f"request body is over {limit} bytes; the server takes at most "
                                                  f"{limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.02)  # set from BatchSettings in __init__
    async def _predict_batch(self, requests: list[RawRequest]) -> list[Response]:
        service = self.service
        assert service is not None  # invocations answers 503 before the service exists
        # In a thread: the event loop keeps accepting requests (and /ping) while the model runs, so the
        # next batch fills up meanwhile. Serve runs one batch at a time per replica (max_concurrent_batches=1).
        return await asyncio.to_thread(service.handle_batch, requests)


def build_app(model_dir: Path, *, batch_size: int, max_batch_delay_ms: int, workers: int, max_request_bytes: int,
              max_ongoing_requests: int, cpus: float, gpus: float) -> serve.Application:
    """The bound application: ``workers`` replicas sharing ``cpus`` and ``gpus`` evenly."""
    cpus_each = cpus / workers
    # A GPU for each replica where there are enough, else a share; none where Ray sees none (device.py then
    # decides, with the host's devices still visible: RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0 in ray_launch).
    gpus_each = min(1.0, gpus / workers) if gpus else 0.0
    deployment = cast(serve.Deployment, DetectionDeployment).options(
        num_replicas=workers, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": cpus_each, "num_gpus": gpus_each})
    return deployment.bind(str(model_dir), batch_size, max_batch_delay_ms, max_request_bytes, int(cpus_each))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="model_code.serving.ray_serve_app", description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--temp-dir", type=Path, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--max-batch-delay-ms", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--max-request-bytes", type=int, required=True)
    p.add_argument("--max-ongoing-requests", type=int, required=True)
    p.add_argument("--request-timeout-s", type=float, required=True)
    p.add_argument("--object-store-bytes", type=int, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    # A new local instance (never one found through RAY_ADDRESS or /tmp/ray), its node address 127.0.0.1.
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, _temp_dir=str(args.temp_dir),
             _node_ip_address="127.0.0.1", object_store_memory=args.object_store_bytes, log_to_driver=True)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    # After ray.init, which installs a SIGTERM handler of its own (sys.exit) that would skip the shutdown.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        serve.start(http_options={"host": args.host, "port": args.port,
                                  "request_timeout_s": args.request_timeout_s})
        serve.run(build_app(args.model_dir, batch_size=args.batch_size, max_batch_delay_ms=args.max_batch_delay_ms,
                            workers=args.workers, max_request_bytes=args.max_request_bytes,
                            max_ongoing_requests=args.max_ongoing_requests, cpus=cpus, gpus=gpus),
                  name=APP_NAME, route_prefix="/", blocking=False)
        print(f"d2ops serving: Ray Serve application deployed on http://{args.host}:{args.port} "
              f"({args.workers} replica(s), {gpus:g} GPU(s) seen by Ray); loading the model", flush=True)
        stopping.wait()
        print("d2ops serving: shutting Ray Serve down", flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    # Run the module's own copy under its importable name: Ray pickles what __main__ defines by value
    # (loggers, locks and all) but importable classes by reference, which the replicas import.
    from model_code.serving import ray_serve_app

    sys.exit(ray_serve_app.main())
