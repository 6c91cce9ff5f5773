"""Where a dataset version is read from: a local directory or an S3 prefix.

Both list every file once up front (S3: one paginated ListObjectsV2 walk, never one request per
image), hand large JSON files to the checks as a memory map, and probe image files. A probed
image is judged by d2ops_core.images (the one rule: JPEG/MPO or PNG by content, at most MAX_PIXELS,
EXIF orientation applied) from its header first, so nothing over the limit is ever decoded; then
it is decoded (JPEGs in draft mode, so the whole entropy-coded stream is read at an eighth of the
cost; PNG chunk checksums verified too): locally every image, in S3 the sampled ones, each with
one GET (files larger than FULL_DECODE_BYTES get only their header read). Decoding draws on a
process-wide memory budget (DECODE_BUDGET), so eight probing threads never hold more than
DECODE_BUDGET_BYTES of pixels whatever the images are.

A local dataset is a directory: links inside it are followed, links that lead out of it are
not (LINK_OUTSIDE_DATASET): a dataset must not make the validator read other files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from d2ops_core import images as rule
from d2ops_core.validation.coco import release_pages
from d2ops_core.validation.errors import DatasetUnreadable, ObjectChanged, SourceFileError
from d2ops_core.validation.inventory import SNAPSHOT_TAGGING, InventoryEntry, clean_etag

# S3 images up to this size are downloaded whole and decoded; of larger ones this much is read, which
# holds the header. Bounds a Lambda's memory: 8 probing threads hold at most 8 of these at once.
FULL_DECODE_BYTES = 16 * 1024 * 1024
# Pixels being decoded at once, over all probing threads: one image at the default limit (36 MP at
# 4 bytes a pixel, 144 MB) fits twice. An image larger than the budget waits until it can run alone
# (reserve() clamps to the budget), so the budget admits one image at any pixel limit the operator
# sets (MaxImagePixels, at most images.MAX_PIXELS_LIMIT): the decoding peak is
# max(this budget, one image at the limit) -- 320 MB up to 80 MP, 600 MB at 150 MP.
DECODE_BUDGET_BYTES = 320 * 1024 * 1024


class DecodeBudget:
    """A counting limit on the bytes of decoded pixels alive at once (threads wait for room)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        nbytes = min(max(0, nbytes), self.limit)
        with self._cond:
            self._cond.wait_for(lambda: self.used + nbytes <= self.limit)
            self.used += nbytes
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._cond:
                self.used -= nbytes
                self._cond.notify_all()


DECODE_BUDGET = DecodeBudget(DECODE_BUDGET_BYTES)


def _reuse_pixel_blocks() -> None:
    """Let Pillow keep freed pixel blocks for reuse (as many as the budget holds) instead of freeing them.

    Pillow allocates bitmaps in 16 MB blocks. Freed, they land in the freeing thread's malloc arena,
    which keeps them; with eight probing threads each arena ended up holding a full image, and
    eight 36-megapixel PNGs took 859 MB although the budget let only two decode at once. Reused
    blocks are shared by all threads: the same PNGs peak at about 316 MB.
    """
    from PIL import Image

    wanted = DECODE_BUDGET_BYTES // max(1, Image.core.get_block_size())
    if Image.core.get_blocks_max() < wanted:
        Image.core.set_blocks_max(wanted)


_reuse_pixel_blocks()


@dataclass(frozen=True)
class ImageProbe:
    size: tuple[int, int] | None = None  # (width, height) as a loader that applies EXIF orientation sees it
    stored_size: tuple[int, int] | None = None  # (width, height) in the file
    error: str | None = None
    reason: str | None = None  # d2ops_core.images.ImageRejected.reason when the rule refused the file
    format: str | None = None  # Pillow's format name (JPEG, MPO, PNG)
    decoded: bool = False
    orientation_known: bool = field(default=True, compare=False)  # False: a PNG whose EXIF was not reached
    sha256: str | None = field(default=None, compare=False)  # hex SHA-256 of the file's bytes, when all were read


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

    def links_outside(self) -> dict[str, str]:
        """Links the listing refused because they lead out of the dataset: relative path -> link target."""
        ...

    def entry(self, rel: str) -> InventoryEntry:
        """The inventory entry of ``rel`` as listed (and hashed, once its bytes were read whole)."""
        ...

    def copy_to_snapshot(self, rel: str) -> bool:
        """Copy the listed version of ``rel`` into the run's snapshot; False when the source has no snapshot.

        Raises ObjectChanged when the listed version is gone or its ETag no longer matches.
        """
        ...


