"""The import-linter contracts with the Lambda handler packages added from template.yaml, and lint-imports on them.

pyproject.toml's ``[tool.importlinter]`` holds the contracts and the tooling's packages; the handler
packages (``functions/<fn>/<fn>``, top-level packages as in Lambda) have their one home in template.yaml's
functions. ``python -m d2ops.import_contracts [lint-imports options]`` (``make lint``) writes the completed
configuration to ``build/importlinter.toml`` (each handler package a root package and a source module of the
``handlers`` contract) and runs ``lint-imports --config`` on it with each function's code directory on
``PYTHONPATH``. A bare ``lint-imports`` reads pyproject.toml alone and refuses the incomplete ``handlers``
contract, rather than checking less.

Developer tooling: nothing in the Lambda code or the images imports this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from d2ops.template import REPO_ROOT, load_template

HANDLERS_CONTRACT = "handlers"  # pyproject.toml's contract whose source modules are the handler packages
CONFIG_PATH = REPO_ROOT / "build" / "importlinter.toml"


def handler_packages() -> list[str]:
    """The top-level package of each template.yaml function's handler, sorted."""
    return sorted({fn.handler_module.split(".")[0] for fn in load_template().functions().values()})


def contracts_config() -> dict[str, Any]:
    """pyproject.toml's ``[tool.importlinter]`` with the handler packages added (a new dict)."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    packages = handler_packages()
    config["root_packages"] = [*config["root_packages"], *packages]
    handlers = next(c for c in config["contracts"] if c["id"] == HANDLERS_CONTRACT)
    if "source_modules" in handlers:  # one home: a list here would drift from template.yaml's functions
        raise ValueError(f"pyproject.toml's {HANDLERS_CONTRACT!r} contract lists source_modules; "
                         "they are template.yaml's handler packages, added by d2ops.import_contracts")
    handlers["source_modules"] = packages
    return config


def _toml(config: dict[str, Any]) -> str:
    # The values are strings, booleans and lists of strings: their JSON spelling is TOML's.
    def table(values: dict[str, Any]) -> list[str]:
        return [f"{key} = {json.dumps(value)}" for key, value in values.items()]

    lines = ["# Written by `python -m d2ops.import_contracts` (make lint) from pyproject.toml and template.yaml.",
             "[tool.importlinter]", *table({k: v for k, v in config.items() if k != "contracts"})]
    for contract in config["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *table(contract)]
    return "\n".join(lines) + "\n"


def write_config(path: Path = CONFIG_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_toml(contracts_config()))
    return path


def lint_imports(
    args: Sequence[str] = (), config_path: Path = CONFIG_PATH, **run: Any
) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` (this interpreter's) on the completed contracts; ``run``: subprocess.run's options."""
    write_config(config_path)
    code_dirs = sorted({str(fn.code_dir) for fn in load_template().functions().values()})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT), *code_dirs])}
    command = [str(Path(sys.executable).parent / "lint-imports"), "--config", str(config_path), *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, check=False, text=True, **run)


def main(argv: Sequence[str] | None = None) -> int:
    return lint_imports(sys.argv[1:] if argv is None else argv).returncode


if __name__ == "__main__":
    raise SystemExit(main())
