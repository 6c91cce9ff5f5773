"""The serving image's entry point, ``python -m model_code.serving.entrypoint serve``.

SageMaker starts the container as ``docker run IMAGE serve`` with the model unpacked under
``/opt/ml/model``; ``d2ops serve`` and the offline endpoints run this same module with
environment variables pointing at a local model, loopback and their own ports. It prepares the
artifact (:mod:`model_code.serving.launch`), runs the server ``D2OPS_SERVING_BACKEND`` names
(TorchServe by default, or Ray Serve: :mod:`model_code.serving.backends`), reports when ``/ping``
turns healthy and, on SIGTERM or SIGINT, stops the server's whole process group before exiting.

Environment (all optional):
  D2OPS_SERVING_BACKEND     torchserve (default) or ray-serve; anything else fails the start
  D2OPS_MODEL_PATH          model directory or model.tar.gz (default /opt/ml/model)
  SAGEMAKER_BIND_TO_PORT    inference port (default 8080; SageMaker sets it in multi-container endpoints)
  D2OPS_BIND_HOST           inference host (default 0.0.0.0)
  D2OPS_MANAGEMENT_PORT, D2OPS_METRICS_PORT, D2OPS_GRPC_INFERENCE_PORT, D2OPS_GRPC_MANAGEMENT_PORT
                            TorchServe's loopback ports (default: from SAGEMAKER_SAFE_PORT_RANGE when SageMaker
                            sets it, else config.properties); Ray Serve's internal servers take free ports
  D2OPS_SERVING_WORKDIR     model store, logs, temp files (default /tmp/d2ops-serving)
  D2OPS_STARTUP_TIMEOUT     seconds to wait for /ping before giving up (default 600)
  D2OPS_BATCH_SIZE, D2OPS_MAX_BATCH_DELAY_MS, D2OPS_WORKERS   batching (model_code.serving.launch.BatchSettings)
  D2OPS_REQUIRE_GPU         auto (default: a GPU is required where the host exposes NVIDIA devices), true, false
                            (model_code.serving.device); where one is required and CUDA is unusable,
                            /ping stays unhealthy instead of serving on CPU
  D2OPS_STOP_WITH_PARENT    1: stop the server when the process that started this one exits (``d2ops serve``
                            and the offline endpoints set it; in a container PID 1 never goes away)
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from pydantic import ValidationError

from d2ops_core import images as rule
from model_code.serving import backends, device, launch

PID_FILE = backends.PID_FILE  # the server's process group, for a supervisor that must clean up after us


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    # isascii: str.isdigit() also accepts '²' (int() then raises) and other scripts' digits.
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) < 65536:
        raise launch.ServingError(f"{name}={raw!r} is not a TCP port")
    return int(raw)


EXTRA_PORTS = ("D2OPS_MANAGEMENT_PORT", "D2OPS_METRICS_PORT", "D2OPS_GRPC_INFERENCE_PORT", "D2OPS_GRPC_MANAGEMENT_PORT")
SAFE_RANGE = "SAGEMAKER_SAFE_PORT_RANGE"


def extra_ports(env: Mapping[str, str], defaults: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Management, metrics and the two gRPC ports: a D2OPS_* variable, else SageMaker's safe range, else the default.

    In a multi-container endpoint SageMaker sets ``SAGEMAKER_SAFE_PORT_RANGE`` ("lo-hi") to the ports this
    container may use besides ``SAGEMAKER_BIND_TO_PORT``; TorchServe's own defaults could collide with a
    neighbour's. Unset ports take the range's ports in order, skipping the bind port.
    """
    chosen = [_port(env, name, 0) or None for name in EXTRA_PORTS]
    raw = env.get(SAFE_RANGE)
    if raw and None in chosen:
        lo_text, _, hi_text = raw.partition("-")
        if not all(t.isascii() and t.isdigit() for t in (lo_text, hi_text)) or \
                not 0 < int(lo_text) <= int(hi_text) < 65536:
            raise launch.ServingError(f"{SAFE_RANGE}={raw[:40]!r} is not a port range such as '8000-8100'")
        bind = _port(env, "SAGEMAKER_BIND_TO_PORT", 0)
        taken = {bind, *(p for p in chosen if p)}
        free = (p for p in range(int(lo_text), int(hi_text) + 1) if p not in taken)
        picked = [p if p else next(free, None) for p in chosen]
        if None in picked:
            raise launch.ServingError(f"{SAFE_RANGE}={raw!r} leaves too few ports: TorchServe needs "
                                      f"{chosen.count(None)} besides the bind port {bind or ''}".rstrip())
        chosen = picked
    management, metrics, grpc_inference, grpc_management = (p or d for p, d in zip(chosen, defaults, strict=True))
    return management, metrics, grpc_inference, grpc_management


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    # nan or inf would never compare past the waited time: the launcher would wait forever.
    if not math.isfinite(value) or value <= 0:
        raise launch.ServingError(f"{name}={raw[:40]!r} is not a positive number of seconds")
    return value


