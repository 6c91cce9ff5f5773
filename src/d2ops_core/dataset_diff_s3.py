"""Dataset versions in S3 for the diff: a plain prefix, or a run (its inventory and its snapshot).

The S3 client is passed in (boto3's, or one with the same methods), so the core imports no boto3 and
the prepare Lambda and the CLI read runs the same way.

- A prefix (``s3://bucket/datasets/<name>/<version>/``): manifest and annotation files are read whole,
  every referenced image is downloaded once and hashed (streamed, a few at a time): correct for any
  upload, and its cost is one GET per image.
- A run (``runs/<run id>/``): the inventory gives every image's checksum (nothing is downloaded for
  images), the manifest and annotation files come from the run's snapshot; when the snapshot expired
  (SnapshotRetentionDays) they come from the dataset prefix by the VersionId the inventory pinned, and
  the diff says so. A run older than inventories has neither: the caller falls back to the prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from d2ops_core import s3_layout, s3_probe
from d2ops_core.dataset_diff import (
    DiffInputError,
    Fingerprints,
    ReadFile,
    VersionIndex,
    index_version,
    inventory_fingerprints,
)
from d2ops_core.validation.inventory import InventoryEntry, inventory_digest, read_inventory
from d2ops_core.validation.manifest import MANIFEST_FILE

_MISSING = {"NoSuchKey", "404", "NotFound", "NoSuchVersion"}
# Images hashed at once from a plain prefix: enough to hide GET latency, few enough to bound memory
# (each is streamed in 1 MB chunks).
_HASH_THREADS = 8


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code")) if isinstance(error, dict) else None


def _get(s3: Any, **kwargs: Any) -> bytes | None:
    try:
        return bytes(s3.get_object(**kwargs)["Body"].read())
    except Exception as exc:
        if _code(exc) in _MISSING:
            return None
        if _code(exc) in {"AccessDenied", "403"} and not s3_probe.key_listed(s3, kwargs["Bucket"], kwargs["Key"]):
            return None  # a role that may list only some prefixes gets 403, not 404, for a missing key
        if _code(exc) in {"AccessDenied", "403", "NoSuchBucket"}:
            raise DiffInputError(f"s3://{kwargs['Bucket']}/{kwargs['Key']}: {_code(exc)}") from None
        raise


def prefix_reader(s3: Any, bucket: str, prefix: str) -> tuple[ReadFile, Fingerprints]:
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"

    def read(key: str) -> bytes | None:
        return _get(s3, Bucket=bucket, Key=prefix + key)

    def one(key: str) -> tuple[str, int, str | None]:
        try:
            body = s3.get_object(Bucket=bucket, Key=prefix + key)["Body"]
        except Exception as exc:
            if _code(exc) in _MISSING:
                return key, 0, None
            raise
        digest, size = hashlib.sha256(), 0
        while chunk := body.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
        return key, size, digest.hexdigest()

    def fingerprints(keys: list[str]) -> Iterator[tuple[str, int, str | None]]:
        with ThreadPoolExecutor(_HASH_THREADS) as pool:
            window = _HASH_THREADS * 4  # results in key order, at most this many in flight
            for start in range(0, len(keys), window):
                yield from pool.map(one, keys[start:start + window])

    return read, fingerprints


def _unhashed(keys: list[str]) -> Iterator[tuple[str, int, str | None]]:
    return ((key, 0, None) for key in keys)


def index_prefix(s3: Any, bucket: str, prefix: str, *, source: str = "s3 prefix", hash_images: bool = True,
                 deadline: float | None = None, notes: list[str] | None = None) -> VersionIndex:
    """``hash_images`` False: annotations only (no GET per image); image content is then not compared."""
    read, fingerprints = prefix_reader(s3, bucket, prefix)
    if not hash_images:
        fingerprints = _unhashed
    index = index_version(f"s3://{bucket}/{prefix}", source, read, fingerprints, deadline=deadline)
    index.notes[:0] = notes or []
    return index


def index_run(s3: Any, artifacts_bucket: str, run_id: str, *, dataset_bucket: str | None = None,
              dataset_prefix: str | None = None, hash_fallback_images: bool = True,
              deadline: float | None = None) -> VersionIndex:
    """A run's dataset as it trained: inventory + snapshot (or, the snapshot gone, the pinned versions).

    Without an inventory it falls back to ``dataset_prefix`` in ``dataset_bucket`` (the latest objects
    there, every image downloaded) and says so; without either it raises DiffInputError.
    """
    raw = _get(s3, Bucket=artifacts_bucket, Key=s3_layout.inventory_key(run_id))
    if raw is None:
        if dataset_bucket and dataset_prefix:
            note = (f"run {run_id} has no inventory (it predates snapshots): read its dataset prefix "
                    f"s3://{dataset_bucket}/{dataset_prefix} as it is now")
            return index_prefix(s3, dataset_bucket, dataset_prefix, source="dataset prefix (no inventory)",
                                hash_images=hash_fallback_images, deadline=deadline, notes=[note])
        raise DiffInputError(f"s3://{artifacts_bucket}/{s3_layout.inventory_key(run_id)}: missing (no inventory)")
    where = f"s3://{artifacts_bucket}/{s3_layout.inventory_key(run_id)}"

    def entries() -> Iterator[InventoryEntry]:
        # Parsed as the merge join walks it: the file's bytes are held, never a model per line.
        try:
            yield from read_inventory(raw.splitlines())
        except ValueError as exc:
            raise DiffInputError(f"{where}: {exc}") from None

    # The manifest and annotation files (JSON), for their pinned versions and checksums: a handful.
    by_key = {e.key: e for e in entries() if e.key.endswith(".json")}
    snapshot = s3_layout.snapshot_prefix(run_id)
    notes: list[str] = []
    expired = not s3_probe.key_listed(s3, artifacts_bucket, snapshot + MANIFEST_FILE)
    if expired and not (dataset_bucket and dataset_prefix):
        raise DiffInputError(f"s3://{artifacts_bucket}/{snapshot}: the snapshot is gone and no dataset prefix "
                             "was given to fall back to")
    if expired:
        notes.append(f"run {run_id}'s snapshot has expired: its files were read from s3://{dataset_bucket}/"
                     f"{dataset_prefix} at the versions its inventory pinned")

    def read(key: str) -> bytes | None:
        if not expired:
            return _get(s3, Bucket=artifacts_bucket, Key=snapshot + key)
        entry = by_key.get(key)
        if entry is None:
            return None
        kwargs: dict[str, Any] = {"Bucket": dataset_bucket, "Key": f"{dataset_prefix}{key}"}
        if entry.version_id and entry.version_id != "null":
            kwargs["VersionId"] = entry.version_id
        return _get(s3, **kwargs)

    source = "dataset prefix (pinned by the run's inventory)" if expired else "run snapshot"
    uri = f"s3://{dataset_bucket}/{dataset_prefix}" if expired else f"s3://{artifacts_bucket}/{snapshot}"
    index = index_version(uri, source, read, inventory_fingerprints(entries()), run_id=run_id,
                          inventory_digest=inventory_digest(raw),
                          file_hashes={k: e.sha256 for k, e in by_key.items()}, deadline=deadline)
    index.notes[:0] = notes
    return index
