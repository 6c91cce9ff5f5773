"""``d2ops serve MODEL_PATH [--port PORT] [--backend torchserve|ray-serve]``: a local endpoint like SageMaker's."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from types import FrameType

from d2ops.commands.errors import UsageError
from model_code.serving.backends import BACKENDS, DEFAULT_BACKEND


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="serve a model directory or model.tar.gz on loopback (TorchServe or "
                                            "Ray Serve, as the serving image does)")
    p.add_argument("model_path", metavar="MODEL_PATH", help="model directory or model.tar.gz")
    p.add_argument("--port", type=int, default=8080, help="inference port for /ping and /invocations (default 8080)")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help=f"the server (the image's D2OPS_SERVING_BACKEND; default {DEFAULT_BACKEND})")
    p.add_argument("--batch-size", type=int, default=None, help="dynamic batch size (default: the image's)")
    p.add_argument("--max-batch-delay-ms", type=int, default=None, help="longest wait for a batch to fill")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for /ping (default 300)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d2ops.local.serving import LocalEndpoint, LocalServingError

    model = Path(args.model_path)
    if not model.exists():
        raise UsageError(f"{model}: no such model directory or model.tar.gz")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port")

    # Ctrl-C and SIGTERM, while starting or serving, end in the same clean stop: the endpoint's
    # server process group is stopped, no Java, Ray or worker process is left behind.
    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    endpoint = LocalEndpoint(model, port=args.port, batch_size=args.batch_size,
                             max_batch_delay_ms=args.max_batch_delay_ms, startup_timeout=args.startup_timeout,
                             backend=args.backend)
    name = {"torchserve": "TorchServe", "ray-serve": "Ray Serve"}[endpoint.backend]
    print(f"d2ops serve: starting {name} for {model} (logs in {endpoint.workdir})", flush=True)
    try:
        endpoint.start()
        print(f"d2ops serve: listening on {endpoint.url} (GET /ping, POST /invocations, "
              f"POST /predictions/model); Ctrl-C to stop", flush=True)
        while endpoint.proc is not None and endpoint.proc.poll() is None:
            time.sleep(0.5)
        print(f"d2ops serve: {name} stopped unexpectedly:\n{endpoint.log_tail()}", flush=True)
        return 1
    except LocalServingError as exc:
        print(f"d2ops serve: error: {exc}", flush=True)
        return 1
    except _Stop as reason:
        print(f"d2ops serve: {reason}: stopping", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        endpoint.stop()


class _Stop(Exception):
    """Ctrl-C or SIGTERM."""
