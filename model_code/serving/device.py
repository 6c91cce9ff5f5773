"""Which device the server runs the model on, and when it must refuse to run on CPU.

A serving image whose torch needs a newer CUDA driver than the host has does not crash: torch
reports CUDA unavailable and the model quietly runs on CPU, ten times slower, behind a healthy
``/ping``. So the decision is explicit. ``D2OPS_REQUIRE_GPU`` says whether this server needs a
GPU:

- ``auto`` (default): needed when the host exposes NVIDIA GPUs to the container (``/dev/nvidia0``,
  ``/proc/driver/nvidia/gpus``), which is what SageMaker does on ml.g*/ml.p* instances;
- ``true``: always needed (set it in the model's Environment to be explicit on GPU instance types);
- ``false``: never needed; CUDA is still used when it works.

When a GPU is needed and CUDA is unusable, :func:`decide` raises :class:`GpuUnavailableError`:
the TorchServe handler's ``initialize`` fails with it, no worker becomes ready and ``/ping``
stays unhealthy; the entry point logs the same reason once at start-up. The decision is a pure
function of a :class:`CudaProbe`, so it is tested without a GPU.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REQUIRE_GPU_VARIABLE = "D2OPS_REQUIRE_GPU"
Requirement = Literal["auto", "true", "false"]
_WORDS: dict[str, Requirement] = {"auto": "auto", "": "auto", "true": "true", "1": "true", "yes": "true",
                                  "false": "false", "0": "false", "no": "false"}


class GpuUnavailableError(RuntimeError):
    """A GPU is required here but torch cannot use CUDA: serving on CPU would be a silent degradation."""


@dataclass(frozen=True)
class CudaProbe:
    """What this process can see: torch's CUDA state and the NVIDIA devices the host exposes."""

    torch_version: str
    torch_cuda: str | None  # the CUDA version torch was built for (None: a CPU-only build)
    cuda_available: bool
    device_count: int
    device_names: tuple[str, ...] = ()
    nvidia_devices: tuple[str, ...] = ()  # /dev/nvidiaN or /proc/driver/nvidia/gpus/* entries
    driver_version: str | None = None
    cuda_error: str | None = None  # torch's warning or exception when CUDA initialisation failed

    def describe(self) -> str:
        flavour = f"CUDA {self.torch_cuda} build" if self.torch_cuda else "CPU build"
        build = f"torch {self.torch_version} ({flavour})"
        driver = f"NVIDIA driver {self.driver_version}" if self.driver_version else "no NVIDIA driver visible"
        gpus = f"{len(self.nvidia_devices)} NVIDIA device(s) exposed" if self.nvidia_devices else "no NVIDIA device"
        return f"{build}; {driver}; {gpus}"


@dataclass(frozen=True)
class DeviceDecision:
    device: str  # "cpu" or "cuda:N"
    reason: str

    def log_line(self) -> str:
        return f"d2ops serving: model runs on {self.device} ({self.reason})"


def requirement(env: Mapping[str, str]) -> Requirement:
    raw = env.get(REQUIRE_GPU_VARIABLE, "")
    word = _WORDS.get(raw.strip().lower())
    if word is None:
        raise ValueError(f"{REQUIRE_GPU_VARIABLE}={raw!r}: expected auto, true or false")
    return word


def decide(required: Requirement, probe: CudaProbe, gpu_id: int | str | None = None) -> DeviceDecision:
    """The device to serve on; raises GpuUnavailableError instead of falling back to CPU where a GPU is needed."""
    if probe.cuda_available and probe.device_count > 0:
        index = int(gpu_id) % probe.device_count if gpu_id is not None else 0
        name = probe.device_names[index] if index < len(probe.device_names) else "GPU"
        return DeviceDecision(f"cuda:{index}", f"{name}; {probe.describe()}")
    needed = required == "true" or (required == "auto" and bool(probe.nvidia_devices))
    why_unusable = probe.cuda_error or ("torch is a CPU-only build" if not probe.torch_cuda
                                        else "torch.cuda.is_available() is False")
    if needed:
        because = (f"{REQUIRE_GPU_VARIABLE}=true" if required == "true"
                   else f"this host exposes NVIDIA GPUs ({', '.join(probe.nvidia_devices[:4])})")
        raise GpuUnavailableError(
            f"a GPU is required ({because}) but CUDA is unusable: {why_unusable}; {probe.describe()}. "
            "Refusing to serve on CPU: /ping stays unhealthy. Use a serving image whose torch CUDA build fits "
            f"the host's driver (containers/serving/Dockerfile), or set {REQUIRE_GPU_VARIABLE}=false to allow CPU")
    if probe.nvidia_devices:
        return DeviceDecision("cpu", f"CUDA unusable ({why_unusable}) and {REQUIRE_GPU_VARIABLE}=false; "
                                     f"{probe.describe()}")
    return DeviceDecision("cpu", f"no GPU on this host; {probe.describe()}")


def _nvidia_devices() -> tuple[str, ...]:
    found = sorted(glob.glob("/dev/nvidia[0-9]*")) or sorted(glob.glob("/proc/driver/nvidia/gpus/*"))
    return tuple(found)


def _driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  ..."
    for word in text.split():
        if word[:1].isdigit() and word.count(".") >= 1:
            return word
    return None


def probe_cuda() -> CudaProbe:
    """Ask torch (capturing the warning it gives when the driver is too old) and the OS."""
    import torch

    error: str | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = bool(torch.cuda.is_available())
            count = torch.cuda.device_count() if available else 0
            names = tuple(torch.cuda.get_device_name(i) for i in range(count))
        except Exception as exc:  # any CUDA initialisation failure means "unusable", with its text
            available, count, names, error = False, 0, (), f"{type(exc).__name__}: {exc}"
    if error is None and not available:
        messages = [str(w.message) for w in caught if "cuda" in str(w.message).lower()]
        error = " ".join(" ".join(messages).split())[:400] or None
    return CudaProbe(torch_version=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=available,
                     device_count=count, device_names=names, nvidia_devices=_nvidia_devices(),
                     driver_version=_driver_version(), cuda_error=error)


def select_device(gpu_id: int | str | None = None, env: Mapping[str, str] = os.environ) -> DeviceDecision:
    """:func:`decide` for this process (the handler's ``initialize`` and the entry point call it)."""
    return decide(requirement(env), probe_cuda(), gpu_id)
