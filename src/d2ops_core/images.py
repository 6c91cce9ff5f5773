"""Which images d2ops accepts and how every part reads them: the one home for formats, size limits and EXIF orientation.

Validation, training, evaluation, serving and the smoke test all go through this module, so an
image the validator passes is one the trainer can read, and the endpoint sees the same pixels
(and therefore puts boxes in the same frame) that training and evaluation saw. Pure Pillow,
no other dependency: the serving image installs the d2ops package for this module alone.

The rule (docs/security.md, "Images"):

- **Formats**: JPEG -- including MPO, the multi-picture JPEG many cameras write (its first
  picture is the image) -- and PNG. The *content* decides, never the file name: Pillow is only
  ever asked to try the JPEG and PNG openers (``formats=``), so no other decoder (Ghostscript for
  EPS, the TIFF, WebP or GIF plugins) ever sees a file. A file name whose extension disagrees
  with the content is a validator warning (IMAGE_EXTENSION_MISMATCH), because every reader here
  sniffs the content and so reads it correctly; content that is neither JPEG nor PNG is an error.
- **Size**: at most max_pixels() (36 megapixels, e.g. 6000x6000, unless the operator sets the stack
  parameter MaxImagePixels, which reaches every part as env MAX_IMAGE_PIXELS), checked from the header
  before a single pixel is decoded, so a small file that expands to a huge bitmap costs nothing.
- **EXIF orientation is applied everywhere**: an image whose EXIF says "rotate 90 degrees" is
  read rotated, in its upright frame, by every part. That is how browsers, annotation tools and
  detectron2's ``read_image`` show it, so COCO boxes drawn on it are in that frame; the validator
  compares the annotations' width/height with the oriented size, and the endpoint returns boxes
  in the frame a person sees. Unreadable EXIF counts as "no orientation" (as in detectron2).
- **Integrity**: an image must decode completely; PNG chunk checksums are verified too, because
  Pillow decodes a PNG whose compressed data was damaged near its end without complaint.
"""

from __future__ import annotations

import io
import os
import posixpath
from collections.abc import Mapping
from typing import IO, Literal

from PIL import Image

# Pillow format names an accepted image has (Image.format). JPEG's opener returns MPO images.
ACCEPTED_FORMATS = frozenset({"JPEG", "MPO", "PNG"})
# What Image.open may try: nothing else is ever handed a file.
OPENERS = ("JPEG", "PNG")
# Extensions a file of each accepted format may have (lower-cased); the smoke test and the
# validator's warning use them, nothing decides a format by name.
EXTENSIONS: dict[str, str] = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}
# The Content-Type an image of each accepted format is sent with (its content, not its name, decides).
CONTENT_TYPES: dict[str, str] = {"JPEG": "image/jpeg", "MPO": "image/jpeg", "PNG": "image/png"}
# The decoded-size limit by default, applied from the header before decoding (serving's limit since
# issue 4). The operator may set another (stack parameter MaxImagePixels): every part reads it with
# max_pixels(), from the environment variable below, at call time.
MAX_PIXELS = 36_000_000
MAX_PIXELS_ENV = "MAX_IMAGE_PIXELS"
# The range the stack parameter allows (template.yaml). Above 150 MP a decoded RGB image takes 600 MB
# and Pillow's own decompression-bomb check (about 179 MP) would refuse it before this rule is asked.
MIN_PIXELS_LIMIT = 1_000_000
MAX_PIXELS_LIMIT = 150_000_000
# The detectors scale the shorter side up and cap the longer one: past this ratio the shorter
# side rounds to 0 pixels and the model fails (a 500 at the endpoint, a crash in training).
# Panoramas (about 4:1) stay well inside it.
MAX_ASPECT_RATIO = 20
# Bytes per pixel Pillow allocates for a decoded image in the widest mode (RGB is stored as 4 bytes).
DECODED_BYTES_PER_PIXEL = 4
EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transpose that makes the image upright (1 and unknown values: none).
_UPRIGHT: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_SIDES = frozenset({5, 6, 7, 8})
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"))

Reason = Literal["empty", "not_an_image", "unsupported_format", "too_large", "bad_shape", "corrupt"]
Source = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]


