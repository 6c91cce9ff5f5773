"""studio_server: how ``d2ops demo --loop`` starts and stops Label Studio, against a stand-in executable that
answers /health as the real one does (the real server: tests/e2e/test_demo_loop.py, tests/integration/
test_label_studio.py). About a second."""

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
    path = tmp_path / "label-studio"
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
    # catches a server left running after the demo (its own session is killed)
    assert not alive(pid)


def test_a_server_that_exits_is_one_line_naming_its_log(tmp_path: Path) -> None:
    failing = tool(tmp_path, "#!/bin/sh\nexit 3\n")
    with (pytest.raises(studio_server.StudioUnavailable, match=r"exited with 3 before answering; its log: .*\.log"),
          studio_server.studio_server(tmp_path / "data", failing)):
        pass


def test_no_label_studio_is_a_step_not_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(studio_server, "executable", lambda repo=None: None)
    background = BackgroundStudio(tmp_path)
    with pytest.raises(NotYet, match="Label Studio is not installed"):
        background.server()
    background.close()
