"""The inventory of a validated dataset version, the Distributed Map's image items and each batch's result.

One model per document, imported by every writer and reader:

- :class:`InventoryEntry`: one line of ``runs/<run id>/inventory.jsonl``: an object the run read
  (manifest, annotation files, every referenced image), pinned by S3 ``VersionId`` and ETag, with
  the SHA-256 of its bytes. The file is sorted by key; its digest (``sha256:<hex of the file>``) is
  what the model artifact and the registry record.
- :class:`ImageItem`: one line of ``runs/<run id>/validation/image-items.jsonl``, the Map's
  ItemReader input: one image file and the annotation entries it answers for.
- :class:`ImageBatchResult`: what one ``check_images`` Lambda returns for a batch of items; the
  Map's ResultWriter stores it and the summarize step merges it into the report.

JSONL is written and read one line at a time, so neither side holds a million-image document.
Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.validation.report import Issue

DIGEST_PREFIX = "sha256:"
# A batch's result goes through Step Functions (256 KB per payload): each issue message is cut to this.
MAX_RESULT_MESSAGE = 400
# S3 tag the snapshot's copies carry; the bucket's lifecycle rule expires tagged objects.
SNAPSHOT_TAG_KEY = "d2ops-snapshot"
SNAPSHOT_TAGGING = f"{SNAPSHOT_TAG_KEY}=true"


class InventoryEntry(BaseModel):
    """One object of the dataset version that the run read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="relative to the dataset version's prefix, e.g. images/a.jpg")
    version_id: str | None = Field(description="the S3 VersionId read (None: a local directory or an unversioned "
                                               "bucket's 'null' version)")
    etag: str | None = Field(default=None, description="the S3 ETag read (quotes stripped); None locally")
    size: int = Field(ge=0)
    sha256: str | None = Field(default=None, description="hex SHA-256 of the bytes; None when they were not read "
                                                         "(an image the check never reached)")


class ImageLocation(BaseModel):
    """An image entry of an annotation file that names this image file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="the annotation file, relative to the dataset root")
    split: Literal["train", "val"] = Field(description="the file the entry is in: train or val (a derived val's "
                                                       "entries are train here: that split is keyed on the content "
                                                       "these checks hash)")
    index: int = Field(ge=0, description="the entry's position in that file's images array")
    width: int = Field(gt=0, description="the width the entry declares")
    height: int = Field(gt=0, description="the height the entry declares")


class ImageItem(BaseModel):
    """One Distributed Map item: an image file to check and copy, and the entries it answers for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="relative to the dataset version's prefix, e.g. images/a.jpg")
    version_id: str | None
    etag: str | None = None
    size: int = Field(ge=0)
    locations: list[ImageLocation] = Field(min_length=1)


class CheckedImage(BaseModel):
    """One image of a batch: the inventory entry of the bytes that were checked (sha256 None: not read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entry: InventoryEntry
    decoded: bool = Field(default=False, description="every byte decoded (not only the header)")
    passed: bool = Field(default=False, description="the rule accepted the image (size mismatches aside)")
    copied: bool = Field(default=False, description="copied into the run's snapshot")
    locations: list[ImageLocation] = Field(description="the item's locations (the overlap check needs the splits)")


class ImageBatchResult(BaseModel):
    """What one check_images Lambda returns for its batch (bounded: well under 256 KB for 50 images)."""

    model_config = ConfigDict(extra="forbid")

    images: list[CheckedImage] = Field(default_factory=list)
    issues: list[Issue] = Field(default_factory=list, description="in the report's Issue model, messages capped "
                                                                  f"at {MAX_RESULT_MESSAGE} characters")


M = TypeVar("M", bound=BaseModel)


def write_jsonl(stream: IO[bytes], records: Iterable[BaseModel]) -> int:
    """Write one compact JSON document per line; returns how many. Keys of a record keep the model's order."""
    count = 0
    for record in records:
        stream.write(record.model_dump_json().encode("utf-8") + b"\n")
        count += 1
    return count


def read_jsonl(lines: Iterable[bytes | str], model: type[M]) -> Iterator[M]:
    """Parse JSONL lines into ``model`` one at a time (blank lines skipped); a bad line raises ValueError naming it."""
    for number, line in enumerate(lines, 1):
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        if not text.strip():
            continue
        try:
            yield model.model_validate_json(text)
        except ValueError as exc:
            raise ValueError(f"line {number} is not a {model.__name__}: {str(exc).splitlines()[0]}") from exc


def inventory_bytes(entries: Iterable[InventoryEntry]) -> bytes:
    """The inventory file's exact bytes: entries sorted by key, one JSON document a line."""
    ordered = sorted(entries, key=lambda e: e.key)
    return b"".join(e.model_dump_json().encode("utf-8") + b"\n" for e in ordered)


def inventory_digest(data: bytes | Iterable[bytes]) -> str:
    """``sha256:<hex>`` of the inventory file's bytes (given whole or as chunks)."""
    digest = hashlib.sha256()
    if isinstance(data, bytes | bytearray | memoryview):
        digest.update(data)
    else:
        for chunk in data:
            digest.update(chunk)
    return DIGEST_PREFIX + digest.hexdigest()


def read_inventory(lines: Iterable[bytes | str]) -> Iterator[InventoryEntry]:
    return read_jsonl(lines, InventoryEntry)


def capped(issue: Issue) -> Issue:
    """``issue`` with its message cut to MAX_RESULT_MESSAGE characters (a batch result stays bounded)."""
    if len(issue.message) <= MAX_RESULT_MESSAGE:
        return issue
    return issue.model_copy(update={"message": issue.message[: MAX_RESULT_MESSAGE - 3] + "..."})


def clean_etag(etag: Any) -> str | None:
    """An S3 ETag without its quotes (None stays None)."""
    return str(etag).strip('"') if etag else None
