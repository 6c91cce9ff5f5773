"""`make setup` on a fresh machine: it installs what the suite needs and names what is still missing.

The Makefile is exercised through make itself (its rule graph, and the system-package rule run with a
recording apt-get); d2ops.setup_check through its probes against stand-in executables on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from d2ops import setup_check
from d2ops.setup_check import Missing, Tool

REPO = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")


def make_dry_run(*args: str) -> str:
    assert MAKE is not None
    return subprocess.run([MAKE, "-C", str(REPO), *args], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def rule_graph(database: str) -> dict[str, set[str]]:
    """target -> prerequisites (normal and order-only) from `make -p`'s database."""
    graph: dict[str, set[str]] = {}
    for line in database.splitlines():
        found = re.match(r"^([^#\s][^:=]*?):(?![=:])\s*(.*)$", line)
        if found and not line.startswith("\t"):
            for target in found[1].split():
                graph.setdefault(target, set()).update(found[2].replace("|", " ").split())
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        target = todo.pop()
        if target not in seen:
            seen.add(target)
            todo.extend(graph.get(target, ()))
    return seen


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_setup_builds_every_stamp_the_makefile_defines_and_checks_last() -> None:
    # The bug this guards: `setup: ... $(CHROMIUM_STAMP)` written above `CHROMIUM_STAMP := ...` expanded to
    # nothing, so a fresh machine never got Chromium. Every *_STAMP must be a prerequisite make really sees.
    database = make_dry_run("-pn", "setup")
    stamps = dict(re.findall(r"^([A-Z0-9_]*STAMP) :?= (\S+)$", database, flags=re.M))
    assert {"STAMP", "D2_STAMP", "NODE_STAMP"} <= set(stamps), stamps
    graph = rule_graph(database)
    needed = reachable(graph, "setup")
    assert {stamps[name] for name in stamps} <= needed, {n: v for n, v in stamps.items() if v not in needed}
    # The Debian packages come before the venv (its step compiles the /ping plugin with javac) and npm ci.
    assert "system-packages" in graph[stamps["STAMP"]] and "system-packages" in graph[stamps["NODE_STAMP"]]
    assert "system-packages" in needed


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_setup_runs_its_check_even_when_everything_is_installed() -> None:
    assert "d2ops.setup_check" in make_dry_run("-n", "setup")


