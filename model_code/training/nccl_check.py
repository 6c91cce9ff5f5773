"""Which network NCCL will use on this host, said once at job start (``nccl-check`` in the training image).

A multi-node job on p4d/p5 should run NCCL over EFA through AWS's aws-ofi-nccl plugin; anywhere else NCCL
uses TCP sockets. Both fail silently (a slow job, not an error), so the entry logs the facts that decide it:
the plugin library NCCL would open, the EFA devices present, FI_PROVIDER. It also decides FI_PROVIDER
(``--exports``): ``efa`` only where an EFA device exists, never over a value the job was given.
Standard library only: it runs before torch is imported. The facts: d2ops_core.platform.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from d2ops_core import platform

# Where the loader looks besides LD_LIBRARY_PATH (ld.so.cache is built from these and ld.so.conf.d).
_SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib", "/lib64", "/usr/lib64")


@dataclass(frozen=True)
class NcclNetwork:
    plugin_name: str | None  # the library NCCL opens; None: NCCL_NET_PLUGIN=none
    plugin_path: Path | None  # where the loader would find it; None: nowhere
    efa_devices: tuple[str, ...]
    fi_provider: str | None  # as the job will run (after :func:`provider_exports`)

    @property
    def transport(self) -> str:
        if self.plugin_path is not None and self.efa_devices and self.fi_provider in (None, platform.EFA_PROVIDER):
            return "EFA"
        return "TCP sockets"

    def summary(self) -> str:
        """One line for the job's log."""
        plugin = (f"plugin {self.plugin_path}" if self.plugin_path else
                  "no network plugin (NCCL_NET_PLUGIN=none)" if self.plugin_name is None else
                  f"no {self.plugin_name} on the loader's path")
        efa = f"EFA devices {', '.join(self.efa_devices)}" if self.efa_devices else "no EFA device"
        provider = self.fi_provider or "(unset)"
        line = f"nccl-check: NCCL network {self.transport}: {plugin}; {efa}; FI_PROVIDER={provider}"
        return line + "".join(f"; WARNING {w}" for w in self.warnings())

    def warnings(self) -> list[str]:
        out = []
        if self.efa_devices and self.plugin_path is None and self.plugin_name is not None:
            out.append(f"this host has EFA but NCCL will not find {self.plugin_name}: multi-node traffic goes over "
                       "TCP (check LD_LIBRARY_PATH against d2ops_core.platform.ofi_nccl_plugin)")
        if self.efa_devices and self.fi_provider not in (None, platform.EFA_PROVIDER):
            out.append(f"FI_PROVIDER={self.fi_provider} keeps aws-ofi-nccl off this host's EFA devices")
        return out


def efa_devices(sys_root: Path) -> tuple[str, ...]:
    """RDMA devices bound to the kernel's efa driver, under ``sys_root``/sys/class/infiniband."""
    base = sys_root / "sys" / "class" / "infiniband"
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return ()
    found = []
    for name in names:
        try:
            driver = os.readlink(base / name / "device" / "driver")
        except OSError:
            continue
        if Path(driver).name == platform.EFA_DRIVER:
            found.append(name)
    return tuple(found)


def plugin_candidates(env: Mapping[str, str]) -> tuple[str, ...]:
    """The library names NCCL tries, in order; () for NCCL_NET_PLUGIN=none."""
    chosen = env.get("NCCL_NET_PLUGIN", "").strip()
    if not chosen:
        return (platform.NCCL_DEFAULT_PLUGIN,)
    if chosen == "none":
        return ()
    return (chosen, f"libnccl-net-{chosen}.so", platform.NCCL_DEFAULT_PLUGIN)


def loader_dirs(env: Mapping[str, str], root: Path) -> list[Path]:
    """LD_LIBRARY_PATH's directories, then ld.so.conf.d's and the system's (all under ``root``)."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    conf = root / "etc" / "ld.so.conf.d"
    for file in sorted(conf.glob("*.conf")) if conf.is_dir() else []:
        dirs += [line.strip() for line in file.read_text(errors="replace").splitlines()
                 if line.strip().startswith("/")]
    dirs += _SYSTEM_DIRS
    return [root / d.lstrip("/") for d in dirs]


def find_plugin(env: Mapping[str, str], root: Path) -> tuple[str | None, Path | None]:
    """(the library name NCCL settles on, where the loader finds it)."""
    candidates = plugin_candidates(env)
    for name in candidates:
        if "/" in name:
            path = root / name.lstrip("/")
            if path.is_file():
                return name, path
            continue
        for directory in loader_dirs(env, root):
            if (directory / name).is_file():
                return name, directory / name
    return (candidates[-1] if candidates else None), None


def provider_exports(env: Mapping[str, str], devices: Sequence[str]) -> dict[str, str]:
    """FI_PROVIDER=efa where this host has EFA and the job set no FI_PROVIDER of its own; nothing otherwise."""
    if devices and not env.get("FI_PROVIDER"):
        return {"FI_PROVIDER": platform.EFA_PROVIDER}
    return {}


def check(env: Mapping[str, str], root: Path = Path("/")) -> tuple[NcclNetwork, dict[str, str]]:
    devices = efa_devices(root)
    exports = provider_exports(env, devices)
    name, path = find_plugin(env, root)
    fi_provider = exports.get("FI_PROVIDER", env.get("FI_PROVIDER") or None)
    return NcclNetwork(name, path, devices, fi_provider), exports


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nccl-check", description=__doc__.splitlines()[0])
    parser.add_argument("--exports", action="store_true",
                        help="print `export NAME=value` lines for the entry to eval (the summary goes to stderr)")
    args = parser.parse_args(argv)
    # D2OPS_SYSFS_ROOT: a fake root for tests (sys/class/infiniband, etc/ld.so.conf.d, library dirs).
    network, exports = check(os.environ, Path(os.environ.get("D2OPS_SYSFS_ROOT", "/")))
    print(network.summary(), file=sys.stderr if args.exports else sys.stdout, flush=True)
    if args.exports:
        for key, value in exports.items():
            print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