STOP_WITH_PARENT = "D2OPS_STOP_WITH_PARENT"


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise launch.ServingError(f"{name}={raw[:40]!r} is not 1, true, 0 or false")


def serve(env: Mapping[str, str]) -> int:
    try:
        backend = backends.backend_from_env(env)
    except ValueError as exc:
        raise launch.ServingError(str(exc)) from exc
    try:  # the image rule's limit (CreateModel's Environment): a bad one fails the start, not every request
        pixel_limit = rule.max_pixels(env)
    except rule.PixelLimitError as exc:
        raise launch.ServingError(str(exc)) from exc
    stop_with_parent = _flag(env, STOP_WITH_PARENT)
    print(f"d2ops serving: images up to {pixel_limit:,} pixels ({rule.MAX_PIXELS_ENV})", flush=True)
    model = Path(env.get("D2OPS_MODEL_PATH") or "/opt/ml/model")
    workdir = Path(env.get("D2OPS_SERVING_WORKDIR") or "/tmp/d2ops-serving")
    base = launch.read_properties(launch.config_path(env))
    host = env.get("D2OPS_BIND_HOST") or "0.0.0.0"
    port = _port(env, "SAGEMAKER_BIND_TO_PORT", urlsplit(base["inference_address"]).port or 8080)
    management, metrics, *grpc_ports = extra_ports(env, (
        urlsplit(base["management_address"]).port or 8081, urlsplit(base["metrics_address"]).port or 8082,
        int(base.get("grpc_inference_port", 7070)), int(base.get("grpc_management_port", 7071))))
    grpc = (grpc_ports[0], grpc_ports[1])
    timeout = _seconds(env, "D2OPS_STARTUP_TIMEOUT", 600.0)
    try:
        settings = launch.BatchSettings.from_env(env)
    except ValidationError as exc:
        raise launch.ServingError(f"batching settings: {exc}") from exc

    try:
        # The workers decide again for themselves (the handler); this line says it once, up front.
        print(device.select_device(None, env).log_line(), flush=True)
    except device.GpuUnavailableError as exc:
        print(f"d2ops serving: error: {exc}", flush=True)
    except ValueError as exc:
        raise launch.ServingError(str(exc)) from exc
    print(f"d2ops serving: preparing {model} in {workdir} for {backend}", flush=True)
    ping_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    ping_url = f"http://{ping_host}:{port}/ping"
    server: launch.ServerProcess
    if backend == "ray-serve":
        from model_code.serving.ray_launch import RayServeProcess

        workdir.mkdir(parents=True, exist_ok=True)  # launch.prepare does this for TorchServe
        server = RayServeProcess(launch.prepare_model_dir(model, workdir), workdir, host=host, port=port,
                                 ping_url=ping_url, settings=settings, config=base)
    else:
        config = launch.prepare(model, workdir, inference_address=f"http://{host}:{port}",
                                management_address=f"http://127.0.0.1:{management}",
                                metrics_address=f"http://127.0.0.1:{metrics}", settings=settings, grpc_ports=grpc)
        server = launch.TorchServeProcess(config, workdir, ping_url)

    parent = os.getppid()
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    launch.become_subreaper()  # the server's orphans are ours to reap, not our caller's (tini's in the image)
    server.start()
    (workdir / PID_FILE).write_text(str(server.pid))
    try:
        waited = 0.0
        healthy = False
        while not stopping.is_set():
            code = server.proc.poll() if server.proc else 1
            if code is not None:
                print(f"d2ops serving: {server.name} exited with code {code}; logs in {server.logs_dir}", flush=True)
                return 1
            if not healthy and server.ping() == 200:
                healthy = True
                print(f"d2ops serving: model ready after {waited:.1f} s; listening on http://{host}:{port} "
                      f"(/ping, /invocations, /predictions/{launch.MODEL_NAME})", flush=True)
            if not healthy and waited > timeout:
                print(f"d2ops serving: /ping not healthy after {timeout:.0f} s; stopping", flush=True)
                return 1
            if stop_with_parent and os.getppid() != parent:
                # Reparented: whoever started the server was killed without stopping it (a SIGKILLed `d2ops
                # demo`, a test run cut short). Its server (TorchServe's JVM, Ray's dozen processes) must not
                # outlive it, holding ports and memory.
                print(f"d2ops serving: the process that started this server ({parent}) has exited; stopping",
                      flush=True)
                return 0
            stopping.wait(0.5)
            waited += 0.5
            launch.reap_orphans(keep=server.pid)
        print(f"d2ops serving: stopping {server.name}", flush=True)
        return 0
    finally:
        server.stop()
        launch.reap_orphans()
        (workdir / PID_FILE).unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["serve"]):
        print(f"usage: {sys.argv[0]} serve  (got {' '.join(args)!r}; SageMaker runs the image with 'serve')",
              file=sys.stderr)
        return 2
    try:
        return serve(os.environ)
    except launch.ServingError as exc:
        print(f"d2ops serving: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
