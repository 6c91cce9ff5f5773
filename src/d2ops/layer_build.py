"""Build the CoreLayer: the d2ops_core package and its runtime dependencies, nothing else.

``sam build`` runs this through ``tools/layer/Makefile`` (the layer's ``BuildMethod: makefile``)
in a scratch copy of ``src/``. The core is one package (src/d2ops_core), so what ships is a
folder, not a list: the ASL interpreter, the offline runtime, the CLI and the benchmarks (src/d2ops)
stay out of Lambda.

    python -m d2ops.layer_build --src . --out "$ARTIFACTS_DIR/python"

Standard library only: it runs under the bare python3.11 that ``sam build`` finds on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CORE_PACKAGE = "d2ops_core"
# src/requirements.txt compiled with every file's sha256 (`make pins`): the layer installs exactly the
# locked versions, and pip refuses a file whose hash differs from the lock's.
LOCK = "requirements.lock"
# Lambda's python3.11 runs on Amazon Linux 2 (glibc 2.26): only manylinux2014 wheels load there.
PLATFORM = ("--platform", "manylinux2014_x86_64", "--implementation", "cp", "--python-version", "3.11",
            "--only-binary=:all:")


class LayerBuildError(Exception):
    """The source tree has no core package, or no lock of its dependencies."""


def core_files(src: Path) -> list[Path]:
    """Files of the core package, relative to ``src`` (bytecode caches left out)."""
    package = src / CORE_PACKAGE
    if not (package / "__init__.py").is_file():
        raise LayerBuildError(f"{package}/__init__.py: missing; is {src} the source tree?")
    return sorted(p.relative_to(src) for p in package.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def pip_command(lock: Path, out: Path) -> list[str]:
    """pip installing ``lock`` into ``out`` for Lambda's platform, every file checked against its hash."""
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
            "--no-warn-conflicts", "--require-hashes", "--target", str(out), *PLATFORM, "-r", str(lock)]


def build(src: Path, out: Path, *, install: bool = True) -> list[Path]:
    """Copy the core files into ``out`` and install the locked dependencies there; returns the copied files."""
    files = core_files(src)
    lock = src / LOCK
    if install and not lock.is_file():
        raise LayerBuildError(f"{lock}: missing; `make pins` writes it from {src / 'requirements.txt'}")
    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out / rel)
    if install:
        subprocess.run(pip_command(lock, out), check=True)
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.layer_build", description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path("."), help="the source tree (src/ or sam's copy of it)")
    parser.add_argument("--out", type=Path, required=True, help="the layer's python/ directory")
    args = parser.parse_args(argv)
    try:
        files = build(args.src, args.out)
    except LayerBuildError as exc:
        parser.exit(2, f"layer_build: error: {exc}\n")
    print(f"CoreLayer: {len(files)} core files and {args.src / LOCK} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