class PixelLimitError(ValueError):
    """MAX_IMAGE_PIXELS is set to something that is not a pixel count in the allowed range."""


def max_pixels(env: Mapping[str, str] | None = None) -> int:
    """The pixel limit in force: env MAX_IMAGE_PIXELS (the stack's MaxImagePixels) if set, else MAX_PIXELS.

    Read at every call (from ``env``, by default the process environment), so a Lambda, a job or a test
    sees the value its environment holds now. A bad value raises PixelLimitError naming the variable: a
    misconfigured limit must stop the part, never silently fall back to another limit than validation used.
    """
    raw = (os.environ if env is None else env).get(MAX_PIXELS_ENV, "").strip()
    if not raw:
        return MAX_PIXELS
    try:
        value = int(raw)
    except ValueError:
        raise PixelLimitError(f"{MAX_PIXELS_ENV}={raw!r} is not a whole number of pixels "
                              f"(the stack parameter MaxImagePixels, e.g. 36000000)") from None
    if not MIN_PIXELS_LIMIT <= value <= MAX_PIXELS_LIMIT:
        raise PixelLimitError(f"{MAX_PIXELS_ENV}={value} is outside {MIN_PIXELS_LIMIT:,}..{MAX_PIXELS_LIMIT:,} "
                              "pixels (the stack parameter MaxImagePixels)")
    return value


class ImageRejected(ValueError):
    """An image the rule refuses; ``reason`` says which part of the rule (serving maps it to an HTTP status)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


def sniff_format(head: bytes) -> str | None:
    """"JPEG" or "PNG" from a file's first 8 bytes (what Pillow's openers accept), else None."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def extension_format(name: str) -> str | None:
    """The format a file name's extension promises ("JPEG"/"PNG"), or None for any other extension."""
    return EXTENSIONS.get(posixpath.splitext(name)[1].lower())


def extension_problem(name: str, image_format: str) -> str | None:
    """Why ``name`` is a misleading name for an image of ``image_format`` (MPO counts as JPEG), or None."""
    promised = extension_format(name)
    actual = "JPEG" if image_format == "MPO" else image_format
    if promised == actual:
        return None
    wanted = " or ".join(ext for ext, fmt in EXTENSIONS.items() if fmt == actual)
    got = posixpath.splitext(name)[1] or "no extension"
    return f"is a {actual} image named with {got}; name it {wanted}"


