"""Benchmarks behind the `make bench-*` targets (each ends by printing one JSON line of figures)."""

from __future__ import annotations

from pathlib import Path


def cpu_model() -> str:
    """The machine's CPU model, for the figures' record (docs/benchmarks.md names the machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
