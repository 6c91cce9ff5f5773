"""The package boundaries (import-linter contracts in pyproject.toml) hold and cover every handler."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from d2ops.template import REPO_ROOT, load_template

CONFIG = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(contract_id: str) -> dict[str, list[str]]:
    return next(c for c in CONFIG["contracts"] if c["id"] == contract_id)


def test_every_lambda_handler_package_is_under_the_handlers_contract() -> None:
    # pyproject.toml's two lists of handler packages, checked against template.yaml's functions (import-linter
    # reads static TOML, so they cannot be derived): a new function is one name in each list.
    packages = {fn.handler_module.split(".")[0] for fn in load_template().functions().values()}
    handlers = set(_contract("handlers")["source_modules"])
    assert packages == handlers, ("pyproject.toml's handlers contract (source_modules): "
                                  f"add {sorted(packages - handlers)}, remove {sorted(handlers - packages)}")
    missing = packages - set(CONFIG["root_packages"])
    assert not missing, f"pyproject.toml's [tool.importlinter] root_packages lacks {sorted(missing)}"


def test_the_contracts_hold() -> None:
    function_dirs = sorted({str(fn.code_dir) for fn in load_template().functions().values()})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT), *function_dirs])}
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports), "--no-logo", "--no-cache"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
