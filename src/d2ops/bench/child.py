"""One benchmark measurement in its own process, so one side's peak RSS, imports and caches never
count against the other's. The child is the benchmark's own module run with ``--measure KIND ...``;
it prints one JSON line of figures last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def measure_in_child(module: str, kind: str, *args: str | Path) -> dict[str, Any]:
    """``python -m MODULE --measure KIND ARGS...``'s last stdout line, parsed; a failure ends the bench."""
    proc = subprocess.run([sys.executable, "-m", module, "--measure", kind, *map(str, args)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} measurement failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
