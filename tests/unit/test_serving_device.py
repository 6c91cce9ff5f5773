"""The serving device decision: a GPU host whose torch cannot use CUDA must not serve on CPU."""

from __future__ import annotations

import re

import pytest

from d2ops.template import REPO_ROOT
from model_code.serving.device import (
    CudaProbe,
    GpuUnavailableError,
    decide,
    requirement,
)

CUDA13_ON_DRIVER_550 = CudaProbe(
    torch_version="2.14.1", torch_cuda="13.0", cuda_available=False, device_count=0,
    nvidia_devices=("/dev/nvidia0",), driver_version="550.127.05",
    cuda_error="CUDA initialization: The NVIDIA driver on your system is too old (found version 12040).")
WORKING_GPU = CudaProbe(torch_version="2.14.1+cu126", torch_cuda="12.6", cuda_available=True, device_count=2,
                        device_names=("NVIDIA A10G", "NVIDIA A10G"), nvidia_devices=("/dev/nvidia0", "/dev/nvidia1"),
                        driver_version="550.127.05")
CPU_HOST = CudaProbe(torch_version="2.14.1", torch_cuda="13.0", cuda_available=False, device_count=0)


def test_a_working_gpu_is_used_with_the_worker_s_gpu_id() -> None:
    decision = decide("auto", WORKING_GPU, gpu_id="1")
    assert decision.device == "cuda:1"
    assert "NVIDIA A10G" in decision.log_line() and "driver 550.127.05" in decision.log_line()
    assert decide("auto", WORKING_GPU, gpu_id=3).device == "cuda:1"  # more workers than GPUs wrap around
    assert decide("false", WORKING_GPU).device == "cuda:0"  # "not required" still uses a GPU that works


def test_a_gpu_host_with_a_too_new_torch_refuses_instead_of_serving_on_cpu() -> None:
    with pytest.raises(GpuUnavailableError) as caught:
        decide("auto", CUDA13_ON_DRIVER_550)
    message = str(caught.value)
    assert "this host exposes NVIDIA GPUs (/dev/nvidia0)" in message
    assert "driver on your system is too old" in message  # torch's own reason
    assert "CUDA 13.0 build" in message and "NVIDIA driver 550.127.05" in message
    assert "/ping stays unhealthy" in message


def test_required_gpu_without_any_gpu_refuses_and_names_the_setting() -> None:
    with pytest.raises(GpuUnavailableError, match=r"D2OPS_REQUIRE_GPU=true\) but CUDA is unusable"):
        decide("true", CPU_HOST)


def test_cpu_hosts_and_explicit_opt_out_serve_on_cpu_and_say_why() -> None:
    plain = decide("auto", CPU_HOST)
    assert plain.device == "cpu" and "no GPU on this host" in plain.reason
    allowed = decide("false", CUDA13_ON_DRIVER_550)
    assert allowed.device == "cpu" and "D2OPS_REQUIRE_GPU=false" in allowed.reason
    assert "too old" in allowed.reason


@pytest.mark.parametrize(("raw", "expected"), [
    (None, "auto"), ("", "auto"), ("auto", "auto"), ("TRUE", "true"), ("1", "true"), ("no", "false")])
def test_requirement_words(raw: str | None, expected: str) -> None:
    env = {} if raw is None else {"D2OPS_REQUIRE_GPU": raw}
    assert requirement(env) == expected


def test_requirement_typo_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="D2OPS_REQUIRE_GPU='ture': expected auto, true or false"):
        requirement({"D2OPS_REQUIRE_GPU": "ture"})


def test_serving_image_installs_a_cuda_12_torch_matching_the_pinned_version() -> None:
    """PyPI's torch is a CUDA 13 build (driver >= 580), which no endpoint host of an allowed family gets
    by default or through a documented AMI (d2ops_core.platform; tests/unit/test_platform_gpu.py)."""
    dockerfile = (REPO_ROOT / "containers" / "serving" / "Dockerfile").read_text()
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    index = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", dockerfile, re.M)
    assert index and re.search(r"/whl/cu12\d$", index.group(1)), "the serving torch must be a CUDA 12.x build"
    install = re.search(r'--index-url "\$\{TORCH_INDEX_URL\}" (torch==\S+) (torchvision==\S+)', dockerfile)
    assert install, "torch and torchvision must come from TORCH_INDEX_URL"
    for pin in install.groups():
        # the development environment runs the same versions (the +cu12x local version aside)
        assert f'"{pin}"' in pyproject, f"{pin} differs from pyproject.toml"
    # The hash-checked lock (no torch in it) goes first, so the torch pair's own install neither replaces
    # it nor is replaced by it: torchvision finds the locked numpy and Pillow already there.
    lock_install = dockerfile.index("--require-hashes -r /opt/d2ops/containers/serving/requirements.lock")
    assert lock_install < dockerfile.index('"${TORCH_INDEX_URL}" torch==')
