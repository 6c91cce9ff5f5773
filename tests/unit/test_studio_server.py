"""studio_server: how the demo and the labelling tests find, migrate and start Label Studio, against a stand-in
executable that migrates (``version`` writes the database) and answers /health as the real one does (the real
server: tests/e2e/test_demo_loop.py, tests/integration/test_label_studio.py). About two seconds."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import pytest

from d2ops.commands.demo_loop import BackgroundStudio, NotYet
from d2ops.labelling import studio_server

STAND_IN = f"""#!{sys.executable}
import http.server, os, sys
data = os.environ["LABEL_STUDIO_BASE_DATA_DIR"]
if sys.argv[1] == "version":  # the real one migrates its data directory's database and exits
    open(os.path.join(os.path.dirname(os.path.dirname(sys.argv[0])), "migrations"), "a").write("x")
    open(os.path.join(data, "label_studio.sqlite3"), "w").write("migrated")
    sys.exit(0)
open(os.path.join(data, "had-database"), "w").write(str(os.path.exists(os.path.join(data, "label_studio.sqlite3"))))
port = int(sys.argv[sys.argv.index("--port") + 1])
open(os.path.join(os.environ["LABEL_STUDIO_BASE_DATA_DIR"], "pid"), "w").write(str(os.getpid()))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def tool(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "env" / "bin" / "label-studio"  # a tool environment's layout: the template goes in env/
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_server_answers_inside_the_block_and_is_gone_after_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with studio_server.studio_server(data, tool(tmp_path, STAND_IN)) as server:
        with urllib.request.urlopen(f"{server.url}/health", timeout=5) as answer:
            assert answer.status == 200
        pid = int((data / "pid").read_text())
        assert alive(pid) and len(server.token) == 40
        # catches a start that ignores the migrated template (every start would migrate for 90-140 s)
        assert (data / "had-database").read_text() == "True"
    # catches a server left running after the demo (its own session is killed)
    assert not alive(pid)


def test_a_server_that_exits_is_one_line_naming_its_log(tmp_path: Path) -> None:
    failing = tool(tmp_path, "#!/bin/sh\nexit 3\n")
    with (pytest.raises(studio_server.StudioUnavailable, match=r"exited with 3 before answering; its log: .*\.log"),
          studio_server.studio_server(tmp_path / "data", failing)):
        pass


def test_no_label_studio_is_a_step_not_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(studio_server, "executable", lambda: None)
    background = BackgroundStudio(tmp_path)
    with pytest.raises(NotYet, match="Label Studio is not installed"):
        background.server()
    background.close()


def test_the_template_is_migrated_once_and_moved_into_place(tmp_path: Path) -> None:
    stand_in = tool(tmp_path, STAND_IN)
    template, _ = studio_server.migrated_database(stand_in)
    assert template == tmp_path / "env" / "d2ops-migrated-db" / "label_studio.sqlite3"
    assert template.read_text() == "migrated"
    again, seconds = studio_server.migrated_database(stand_in)
    # catches a migration run on every start (not idempotent) and a scratch directory left behind
    assert (again, seconds) == (template, 0.0)
    assert (tmp_path / "env" / "migrations").read_text() == "x"
    assert sorted(p.name for p in template.parent.iterdir()) == ["label_studio.sqlite3"]


def test_a_failed_migration_leaves_no_template_and_the_cli_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    failing = tool(tmp_path, "#!/bin/sh\nexit 2\n")
    # catches a half-made template taken as migrated (every later start would copy a broken database)
    assert studio_server.migrated_database(failing)[0] is None
    assert not studio_server.template_path(failing).exists()
    monkeypatch.setenv(studio_server.ENV_OVERRIDE, str(failing))
    assert studio_server.main(["migrate"]) == 1
    assert capsys.readouterr().err.count("\n") == 1  # one line, no traceback


def test_the_migrate_command_prints_its_seconds_and_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(studio_server.ENV_OVERRIDE, str(tool(tmp_path, STAND_IN)))  # catches the override ignored
    assert studio_server.main(["migrate"]) == 0
    assert "migrated in" in capsys.readouterr().out
    assert studio_server.main(["migrate"]) == 0
    assert "already migrated" in capsys.readouterr().out
    assert (tmp_path / "env" / "migrations").read_text() == "x"
