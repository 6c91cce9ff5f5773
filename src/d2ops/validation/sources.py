"""Where a dataset version is read from: a local directory or an S3 prefix.

Both list every file once up front (S3: one paginated ListObjectsV2 walk, never one request per
image), hand large JSON files to the checks as a memory map, and probe image files. A probed
image is decoded (JPEGs in draft mode, so the whole entropy-coded stream is read at an eighth of
the cost): locally every image, in S3 the sampled ones, each with one GET (images larger than
FULL_DECODE_BYTES, or of more than FULL_DECODE_PIXELS after draft scaling, get only their size read).
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from PIL import Image, UnidentifiedImageError

from d2ops.validation.errors import DatasetUnreadable, SourceFileError

# S3 images up to this size are downloaded whole and decoded; of larger ones this much is read, which
# holds the header. Bounds a Lambda's memory: 8 probing threads hold at most 8 of these at once.
FULL_DECODE_BYTES = 16 * 1024 * 1024
# Images that would still decode to more pixels than this (after JPEG draft scaling) get their size
# checked but are not decoded: a 90-megapixel PNG needs 270 MB per probing thread.
FULL_DECODE_PIXELS = 25_000_000
_SWAPPING_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that rotate by 90 degrees
# Errors Pillow raises on corrupt data (truncated streams, bad headers, decompression bombs).
_IMAGE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclass(frozen=True)
class ImageProbe:
    size: tuple[int, int] | None = None  # (width, height) as a loader that applies EXIF orientation sees it
    stored_size: tuple[int, int] | None = None  # (width, height) in the file
    error: str | None = None
    decoded: bool = False


class Source(Protocol):
    uri: str

    def list_files(self) -> dict[str, int]:
        """Every file of the dataset version: relative posix path -> size in bytes."""
        ...

    def read_small(self, rel: str, limit: int) -> bytes: ...

    def open_large(self, rel: str) -> Any:
        """A context manager yielding the file's bytes as a buffer (a memory map when possible)."""
        ...

    def probe_image(self, rel: str) -> ImageProbe: ...