def _fp(source: Source) -> str | os.PathLike[str] | IO[bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        return io.BytesIO(bytes(source))
    return source


def open_image(source: Source, where: str = "image") -> Image.Image:
    """Open an accepted image, reading only its header: format and size are checked, nothing is decoded.

    Raises ImageRejected; the caller closes the image (``with open_image(...) as im``).
    ``where`` names the image in messages ("request body", "images/a.jpg").
    """
    if isinstance(source, bytes | bytearray | memoryview) and len(source) == 0:
        raise ImageRejected("empty", f"{where} is empty")
    try:
        image = Image.open(_fp(source), formats=OPENERS)
    except Image.DecompressionBombError as exc:  # Pillow's own limit (about 179 MP) trips inside open
        raise ImageRejected("too_large", f"{where} is too large: {exc}") from exc
    except FileNotFoundError:
        raise
    except Exception as exc:  # Pillow raises many types for data it cannot identify
        head = _head(source)
        if head is not None and not head:
            raise ImageRejected("empty", f"{where} is empty") from exc
        if head is not None and sniff_format(head) is None:
            raise ImageRejected("unsupported_format",
                                f"{where} is not a JPEG or PNG image ({_describe(head)})") from exc
        raise ImageRejected("corrupt", f"{where} is a damaged image: its header cannot be read ({exc})") from exc
    try:
        check_header(image, where)
    except ImageRejected:
        image.close()
        raise
    return image


def check_header(image: Image.Image, where: str = "image") -> None:
    """Format and size of an opened (not yet decoded) image against the rule; raises ImageRejected."""
    if image.format not in ACCEPTED_FORMATS:
        raise ImageRejected("unsupported_format", f"{where} is a {image.format} image; only JPEG and PNG are accepted")
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageRejected("corrupt", f"{where} is a {width}x{height} image: it has no pixels")
    limit = max_pixels()
    if width * height > limit:
        raise ImageRejected("too_large", f"{where} is {width}x{height} ({width * height:,} pixels); the limit is "
                                         f"{limit:,} pixels ({MAX_PIXELS_ENV})")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageRejected("bad_shape", f"{where} is {width}x{height}; its longer side may be at most "
                                         f"{MAX_ASPECT_RATIO} times its shorter side")


def orientation(image: Image.Image) -> int:
    """The image's EXIF orientation (1-8); 1 when absent or unreadable.

    For a JPEG this reads the header only. A PNG may store its EXIF after the pixel data, so
    Pillow decodes a PNG to find it: call this after ``check_header`` (and, for a PNG, after
    ``load()``), never before the size limit is known to hold.
    """
    try:
        value = image.getexif().get(EXIF_ORIENTATION)
    except Exception:  # malformed EXIF is "no orientation", as detectron2's read_image treats it
        return 1
    return value if isinstance(value, int) and value in _UPRIGHT else 1


def oriented_size(size: tuple[int, int], orientation_value: int) -> tuple[int, int]:
    """(width, height) of an image of stored ``size`` once its orientation is applied."""
    return (size[1], size[0]) if orientation_value in _SWAPS_SIDES else size


def upright(image: Image.Image) -> Image.Image:
    """The image with its EXIF orientation applied (the same object when there is none)."""
    method = _UPRIGHT.get(orientation(image))
    return image.transpose(method) if method is not None else image


def verify_png(source: Source, where: str = "image") -> None:
    """Check a PNG's chunk checksums without decoding pixels; raises ImageRejected("corrupt").

    Needed because Pillow decodes a PNG whose compressed data is damaged near its end as if it
    were fine. Not a JPEG check: JPEG has no checksums (a full decode is its integrity check).
    A file object is read from its start and left where it was.
    """
    position = _tell(source)
    try:
        with Image.open(_fp(source), formats=("PNG",)) as image:
            image.verify()
    except Exception as exc:
        raise ImageRejected("corrupt", f"{where} is a damaged PNG: {exc}") from exc
    finally:
        if position is not None:
            source.seek(position)  # type: ignore[union-attr]


def load_rgb(source: Source, where: str = "image", *, verify: bool = False) -> Image.Image:
    """Decode an accepted image into upright RGB: the pixels training, evaluation and serving all use.

    Raises ImageRejected for anything the rule refuses or that does not decode completely.
    ``verify`` also checks PNG chunk checksums (the validator does; a request need not pay for it).
    """
    if verify and sniff_format(_head(source) or b"") == "PNG":
        verify_png(source, where)
    with open_image(source, where) as image:
        try:
            image.load()
            rgb = upright(image).convert("RGB")
        except Exception as exc:  # truncated data, a broken zlib stream, a decoder error
            raise ImageRejected("corrupt", f"{where} is a truncated or damaged {image.format} image "
                                           f"({image.size[0]}x{image.size[1]}): {exc}") from exc
    return rgb


def _tell(source: Source) -> int | None:
    """A file object's position, rewound to its start (None for bytes and paths)."""
    if isinstance(source, bytes | bytearray | memoryview | str | os.PathLike):
        return None
    position = source.tell()
    source.seek(0)
    return position


def _head(source: Source) -> bytes | None:
    """The first 16 bytes of ``source`` when they can be had without side effects, else None."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source[:16])
    if isinstance(source, str | os.PathLike):
        try:
            with open(source, "rb") as fh:
                return fh.read(16)
        except OSError:
            return None
    try:
        position = source.tell()
        source.seek(0)
        head = source.read(16)
        source.seek(position)
        return head
    except Exception:  # an unseekable stream: no peeking
        return None


def _describe(head: bytes) -> str:
    known = {b"RIFF": "WebP or another RIFF file", b"GIF8": "GIF", b"II*\x00": "TIFF", b"MM\x00*": "TIFF",
             b"BM": "BMP", b"%!PS": "PostScript", b"\xc5\xd0\xd3\xc6": "EPS", b"%PDF": "PDF"}
    for magic, name in known.items():
        if head.startswith(magic):
            return f"it looks like {name}"
    return f"it starts with {head[:8]!r}"