def fake_bin(tmp_path: Path, scripts: dict[str, str], link: tuple[str, ...] = ()) -> Path:
    """A PATH directory holding only the given shell scripts and links to the named real tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body + "\n")
        script.chmod(0o755)
    for name in link:
        real = shutil.which(name)
        assert real is not None, name
        (bin_dir / name).symlink_to(real)
    return bin_dir


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_system_packages_installs_what_is_missing_with_apt_get(tmp_path: Path) -> None:
    # A machine with a JDK but neither Chromium nor Node.js; `id` says root, so apt-get is called directly.
    calls = tmp_path / "apt-calls"
    bin_dir = fake_bin(tmp_path, {"apt-get": f'echo "$@" >> {calls}', "id": "echo 0", "javac": "exit 0",
                                  "java": "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2"},
                       link=("bash", "sh", "env", "sed"))
    assert MAKE is not None
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    # The rule's Python (the system one on a fresh machine) is this interpreter here.
    make = [MAKE, "-C", str(REPO), "--no-print-directory", "system-packages", f"PYTHON={sys.executable}"]
    done = subprocess.run(make, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("update")
    installed = lines[1].split()
    assert installed[:2] == ["install", "-y"] and {"chromium", "nodejs", "npm"} <= set(installed), installed
    assert "default-jdk-headless" not in installed  # the JDK is there

    # Nothing missing: apt-get is not called at all.
    calls.unlink()
    fake_bin(tmp_path, {"chromium": "echo Chromium 150", "npm": "exit 0", "node": "echo v20.0.0"})
    subprocess.run(make, env=env, capture_output=True, timeout=120, check=True)
    assert not calls.exists()


def test_missing_tools_name_their_debian_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path, {"npm": "exit 0", "node": "echo v20.0.0"})))
    monkeypatch.delenv("D2OPS_CHROMIUM", raising=False)
    assert setup_check.missing_debian_packages(setup_check.tools(None, ci=False)) == [
        "chromium", "default-jdk-headless"]


def test_the_demo_checks_only_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "detectron2-0.6-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    demo = {t.name: t for t in setup_check.tools(tmp_path, ci=True, purpose="demo")}
    # No browser, Node or lint tools; detectron2 only said (the demo trains torchvision without it).
    assert set(demo) == {"java", "python tools", "detectron2"}
    assert demo["java"].required and not demo["detectron2"].required


def test_chromium_is_found_through_the_env_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_bin(tmp_path, {"chromium-browser": 'echo "Chromium 150.0.1 built on Debian"'})
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("D2OPS_CHROMIUM", raising=False)
    assert setup_check.chromium_path() == str(bin_dir / "chromium-browser")
    assert setup_check.probe_chromium().startswith("Chromium 150.0.1")
    monkeypatch.setenv("D2OPS_CHROMIUM", str(tmp_path / "nowhere"))
    with pytest.raises(Missing, match="nowhere does not exist"):
        setup_check.probe_chromium()
    monkeypatch.delenv("D2OPS_CHROMIUM")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(Missing, match="none of chromium"):
        setup_check.probe_chromium()


def test_a_chromium_that_does_not_start_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_bin(tmp_path, {"chromium": "echo 'error while loading shared libraries' >&2; exit 127"})
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("D2OPS_CHROMIUM", raising=False)
    with pytest.raises(Missing, match="exited 127: error while loading shared libraries"):
        setup_check.probe_chromium()


@pytest.mark.parametrize(("printed", "ok"), [
    ('openjdk version "17.0.15" 2025-04-15', True),
    ('openjdk version "11" 2018-09-25', True),
    ('java version "1.8.0_392"', False),
    ('openjdk version "9.0.4"', False),
])
def test_java_needs_a_jdk_of_version_11_or_newer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printed: str,
                                                 ok: bool) -> None:
    bin_dir = fake_bin(tmp_path, {"java": f"echo '{printed}' >&2", "javac": "exit 0"})
    monkeypatch.setenv("PATH", str(bin_dir))
    if ok:
        assert setup_check.probe_java() == printed
    else:
        with pytest.raises(Missing, match="needs Java 11"):
            setup_check.probe_java()
    (bin_dir / "javac").unlink()  # a JRE without a compiler cannot build the /ping plugin
    with pytest.raises(Missing, match="no javac"):
        setup_check.probe_java()


def test_detectron2_is_required_where_a_wheel_is_offered_or_in_ci(tmp_path: Path) -> None:
    def required(wheels: Path | None, ci: bool) -> bool:
        return next(t for t in setup_check.tools(wheels, ci) if t.name == "detectron2").required

    assert not required(tmp_path, ci=False) and not required(None, ci=False)
    assert required(None, ci=True)
    (tmp_path / "detectron2-0.6-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert required(tmp_path, ci=False)


def test_the_check_names_each_missing_tool_and_its_fix_and_fails() -> None:
    def missing() -> str:
        raise Missing("not on PATH")

    lines: list[str] = []
    checks = [Tool("chromium", "the console tests", "`apt-get install -y chromium`", missing),
              Tool("java", "TorchServe", "a JDK", lambda: "openjdk 17"),
              Tool("detectron2", "the trainer", "the wheel", missing, required=False)]
    assert setup_check.run_checks(checks, out=lines.append, what="`make test`") == 1
    text = "\n".join(lines)
    assert "MISSING  chromium (needed by the console tests): not on PATH; fix: `apt-get install -y chromium`" in text
    assert "ok       java: openjdk 17" in text and "absent   detectron2" in text
    assert lines[-1] == "setup check: 1 tool(s) missing: chromium; `make test` would fail on them"
    lines.clear()
    assert setup_check.run_checks(checks[1:], out=lines.append) == 0  # an optional tool absent is not a failure
