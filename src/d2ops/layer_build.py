"""Build the CoreLayer: the core modules of d2ops and their runtime dependencies, nothing else.

``sam build`` runs this through ``tools/layer/Makefile`` (the layer's ``BuildMethod: makefile``)
in a scratch copy of ``src/``. The list of core modules has one home, the ``core`` contract of
``[tool.importlinter]`` in pyproject.toml: the same list import-linter checks imports no tooling
is the list the layer ships, so the two cannot drift apart. The ASL interpreter, the offline
runtime, the CLI and the benchmarks stay out of Lambda.

    python -m d2ops.layer_build --src . --pyproject ../pyproject.toml --out "$ARTIFACTS_DIR/python"

Standard library only: it runs under the bare python3.11 that ``sam build`` finds on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

CORE_CONTRACT = "core"
# Lambda's python3.11 runs on Amazon Linux 2 (glibc 2.26): only manylinux2014 wheels load there.
PLATFORM = ("--platform", "manylinux2014_x86_64", "--implementation", "cp", "--python-version", "3.11",
            "--only-binary=:all:")


class LayerBuildError(Exception):
    """The core list cannot be read, or names a module that is not in the source tree."""


def core_modules(pyproject: Path) -> tuple[str, ...]:
    """The ``source_modules`` of the import-linter contract whose id is ``core``."""
    try:
        config = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LayerBuildError(f"{pyproject}: cannot read it: {exc}") from exc
    contracts = config.get("tool", {}).get("importlinter", {}).get("contracts", [])
    for contract in contracts:
        if contract.get("id") == CORE_CONTRACT:
            return tuple(contract["source_modules"])
    raise LayerBuildError(f"{pyproject}: no [[tool.importlinter.contracts]] with id = {CORE_CONTRACT!r}")


def core_files(src: Path, modules: Iterable[str]) -> list[Path]:
    """Files (relative to ``src``) of the core modules and the ``__init__.py`` of every package above them."""
    files: set[Path] = set()
    for dotted in modules:
        parts = dotted.split(".")
        for depth in range(1, len(parts)):
            init = Path(*parts[:depth], "__init__.py")
            if not (src / init).is_file():
                raise LayerBuildError(f"{src / init}: missing; {dotted} is not inside a regular package")
            files.add(init)
        package, module = src.joinpath(*parts), src.joinpath(*parts).with_suffix(".py")
        if (package / "__init__.py").is_file():
            files.update(p.relative_to(src) for p in package.rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
        elif module.is_file():
            files.add(module.relative_to(src))
        else:
            raise LayerBuildError(f"core module {dotted}: neither {module} nor {package}/__init__.py exists")
    return sorted(files)


def build(src: Path, pyproject: Path, out: Path, *, requirements: Path | None = None) -> list[Path]:
    """Copy the core files into ``out`` and pip-install the requirements there; returns the copied files."""
    files = core_files(src, core_modules(pyproject))
    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out / rel)
    reqs = requirements or src / "requirements.txt"
    if reqs.is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-compile", "--no-warn-conflicts", "--target", str(out), *PLATFORM, "-r", str(reqs)],
                       check=True)
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.layer_build", description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path("."), help="the source tree (src/ or sam's copy of it)")
    parser.add_argument("--pyproject", type=Path, required=True, help="pyproject.toml holding the core list")
    parser.add_argument("--out", type=Path, required=True, help="the layer's python/ directory")
    args = parser.parse_args(argv)
    try:
        files = build(args.src, args.pyproject, args.out)
    except LayerBuildError as exc:
        parser.exit(2, f"layer_build: error: {exc}\n")
    print(f"CoreLayer: {len(files)} core files and {args.src / 'requirements.txt'} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
