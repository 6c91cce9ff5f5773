"""``d2ops predict``: bad input is one clear line and exit 2, no endpoint is one line and exit 1; never a traceback.

The calls to a live endpoint (detections, drawing, unknown endpoint, model errors) are in
tests/integration/test_predict.py against the offline endpoint.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from d2ops import cli


def _png(path: Path, size: tuple[int, int] = (32, 24)) -> Path:
    Image.new("RGB", size, (200, 30, 30)).save(path, "PNG")
    return path


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize(("content", "name", "expected"), [
    (None, "missing.png", "missing.png: no such file"),
    (b"", "empty.png", "is empty"),
    (b"GIF89a" + b"\x00" * 40, "anim.png", "not a JPEG or PNG image (it looks like GIF)"),
    (b"just text, no picture", "notes.jpg", "not a JPEG or PNG image"),
])
def test_what_is_not_an_acceptable_image_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          content: bytes | None, name: str, expected: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    code, err = _exit(["predict", str(path), "--endpoint", "detector"], capsys)
    assert code == 2 and expected in err and str(path) in err and err.count("\n") == 1


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused_not_waited_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipe = tmp_path / "image.png"
    os.mkfifo(pipe)
    code, err = _exit(["predict", str(pipe), "--endpoint", "detector"], capsys)
    assert code == 2 and f"{pipe}: not a regular file" in err


def test_a_truncated_image_is_refused_before_anything_is_sent(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    whole = _png(tmp_path / "whole.png", (64, 64)).read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[: len(whole) // 2])
    code, err = _exit(["predict", str(cut), "--endpoint", "detector"], capsys)
    assert code == 2 and "cut.png" in err and ("damaged" in err or "truncated" in err)


def test_a_directory_and_bad_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = str(_png(tmp_path / "ok.png"))
    assert _exit(["predict", str(tmp_path), "--endpoint", "detector"], capsys)[1].endswith("is a directory, not an "
                                                                                           "image file\n")
    code, err = _exit(["predict", image, "--endpoint", "detector", "--score-threshold", "1.5"], capsys)
    assert code == 2 and "--score-threshold 1.5 is not in [0, 1]" in err
    code, err = _exit(["predict", image, "--endpoint", "detector", "--draw", str(tmp_path / "out.gif")], capsys)
    assert code == 2 and "name it .png or .jpg" in err
    code, err = _exit(["predict", image, "--endpoint", "detector", "--draw", str(tmp_path / "no" / "out.png")], capsys)
    assert code == 2 and "does not exist" in err
    code, err = _exit(["predict", image], capsys)  # neither --endpoint nor --offline
    assert code == 2 and "one of the arguments --endpoint --offline is required" in err


def test_stdin_is_read_and_checked_like_a_file(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"%PDF-1.7 not an image")))
    code, err = _exit(["predict", "-", "--endpoint", "detector"], capsys)
    assert code == 2 and "stdin is not a JPEG or PNG image (it looks like PDF)" in err


def test_no_runtime_on_the_work_dir_means_no_offline_endpoint(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    image = str(_png(tmp_path / "ok.png"))
    code, err = _exit(["predict", image, "--offline", "--work-dir", str(tmp_path / "work")], capsys)
    assert code == 1 and "no offline runtime is running on" in err


def test_the_image_rule_decides_the_content_type_not_the_name(tmp_path: Path) -> None:
    from d2ops.commands.predict import check_image

    png_named_jpg = _png(tmp_path / "photo.jpg")
    content_type, image = check_image(png_named_jpg.read_bytes(), str(png_named_jpg))
    assert content_type == "image/png" and image.size == (32, 24)
    jpeg = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(jpeg, "JPEG")
    assert check_image(jpeg.read_bytes(), str(jpeg))[0] == "image/jpeg"


def test_drawing_puts_each_detection_on_a_copy_of_the_image() -> None:
    from d2ops.commands.predict import draw

    image = Image.new("RGB", (100, 80), (0, 0, 0))
    out = draw(image, [{"box": [10.0, 20.0, 60.0, 70.0], "score": 0.93, "class_id": 1, "class_name": "disc"}])
    assert out.size == image.size and image.getpixel((10, 45)) == (0, 0, 0)
    assert out.getpixel((10, 45)) != (0, 0, 0)  # the box's left edge
    assert out.getpixel((35, 50)) == (0, 0, 0)  # inside the box stays the image


def test_a_deployed_endpoint_needs_a_region_and_a_known_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    image = str(_png(tmp_path / "ok.png"))
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    code, err = _exit(["predict", image, "--endpoint", "detector"], capsys)
    assert code == 2 and "no AWS region: pass --region or set AWS_REGION" in err
    code, err = _exit(["predict", image, "--endpoint", "detector", "--profile", "nobody"], capsys)
    assert code == 2 and "nobody" in err and err.count("\n") == 1


def test_without_the_sagemaker_sdk_the_command_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    image = str(_png(tmp_path / "ok.png"))
    monkeypatch.setitem(sys.modules, "sagemaker", None)  # what `import sagemaker` meets where it is not installed
    code, err = _exit(["predict", image, "--endpoint", "detector", "--region", "eu-west-1"], capsys)
    assert code == 2 and "the SageMaker Python SDK is not installed" in err and "sagemaker>=2.250,<3" in err
