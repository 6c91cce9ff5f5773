"""The training image's NCCL self-check (model_code/training/nccl_check.py, containers/training/nccl-check) on fake
hosts: a sysfs with or without an EFA device, the plugin library on the loader's path or not. And the image
itself: its LD_LIBRARY_PATH reaches the plugin its EFA installer version installs, and FI_PROVIDER is no longer
set for every host."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from d2ops.local import container_entry
from d2ops.template import REPO_ROOT
from d2ops_core import platform
from model_code.training import nccl_check
from tests.unit.test_platform_container_toolkit import final_stage

TRAINING = REPO_ROOT / "containers" / "training"
PLUGIN_DIR = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"


def fake_host(root: Path, devices: dict[str, str], plugin: str | None = f"{PLUGIN_DIR}/libnccl-net.so") -> Path:
    """A root with /sys/class/infiniband/<device>/device/driver -> .../drivers/<driver>, and the plugin file."""
    for name, driver in devices.items():
        device = root / "sys" / "class" / "infiniband" / name / "device"
        device.mkdir(parents=True)
        target = root / "sys" / "bus" / "pci" / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (device / "driver").symlink_to(os.path.relpath(target, device))
    if plugin:
        path = root / plugin.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF")
    return root


def test_an_efa_host_with_the_plugin_runs_nccl_over_efa(tmp_path: Path) -> None:
    """Mutations caught: EFA found by device name instead of its driver (rdmap* names), FI_PROVIDER not exported on
    an EFA host, the plugin looked for outside LD_LIBRARY_PATH."""
    root = fake_host(tmp_path, {"rdmap16s27": "efa", "mlx5_0": "mlx5_core"})
    network, exports = nccl_check.check({"LD_LIBRARY_PATH": f"{PLUGIN_DIR}:/opt/amazon/efa/lib"}, root)
    assert network.efa_devices == ("rdmap16s27",)
    assert network.plugin_path == root / PLUGIN_DIR.lstrip("/") / "libnccl-net.so"
    assert exports == {"FI_PROVIDER": "efa"} and network.fi_provider == "efa"
    assert network.transport == "EFA" and not network.warnings()
    assert "NCCL network EFA" in network.summary() and "rdmap16s27" in network.summary()


@pytest.mark.parametrize("devices", [{}, {"mlx5_0": "mlx5_core"}])
def test_a_host_without_efa_gets_no_fi_provider_and_says_sockets(tmp_path: Path, devices: dict[str, str]) -> None:
    """Mutation caught: FI_PROVIDER=efa set for every host again (the image's old global ENV)."""
    root = fake_host(tmp_path, devices)
    network, exports = nccl_check.check({"LD_LIBRARY_PATH": PLUGIN_DIR}, root)
    assert exports == {} and network.fi_provider is None
    assert network.transport == "TCP sockets"
    assert "no EFA device" in network.summary() and "FI_PROVIDER=(unset)" in network.summary()


def test_a_job_s_own_fi_provider_is_kept_and_a_wrong_one_is_named(tmp_path: Path) -> None:
    """Mutation caught: the entry overwriting FI_PROVIDER the job's Environment set."""
    root = fake_host(tmp_path, {"efa_0": "efa"})
    network, exports = nccl_check.check({"LD_LIBRARY_PATH": PLUGIN_DIR, "FI_PROVIDER": "tcp"}, root)
    assert exports == {} and network.fi_provider == "tcp"
    assert network.transport == "TCP sockets"
    assert any("FI_PROVIDER=tcp" in w for w in network.warnings())


def test_an_efa_host_whose_plugin_nccl_cannot_find_is_a_warning(tmp_path: Path) -> None:
    """The image's old LD_LIBRARY_PATH (/opt/amazon/ofi-nccl/lib) on an installer that puts the plugin one level
    down. Mutation caught: the check reporting the plugin by existence anywhere, not on the loader's path."""
    root = fake_host(tmp_path, {"efa_0": "efa"})
    network, _ = nccl_check.check({"LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib"}, root)
    assert network.plugin_path is None and network.transport == "TCP sockets"
    (warning,) = network.warnings()
    assert "libnccl-net.so" in warning and "TCP" in warning


def test_the_loader_s_configured_directories_count(tmp_path: Path) -> None:
    """A plugin directory registered in /etc/ld.so.conf.d is found without LD_LIBRARY_PATH."""
    root = fake_host(tmp_path, {"efa_0": "efa"})
    conf = root / "etc" / "ld.so.conf.d"
    conf.mkdir(parents=True)
    (conf / "aws-ofi-nccl.conf").write_text(f"# plugin\n{PLUGIN_DIR}\n")
    network, _ = nccl_check.check({}, root)
    assert network.transport == "EFA"


@pytest.mark.parametrize(("setting", "plugin", "found"), [
    ("ofi", "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "libnccl-net-ofi.so"),
    ("/opt/x/libplugin.so", "/opt/x/libplugin.so", "/opt/x/libplugin.so"),
    ("none", "/opt/amazon/ofi-nccl/lib/libnccl-net.so", None),
])
def test_nccl_net_plugin_chooses_the_library(tmp_path: Path, setting: str, plugin: str, found: str | None) -> None:
    """NCCL_NET_PLUGIN: a suffix, a library path, or none. Mutation caught: the variable ignored."""
    root = fake_host(tmp_path, {"efa_0": "efa"}, plugin=plugin)
    network, _ = nccl_check.check({"NCCL_NET_PLUGIN": setting, "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib"}, root)
    assert network.plugin_name == found
    assert (network.plugin_path is not None) == (found is not None)


# ----------------------------------------------------------------------------------------- the image
def efa_installer_version() -> tuple[int, int, int]:
    text = (TRAINING / "Dockerfile").read_text()
    match = re.search(r"^ARG EFA_INSTALLER_VERSION=(\d+)\.(\d+)\.(\d+)$", text, re.MULTILINE)
    assert match, "containers/training/Dockerfile: no ARG EFA_INSTALLER_VERSION=<x.y.z>"
    return int(match[1]), int(match[2]), int(match[3])


def test_the_image_s_loader_path_reaches_the_plugin_its_installer_installs() -> None:
    """Mutations caught: LD_LIBRARY_PATH back to /opt/amazon/ofi-nccl/lib with installer 1.43 (NCCL would find no
    plugin and use TCP on p4d/p5), the installer moved to 1.44+ without NCCL_NET_PLUGIN=ofi and its directory,
    FI_PROVIDER or FI_EFA_USE_DEVICE_RDMA set for every host again."""
    expected = platform.ofi_nccl_plugin(efa_installer_version())
    _, env = final_stage(TRAINING / "Dockerfile")
    assert expected.directory in env["LD_LIBRARY_PATH"].split(":")
    assert env.get("NCCL_NET_PLUGIN") == expected.net_plugin
    assert "FI_PROVIDER" not in env and "FI_EFA_USE_DEVICE_RDMA" not in env
    assert platform.ofi_nccl_plugin((1, 43, 3)) == platform.NcclPlugin(PLUGIN_DIR, "libnccl-net.so", None)
    assert platform.ofi_nccl_plugin((1, 44, 0)).net_plugin == "ofi"


def test_the_image_installs_the_check_beside_its_entry() -> None:
    """train runs "$(dirname "$0")/nccl-check", so the check must be copied next to /usr/local/bin/train."""
    copies = container_entry.parse_entry(container_entry.dockerfile_for("training")).copies
    assert copies.get("/usr/local/bin/nccl-check") == "containers/training/nccl-check"
    assert copies.get("/usr/local/bin/train") == "containers/training/train"


def run_entry(tmp_path: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """The real train script and nccl-check, with a stand-in cuda-compat that prints what the trainer would get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for script in ("train", "nccl-check"):
        shutil.copy2(TRAINING / script, bin_dir / script)
    (bin_dir / "cuda-compat").write_text('#!/bin/sh\nprintf "FI_PROVIDER=%s\\n" "${FI_PROVIDER-unset}"\n')
    (bin_dir / "cuda-compat").chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "D2OPS_SYSFS_ROOT": str(root), "LD_LIBRARY_PATH": PLUGIN_DIR}
    container_entry.python_on_path(env)
    return subprocess.run([str(bin_dir / "train"), "train"], env=env, capture_output=True, text=True, timeout=60,
                          check=True)


def test_the_entry_sets_fi_provider_on_an_efa_host_and_logs_the_network(tmp_path: Path) -> None:
    """Mutations caught: train no longer running nccl-check, or not eval'ing its exports before the trainer."""
    proc = run_entry(tmp_path, fake_host(tmp_path / "root", {"rdmap0s6": "efa"}))
    assert proc.stdout.strip() == "FI_PROVIDER=efa"
    assert "nccl-check: NCCL network EFA" in proc.stderr


def test_the_entry_leaves_fi_provider_unset_elsewhere(tmp_path: Path) -> None:
    proc = run_entry(tmp_path, fake_host(tmp_path / "root", {}))
    assert proc.stdout.strip() == "FI_PROVIDER=unset"
    assert "nccl-check: NCCL network TCP sockets" in proc.stderr
