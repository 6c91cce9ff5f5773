"""Asking S3 whether an object exists, as our least-privileged roles can."""

from __future__ import annotations

from typing import Any


def key_listed(s3: Any, bucket: str, key: str) -> bool:
    """Whether the object ``key`` exists, asked by listing with the key as the prefix.

    A GET or HEAD of a missing key answers 404 only to callers allowed to list the bucket;
    our roles may list only the prefixes they read (an ``s3:prefix`` condition, which a
    GET request does not carry), so they could see 403 instead. A listing with that very
    prefix is what the condition allows. The key sorts first among keys it prefixes.
    """
    page = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    return any(obj["Key"] == key for obj in page.get("Contents", []))


def read_listed(s3: Any, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when it does not exist: asked by :func:`key_listed` first (a GET of a missing
    key may answer 403), and None too when it is removed between the listing and the read."""
    if not key_listed(s3, bucket, key):
        return None
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None
