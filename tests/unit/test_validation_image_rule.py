"""d2ops_core.images: the one rule for which images every part accepts (formats, size, orientation, integrity)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from PIL import Image

from d2ops_core import images as rule


def _encode(fmt: str, size: tuple[int, int] = (64, 48), **kwargs: object) -> bytes:
    image = Image.new("RGB", size, (10, 200, 30))
    image.paste((255, 0, 0), (0, 0, 16, 16))  # a marker block shows where the top-left corner went
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _mpo() -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", (64, 48), (10, 200, 30))
    image.save(buffer, "MPO", save_all=True, append_images=[image.resize((32, 24))])
    return buffer.getvalue()


def _with_orientation(fmt: str, value: int) -> bytes:
    exif = Image.Exif()
    exif[rule.EXIF_ORIENTATION] = value
    return _encode(fmt, exif=exif)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_jpeg_and_png_decode_to_rgb(fmt: str) -> None:
    image = rule.load_rgb(_encode(fmt))
    assert image.mode == "RGB" and image.size == (64, 48)


def test_camera_mpo_jpegs_are_accepted_as_their_first_picture() -> None:
    with rule.open_image(_mpo()) as image:
        assert image.format == "MPO"
    assert rule.load_rgb(_mpo()).size == (64, 48)


@pytest.mark.parametrize(("fmt", "named"), [("WEBP", "WebP"), ("GIF", "GIF"), ("TIFF", "TIFF"), ("BMP", "BMP")])
def test_other_formats_are_refused_by_content(fmt: str, named: str) -> None:
    with pytest.raises(rule.ImageRejected) as caught:
        rule.load_rgb(_encode(fmt), "images/a.png")
    assert caught.value.reason == "unsupported_format" and named in str(caught.value)
    assert "images/a.png" in str(caught.value)


def test_only_the_jpeg_and_png_openers_ever_see_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # EPS would be handed to Ghostscript: its opener must never run, whatever the bytes say.
    from PIL import EpsImagePlugin

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("the EPS opener ran")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", boom)
    with pytest.raises(rule.ImageRejected) as caught:
        rule.load_rgb(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n")
    assert caught.value.reason == "unsupported_format" and "PostScript" in str(caught.value)


def test_the_size_limit_applies_before_any_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _encode("PNG", size=(200, 100))
    monkeypatch.setattr(rule, "MAX_PIXELS", 200 * 100 - 1)
    decoded: list[object] = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self))
    with pytest.raises(rule.ImageRejected) as caught:
        rule.open_image(data)
    assert caught.value.reason == "too_large" and "200x100" in str(caught.value) and not decoded


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize(("value", "size", "corner"), [(1, (64, 48), (4, 4)), (6, (48, 64), (43, 4)),
                                                       (8, (48, 64), (4, 59)), (3, (64, 48), (59, 43))])
def test_exif_orientation_is_applied(fmt: str, value: int, size: tuple[int, int], corner: tuple[int, int]) -> None:
    image = rule.load_rgb(_with_orientation(fmt, value))
    assert image.size == size
    red, green, _ = image.getpixel(corner)
    assert red > 150 and green < 100, "the top-left marker did not move where the orientation puts it"


def test_unreadable_or_unknown_orientation_counts_as_none() -> None:
    assert rule.load_rgb(_with_orientation("JPEG", 9)).size == (64, 48)
    assert rule.oriented_size((64, 48), 6) == (48, 64) and rule.oriented_size((64, 48), 1) == (64, 48)


def _damaged_png_tail() -> bytes:
    png = bytearray(_encode("PNG"))
    start = png.find(b"IDAT")
    length = struct.unpack(">I", png[start - 4:start])[0]
    png[start + 4 + length - 6] ^= 0xFF  # inside the zlib trailer: Pillow decodes it without a word
    return bytes(png)


def test_a_png_damaged_near_its_end_fails_verification() -> None:
    data = _damaged_png_tail()
    assert rule.load_rgb(data).size == (64, 48)  # why the checksum check exists
    with pytest.raises(rule.ImageRejected) as caught:
        rule.load_rgb(data, verify=True)
    assert caught.value.reason == "corrupt" and "checksum" in str(caught.value)


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "empty"),
    (_encode("JPEG")[:300], "corrupt"),
    (_encode("JPEG")[:-200], "corrupt"),
    (_encode("PNG")[:-30], "corrupt"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "corrupt"),
    (b"hello, world", "unsupported_format"),
], ids=["empty", "jpeg header cut", "jpeg data cut", "png data cut", "png garbage", "text"])
def test_broken_files_are_rejected_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(rule.ImageRejected) as caught:
        rule.load_rgb(data, verify=True)
    assert caught.value.reason == reason, caught.value


def test_paths_and_file_objects_work_like_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(_with_orientation("JPEG", 6))
    assert rule.load_rgb(path).size == rule.load_rgb(str(path)).size == (48, 64)
    stream = io.BytesIO(_damaged_png_tail())
    with pytest.raises(rule.ImageRejected):
        rule.load_rgb(stream, verify=True)


@pytest.mark.parametrize(("name", "fmt", "problem"), [
    ("a.jpg", "JPEG", None), ("a.JPEG", "MPO", None), ("b/c.png", "PNG", None),
    ("a.png", "JPEG", ".jpg or .jpeg"), ("a.jpg", "PNG", ".png"), ("a", "PNG", "no extension"),
])
def test_extension_must_agree_with_the_content(name: str, fmt: str, problem: str | None) -> None:
    found = rule.extension_problem(name, fmt)
    assert found is None if problem is None else (found is not None and problem in found)


def test_sniffing_matches_pillow() -> None:
    assert rule.sniff_format(_encode("JPEG")) == "JPEG" and rule.sniff_format(_mpo()) == "JPEG"
    assert rule.sniff_format(_encode("PNG")) == "PNG" and rule.sniff_format(_encode("GIF")) is None