def _probe(fp: Any, where: str, *, decode: bool, budget: DecodeBudget | None = None) -> ImageProbe:
    """Judge an image by the rule: header first (format, size), then, with ``decode``, every byte of it.

    Never raises for the file's content: a refusal is an ImageProbe with ``error`` and ``reason``.
    """
    budget = budget or DECODE_BUDGET
    try:
        image = rule.open_image(fp, where)  # header only: format, size limit, shape
    except rule.ImageRejected as exc:
        return ImageProbe(error=exc.message, reason=exc.reason)
    try:
        stored, fmt = image.size, image.format
        if decode and fmt == "PNG":
            rule.verify_png(fp, where)  # chunk checksums: Pillow decodes some damage without a word
        if decode:
            # Draft mode decodes JPEGs at 1/8 scale: every byte is still parsed, so truncation shows.
            image.draft(image.mode, (max(1, stored[0] // 8), max(1, stored[1] // 8)))
        need = image.size[0] * image.size[1] * rule.DECODED_BYTES_PER_PIXEL if decode else 0
        with budget.reserve(need):
            try:
                if decode:
                    image.load()
                # A PNG may keep its EXIF after the pixels; Pillow decodes the image to reach it, so
                # an undecoded PNG has an orientation only when its EXIF comes first.
                known = decode or fmt != "PNG" or "exif" in image.info
                orientation = rule.orientation(image) if known else 1
            finally:
                image.close()  # frees the pixels before the budget is given back
    except rule.ImageRejected as exc:
        return ImageProbe(error=exc.message, reason=exc.reason, format=image.format)
    except Exception as exc:  # Pillow raises many types for damaged data; any of them means "unreadable"
        return ImageProbe(error=f"{where}: {exc or type(exc).__name__}", reason="corrupt",
                          format=image.format)
    finally:
        image.close()
    return ImageProbe(size=rule.oriented_size(stored, orientation), stored_size=stored, format=fmt, decoded=decode,
                      orientation_known=known)


def _sha256_mapped(buffer: Any, window: int = 4 << 20) -> str:
    """SHA-256 of a mapped file a window at a time, dropping each window's pages once hashed: hashing
    the map in one call left the whole file resident (452 MB of RSS for train2017's annotations)."""
    digest = hashlib.sha256()
    for start in range(0, len(buffer), window):
        digest.update(buffer[start:start + window])
        release_pages(buffer, start, start + window)
    return digest.hexdigest()


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


def _not_regular(path: str) -> str | None:
    """Why ``path`` is not a regular file one can read to its end, or None.

    Opening a FIFO blocks until someone writes to it, and a character device (a copy of /dev/zero)
    never ends: a dataset holding one under a name the manifest reads would hang the validator.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # open() says why, in the caller's own words
    if stat.S_ISREG(mode):
        return None
    kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")
    return f"it is {kind}, not a regular file"


class LocalSource:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetUnreadable(f"{self.root} is not a directory")
        self.uri = str(self.root)
        self._real_root = os.path.realpath(self.root)
        self._outside: dict[str, str] = {}
        self._sizes: dict[str, int] = {}
        self._hashes: dict[str, str] = {}  # files whose every byte was read: relative path -> hex SHA-256

    def _within(self, real: str) -> bool:
        return real == self._real_root or real.startswith(self._real_root.rstrip(os.sep) + os.sep)

    def _inside(self, rel: str) -> str | None:
        """The real path of ``rel`` when it stays inside the dataset directory, else None."""
        real = os.path.realpath(self.root / rel)
        return real if self._within(real) else None

    def _refuse_outside(self, dirpath: str, name: str, rel: str) -> bool:
        """True (and the link recorded) when ``dirpath/name`` is a link that resolves outside the dataset."""
        full = os.path.join(dirpath, name)
        if not os.path.islink(full) or self._within(os.path.realpath(full)):
            return False
        try:
            self._outside[rel] = os.readlink(full)
        except OSError:
            self._outside[rel] = "?"
        return True

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        self._outside = {}
        # followlinks: a dataset may link inside itself (images/val -> images/train). A link leading out of
        # the directory is refused (LINK_OUTSIDE_DATASET): a dataset must not make us read other files.
        # os.walk does not notice a link back to an ancestor, which would list the tree again and again
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

            def rel_of(name: str, rel_dir: str = rel_dir) -> str:
                return name if rel_dir == "." else f"{rel_dir}/{name}"

            dirnames[:] = [d for d in dirnames if not self._refuse_outside(dirpath, d, rel_of(d))]
            for name in names:
                rel = rel_of(name)
                if self._refuse_outside(dirpath, name, rel):
                    continue
                try:
                    files[rel] = os.stat(os.path.join(dirpath, name)).st_size
                except OSError:
                    files[rel] = -1  # a dangling link: listed, unreadable
        self._sizes = files
        return files

    def entry(self, rel: str) -> InventoryEntry:
        return InventoryEntry(key=rel, version_id=None, etag=None, size=max(0, self._sizes.get(rel, 0)),
                              sha256=self._hashes.get(rel))

    def copy_to_snapshot(self, rel: str) -> bool:
        return False  # a local directory is validated where it is; the offline pipeline reads S3

    def links_outside(self) -> dict[str, str]:
        return dict(self._outside)

    def _path(self, rel: str) -> str:
        path = self._inside(rel)
        if path is None:
            raise SourceFileError(f"cannot read {rel}: it leads outside the dataset directory")
        problem = _not_regular(path)
        if problem:
            raise SourceFileError(f"cannot read {rel}: {problem}")
        return path

    def read_small(self, rel: str, limit: int) -> bytes:
        try:
            with open(self._path(rel), "rb") as fh:
                data = fh.read(limit + 1)
        except OSError as exc:
            raise SourceFileError(f"cannot read {rel}: {exc.strerror or exc}") from exc
        if len(data) <= limit:
            self._hashes[rel] = hashlib.sha256(data).hexdigest()
        return data

    @contextmanager
    def open_large(self, rel: str) -> Iterator[Any]:
        with _mapped(self._path(rel), rel) as buffer:
            self._hashes[rel] = _sha256_mapped(buffer)
            yield buffer

    def probe_image(self, rel: str) -> ImageProbe:
        path = self._inside(rel)
        if path is None:
            return ImageProbe(error=f"{rel} leads outside the dataset directory", reason="outside")
        problem = _not_regular(path)
        if problem:
            return ImageProbe(error=f"cannot read {rel}: {problem}", reason="unreadable")
        try:
            with open(path, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
                fh.seek(0)
                probe = _probe(fh, rel, decode=True)
        except OSError as exc:
            return ImageProbe(error=f"cannot read {rel}: {exc.strerror or exc}", reason="unreadable")
        self._hashes[rel] = digest
        return replace(probe, sha256=digest)


def _client_error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


# S3 error codes that mean "the version validation listed is not what is there now": an If-Match that
# failed (an unversioned bucket's object was overwritten) or a version deleted for good.
_CHANGED_ERRORS = frozenset({"PreconditionFailed", "412", "NoSuchVersion", "NoSuchKey", "404"})
# S3 error codes that mean "this location cannot be read at all", not "this one file is bad".
_LOCATION_ERRORS = frozenset({"AccessDenied", "403", "NoSuchBucket", "AllAccessDisabled", "InvalidAccessKeyId",
                              "ExpiredToken", "SignatureDoesNotMatch", "KMS.AccessDeniedException"})


def s3_read_error(exc: Exception, what: str, *, pinned: bool = False) -> Exception:
    """DatasetUnreadable for permission/bucket problems (Step Functions routes on it), ObjectChanged for a
    pinned read whose version is gone or changed, else SourceFileError."""
    code = _client_error_code(exc)
    if code in _LOCATION_ERRORS:
        return DatasetUnreadable(f"cannot read {what}: {code}")
    if pinned and code in _CHANGED_ERRORS:
        return ObjectChanged(f"{what} changed or was deleted after validation listed it ({code})")
    return SourceFileError(f"cannot read {what}: {code or exc}")


def _sha256_stream(body: Any, sink: Any = None, chunk: int = 1024 * 1024) -> str:
    """Hex SHA-256 of a streaming body, read in chunks (each also written to ``sink``)."""
    digest = hashlib.sha256()
    while True:
        block = body.read(chunk)
        if not block:
            return digest.hexdigest()
        digest.update(block)
        if sink is not None:
            sink.write(block)


class S3Source:
    """A dataset version under an S3 prefix, pinned: listed once (ListObjectVersions), every later read
    asks for the listed VersionId with If-Match on its ETag, so what is checked is what was listed.

    ``snapshot``: (bucket, key prefix) the run's copy goes to (d2ops_core.s3_layout.snapshot_prefix); None: no copy.
    """

    def __init__(self, s3_client: Any, bucket: str, prefix: str,
                 snapshot: tuple[str, str] | None = None) -> None:
        self.s3, self.bucket = s3_client, bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.snapshot = snapshot
        self.sizes: dict[str, int] = {}  # from the listing, so big files need no extra HEAD
        self.versions: dict[str, tuple[str | None, str | None]] = {}  # rel -> (VersionId, ETag) as listed
        self.hashes: dict[str, str] = {}  # files whose every byte was read: rel -> hex SHA-256

    def links_outside(self) -> dict[str, str]:
        return {}  # S3 has no links

    def list_files(self) -> dict[str, int]:
        """The latest version of every key under the prefix (a key whose latest version is a delete
        marker is absent), with its VersionId and ETag: one paginated ListObjectVersions walk."""
        files: dict[str, int] = {}
        versions: dict[str, tuple[str | None, str | None]] = {}
        try:
            paginator = self.s3.get_paginator("list_object_versions")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Versions", []):
                    if not obj.get("IsLatest"):
                        continue
                    rel = obj["Key"][len(self.prefix):]
                    files[rel] = int(obj["Size"])
                    version = obj.get("VersionId")
                    versions[rel] = (None if version in (None, "null") else str(version), clean_etag(obj.get("ETag")))
        except Exception as exc:  # botocore's ClientError/EndpointConnectionError: no import of botocore here
            code = _client_error_code(exc) or type(exc).__name__
            raise DatasetUnreadable(f"cannot list {self.uri}: {code}: {exc}") from exc
        self.sizes, self.versions = files, versions
        return files

    def pin(self, entries: list[Any]) -> None:
        """Take versions from an earlier listing (ImageItems, InventoryEntries: key, version_id, etag, size)."""
        for e in entries:
            self.sizes[e.key] = e.size
            self.versions[e.key] = (e.version_id, e.etag)

    def entry(self, rel: str) -> InventoryEntry:
        version_id, etag = self.versions.get(rel, (None, None))
        return InventoryEntry(key=rel, version_id=version_id, etag=etag, size=self.sizes.get(rel, 0),
                              sha256=self.hashes.get(rel))

    def _pinned(self, rel: str) -> dict[str, str]:
        """GetObject arguments that read exactly the listed version (VersionId; If-Match on the ETag)."""
        version_id, etag = self.versions.get(rel, (None, None))
        args: dict[str, str] = {}
        if version_id:
            args["VersionId"] = version_id
        if etag:
            args["IfMatch"] = f'"{etag}"'
        return args

    def copy_to_snapshot(self, rel: str) -> bool:
        """Server-side copy of the listed version into the snapshot, tagged for the lifecycle rule.

        No byte passes through the caller. A version gone or an ETag changed raises ObjectChanged.
        """
        if self.snapshot is None:
            return False
        bucket, prefix = self.snapshot
        version_id, etag = self.versions.get(rel, (None, None))
        copy_source = {"Bucket": self.bucket, "Key": self.prefix + rel}
        if version_id:
            copy_source["VersionId"] = version_id
        extra = {"CopySourceIfMatch": f'"{etag}"'} if etag else {}
        try:
            self.s3.copy_object(Bucket=bucket, Key=prefix + rel, CopySource=copy_source, Tagging=SNAPSHOT_TAGGING,
                                TaggingDirective="REPLACE", **extra)
        except Exception as exc:
            code = _client_error_code(exc)
            if code in _LOCATION_ERRORS:  # the data bucket's read or the snapshot's write refused
                raise DatasetUnreadable(f"cannot copy {self.uri}{rel} to s3://{bucket}/{prefix}{rel}: {code}") from exc
            raise s3_read_error(exc, rel, pinned=True) from exc
        return True

    def read_small(self, rel: str, limit: int) -> bytes:
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + rel, Range=f"bytes=0-{limit}",
                                      **self._pinned(rel))["Body"]
            data = bytes(body.read())
        except Exception as exc:
            raise s3_read_error(exc, self.uri + rel, pinned=True) from exc
        if len(data) <= limit:
            self.hashes[rel] = hashlib.sha256(data).hexdigest()
        return data

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
            # One pinned GET streamed to disk and hashed on the way (download_file's parallel ranges
            # take no If-Match, and the inventory needs the file's SHA-256 anyway).
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + rel, **self._pinned(rel))["Body"]
                with open(target, "wb") as sink:
                    self.hashes[rel] = _sha256_stream(body, sink)
            except OSError as exc:
                raise SourceFileError(f"cannot write {rel} to the scratch disk: {exc.strerror or exc}") from exc
            except Exception as exc:
                raise s3_read_error(exc, self.uri + rel, pinned=True) from exc
            with _mapped(target, rel) as buffer:
                yield buffer

    def probe_image(self, rel: str) -> ImageProbe:
        """One pinned GET of the whole object: its first FULL_DECODE_BYTES are kept for the rule (decoded
        when that is the whole file), every byte is hashed. A changed or deleted version: reason "changed"."""
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + rel, **self._pinned(rel))
            body = response["Body"]
            data = _read_up_to(body, FULL_DECODE_BYTES)
            digest = hashlib.sha256(data)
            rest = _sha256_stream(body, _Updating(digest)) if len(data) == FULL_DECODE_BYTES else None
        except Exception as exc:
            code = _client_error_code(exc)
            if code in _LOCATION_ERRORS:
                raise DatasetUnreadable(f"cannot read {self.uri}{rel}: {code}") from exc
            if code in _CHANGED_ERRORS:
                return ImageProbe(error=f"{rel} changed or was deleted after validation listed it ({code})",
                                  reason="changed")
            return ImageProbe(error=f"cannot read {rel}: {code or exc}", reason="unreadable")
        whole = rest is None or _total_size(response, len(data)) <= len(data)
        sha = digest.hexdigest()
        self.hashes[rel] = sha
        return replace(_probe(io.BytesIO(data), rel, decode=whole), sha256=sha)


def _read_up_to(body: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes of a streaming body (a read may return fewer than asked before the end)."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        block = body.read(limit - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


class _Updating:
    """A write-only sink that feeds a hash (lets _sha256_stream continue a digest already started)."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest

    def write(self, block: bytes) -> None:
        self.digest.update(block)


def _total_size(response: dict[str, Any], fallback: int) -> int:
    content_range = str(response.get("ContentRange", ""))  # "bytes 0-65535/123456"
    if "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    return int(response.get("ContentLength", fallback))