def _probe(fp: Any, *, decode: bool) -> ImageProbe:
    """Read an image's size (as seen after its EXIF orientation) and, with ``decode``, decode it all.

    Raises one of _IMAGE_ERRORS when the file is not an image or is corrupt.
    """
    with Image.open(fp) as im:
        stored = im.size
        try:
            orientation = im.getexif().get(0x0112)
        except _IMAGE_ERRORS:
            orientation = None
        seen = (stored[1], stored[0]) if orientation in _SWAPPING_ORIENTATIONS else stored
        if decode:
            # Draft mode decodes JPEGs at 1/8 scale: every byte is still parsed, so truncation shows.
            im.draft(im.mode, (max(1, stored[0] // 8), max(1, stored[1] // 8)))
            decode = im.size[0] * im.size[1] <= FULL_DECODE_PIXELS
            if decode:
                im.load()
    return ImageProbe(size=seen, stored_size=stored, decoded=decode)


@contextmanager
def _mapped(path: Path | str, rel: str) -> Iterator[Any]:
    """Yield the file's bytes as a read-only memory map (b"" for an empty file)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - opening errors become SourceFileError, the body's do not
    except OSError as exc:
        raise SourceFileError(f"cannot read {rel}: {exc.strerror or exc}") from exc
    with fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(fh.fileno()).st_size else None
        except (OSError, ValueError) as exc:
            raise SourceFileError(f"cannot map {rel}: {exc}") from exc
        try:
            yield mm if mm is not None else b""
        finally:
            if mm is not None:
                with contextlib.suppress(BufferError):  # a caller still holds a view; it goes when that is collected
                    mm.close()


class LocalSource:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetUnreadable(f"{self.root} is not a directory")
        self.uri = str(self.root)

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        # followlinks: offline datasets often link images/ to where the pictures really live. os.walk
        # does not notice a link back to an ancestor, which would list the tree again and again
        # (exponentially with two such links), so each directory carries the identities above it.
        ancestors: dict[str, frozenset[tuple[int, int]]] = {}
        for dirpath, dirnames, names in os.walk(self.root, followlinks=True):
            try:
                st = os.stat(dirpath)
            except OSError:
                dirnames[:] = []
                continue
            identity = (st.st_dev, st.st_ino)
            above = ancestors.get(os.path.dirname(dirpath), frozenset())
            if identity in above:  # a link loop: everything below is listed already
                dirnames[:] = []
                continue
            ancestors[dirpath] = above | {identity}
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in names:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                try:
                    files[rel] = os.stat(os.path.join(dirpath, name)).st_size
                except OSError:
                    files[rel] = -1  # a dangling link: listed, unreadable
        return files

    def read_small(self, rel: str, limit: int) -> bytes:
        try:
            with open(self.root / rel, "rb") as fh:
                return fh.read(limit + 1)
        except OSError as exc:
            raise SourceFileError(f"cannot read {rel}: {exc.strerror or exc}") from exc

    def open_large(self, rel: str) -> Any:
        return _mapped(self.root / rel, rel)

    def probe_image(self, rel: str) -> ImageProbe:
        try:
            return _probe(self.root / rel, decode=True)
        except _IMAGE_ERRORS as exc:
            return ImageProbe(error=f"cannot decode: {exc}")


def _client_error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


# S3 error codes that mean "this location cannot be read at all", not "this one file is bad".
_LOCATION_ERRORS = frozenset({"AccessDenied", "403", "NoSuchBucket", "AllAccessDisabled", "InvalidAccessKeyId",
                              "ExpiredToken", "SignatureDoesNotMatch", "KMS.AccessDeniedException"})


def s3_read_error(exc: Exception, what: str) -> Exception:
    """DatasetUnreadable for permission/bucket problems (Step Functions routes on it), else SourceFileError."""
    code = _client_error_code(exc)
    if code in _LOCATION_ERRORS:
        return DatasetUnreadable(f"cannot read {what}: {code}")
    return SourceFileError(f"cannot read {what}: {code or exc}")


class S3Source:
    def __init__(self, s3_client: Any, bucket: str, prefix: str) -> None:
        self.s3, self.bucket = s3_client, bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.sizes: dict[str, int] = {}  # from the listing, so big files need no extra HEAD

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    files[obj["Key"][len(self.prefix):]] = int(obj["Size"])
        except Exception as exc:  # botocore's ClientError/EndpointConnectionError: no import of botocore here
            code = _client_error_code(exc) or type(exc).__name__
            raise DatasetUnreadable(f"cannot list {self.uri}: {code}: {exc}") from exc
        self.sizes = files
        return files

    def read_small(self, rel: str, limit: int) -> bytes:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + rel, Range=f"bytes=0-{limit}")["Body"]
            return bytes(body.read())
        except Exception as exc:
            raise s3_read_error(exc, self.uri + rel) from exc

    @contextmanager
    def open_large(self, rel: str) -> Iterator[Any]:
        # Downloaded to the scratch disk (Lambda: /tmp, size set by EphemeralStorage) and mapped, so the
        # annotations never sit in memory twice.
        with tempfile.TemporaryDirectory(prefix="d2ops-validate-") as tmp:
            size = self.sizes.get(rel, 0)
            free = shutil.disk_usage(tmp).free
            if size > free:
                raise SourceFileError(f"{rel} is {size / 1e6:.0f} MB but the scratch disk has {free / 1e6:.0f} MB free "
                                      "(raise the function's EphemeralStorage)")
            target = os.path.join(tmp, "annotations.json")
            try:
                self.s3.download_file(self.bucket, self.prefix + rel, target)
            except Exception as exc:
                raise s3_read_error(exc, self.uri + rel) from exc
            with _mapped(target, rel) as buffer:
                yield buffer

    def probe_image(self, rel: str) -> ImageProbe:
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + rel,
                                          Range=f"bytes=0-{FULL_DECODE_BYTES - 1}")
            data = response["Body"].read()
        except Exception as exc:
            return ImageProbe(error=f"cannot read: {_client_error_code(exc) or exc}")
        try:
            return _probe(io.BytesIO(data), decode=_total_size(response, len(data)) <= len(data))
        except _IMAGE_ERRORS as exc:
            return ImageProbe(error=f"cannot decode: {exc}")


def _total_size(response: dict[str, Any], fallback: int) -> int:
    content_range = str(response.get("ContentRange", ""))  # "bytes 0-65535/123456"
    if "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    return int(response.get("ContentLength", fallback))
