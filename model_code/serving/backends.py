"""Which server the serving image runs: TorchServe (the default) or Ray Serve, chosen by one variable.

Both wrap the same framework-free :class:`model_code.serving.service.DetectionService`, so they
answer SageMaker's ``/ping`` and ``/invocations`` identically (docs/serving.md). The stack
parameter ``ServingBackend`` reaches the container as ``D2OPS_SERVING_BACKEND`` through
CreateModel's ``PrimaryContainer.Environment``. Standard library only: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Backend = Literal["torchserve", "ray-serve"]
BACKENDS: tuple[Backend, ...] = ("torchserve", "ray-serve")
DEFAULT_BACKEND: Backend = "torchserve"
BACKEND_ENV = "D2OPS_SERVING_BACKEND"
# What the supervisor of either server writes into the serving work dir: the server's process group id.
PID_FILE = "server.pid"


def parse_backend(value: str, where: str = BACKEND_ENV) -> Backend:
    """``value`` as a backend name; a ValueError naming ``where`` and the allowed values otherwise."""
    for backend in BACKENDS:
        if value == backend:
            return backend
    raise ValueError(f"{where}={value[:40]!r} is not a serving backend; expected one of {', '.join(BACKENDS)}")


def backend_from_env(env: Mapping[str, str]) -> Backend:
    """The backend ``env`` names (unset or empty: the default)."""
    raw = env.get(BACKEND_ENV)
    return parse_backend(raw) if raw else DEFAULT_BACKEND
