"""Paths the user gets wrong end as one line on stderr and exit 1, never a traceback."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from d2ops.cli import describe_os_error, main


@pytest.mark.parametrize("argv", [
    ["status", "--work-dir", "{file}"],  # mkdir of the work dir: FileExistsError
    ["synth", "{file}/dataset"],  # below a file: NotADirectoryError on the deeper path
])
def test_a_file_where_a_directory_is_needed_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("{}")
    code = main([arg.format(file=blocker) for arg in argv])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == f"d2ops {argv[0]}: error: {blocker} is a file, but a directory is needed there"
    assert "Traceback" not in err


def test_other_os_errors_name_the_path_and_the_reason(tmp_path: Path) -> None:
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "locked" / "manifest.json"))
    assert describe_os_error(denied) == f"{tmp_path / 'locked' / 'manifest.json'}: Permission denied"
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/proc/out")
    assert describe_os_error(missing) == "/proc/out: No such file or directory"
    assert describe_os_error(OSError("disk on fire")) == "disk on fire"
