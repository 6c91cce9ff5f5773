"""The package boundaries (import-linter contracts) hold and cover every handler.

pyproject.toml holds the contracts; d2ops.import_contracts adds the Lambda handler packages from template.yaml's
functions (their one home) and runs lint-imports on the result, as `make lint` does.
"""

from __future__ import annotations

import subprocess
import tomllib

from d2ops.import_contracts import HANDLERS_CONTRACT, contracts_config, lint_imports
from d2ops.template import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(config: dict, contract_id: str) -> dict:
    return next(c for c in config["contracts"] if c["id"] == contract_id)


def test_every_lambda_handler_package_is_under_the_handlers_contract() -> None:
    # Read from disk, not from the template: every package under functions/ (functions/<fn>/<fn>/__init__.py)
    # is a root package and a source module of the handlers contract that lint-imports checks.
    packages = {p.parent.name for p in (REPO_ROOT / "functions").glob("*/*/__init__.py")
                if p.parent.name == p.parent.parent.name}
    assert packages, "no handler package found under functions/"
    config = contracts_config()
    handlers = set(_contract(config, HANDLERS_CONTRACT)["source_modules"])
    assert packages == handlers, (f"the {HANDLERS_CONTRACT} contract's source_modules (template.yaml's handler "
                                  f"packages): lacks {sorted(packages - handlers)}, has {sorted(handlers - packages)}")
    missing = packages - set(config["root_packages"])
    assert not missing, f"the contracts' root_packages lack {sorted(missing)}"


def test_the_completed_contracts_are_pyprojects_plus_the_handler_packages_only() -> None:
    # The completion adds, never loosens: every other setting and contract is pyproject.toml's as written.
    config = contracts_config()
    added = set(_contract(config, HANDLERS_CONTRACT)["source_modules"])
    assert config["root_packages"] == [*PYPROJECT["root_packages"], *sorted(added)]
    expected = [dict(c, source_modules=sorted(added)) if c["id"] == HANDLERS_CONTRACT else c
                for c in PYPROJECT["contracts"]]
    assert config["contracts"] == expected
    assert {k: v for k, v in config.items() if k != "root_packages"} == {
        k: v for k, v in PYPROJECT.items() if k != "root_packages"} | {"contracts": expected}


def test_the_contracts_hold(tmp_path) -> None:
    proc = lint_imports(["--no-logo", "--no-cache"], config_path=tmp_path / "importlinter.toml",
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(PYPROJECT['contracts'])} kept, 0 broken." in proc.stdout, proc.stdout[-4000:]
