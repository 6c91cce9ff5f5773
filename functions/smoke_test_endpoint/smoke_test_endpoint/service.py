"""Send one validation image to the endpoint and check the answer is well-formed detections."""

from __future__ import annotations

import io
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

from PIL import Image
from pydantic import ValidationError

from d2ops.validation.manifest import MANIFEST_FILE, parse_manifest
from smoke_test_endpoint.models import InvocationResponse, SmokeTestEvent, SmokeTestResult

CONTENT_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
# Real-time endpoints accept at most 6 MB per request.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_LISTED_KEYS = 10_000
MAX_CANDIDATES = 20
# COCO val2017's instances file is 25 MB; a larger split is not parsed just to pick one image.
MAX_VAL_ANNOTATION_BYTES = 64 * 1024 * 1024


class SmokeTestFailed(Exception):
    """The endpoint answered badly (error status, wrong content type, malformed detections)."""


class NoSmokeTestImage(Exception):
    """The dataset version has no JPEG/PNG image small enough to send."""


def content_type(key: str) -> str | None:
    dot = key.rfind(".")
    return CONTENT_TYPES.get(key[dot:].lower()) if dot >= 0 else None


def _listed_images(s3: Any, bucket: str, prefix: str) -> Iterator[str]:
    """Image keys of the dataset version in key order (the first MAX_LISTED_KEYS objects)."""
    seen = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if content_type(obj["Key"]):
                yield str(obj["Key"])
            seen += 1
            if seen >= MAX_LISTED_KEYS:
                return


def _val_images(s3: Any, bucket: str, prefix: str) -> list[str]:
    """Image keys of the val split in annotation order; empty when the split is too large to read."""
    try:
        manifest, _ = parse_manifest(s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_FILE)["Body"].read())
        if manifest is None:
            return []  # validation passed, so the manifest changed since: any image will do
        obj = s3.get_object(Bucket=bucket, Key=prefix + manifest.val)
        if obj["ContentLength"] > MAX_VAL_ANNOTATION_BYTES:
            obj["Body"].close()
            return []
        images = json.loads(obj["Body"].read()).get("images", [])
    except (s3.exceptions.NoSuchKey, ValueError, AttributeError):
        return []
    keys = (prefix + manifest.images_prefix + str(image.get("file_name", "")) for image in images
            if isinstance(image, dict))
    return [k for k in keys if content_type(k)][:MAX_CANDIDATES]


def _readable(s3: Any, bucket: str, key: str) -> bytes | None:
    """The image's bytes if it exists, fits one request and decodes; None otherwise."""
    try:
        obj = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey:
        return None
    if not 0 < obj["ContentLength"] <= MAX_IMAGE_BYTES:
        obj["Body"].close()
        return None
    data: bytes = obj["Body"].read()
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Exception:  # Pillow raises many types for corrupt data; any of them disqualifies the image
        return None
    return data


def pick_image(s3: Any, bucket: str, prefix: str) -> tuple[str, bytes]:
    """The first good JPEG/PNG of the val split, else of the dataset version in key order.

    Deterministic, so reruns send the same image; missing, oversized or corrupt images are
    skipped so a bad file in the dataset cannot fail (and roll back) a good model.
    """
    tried = 0
    for key in itertools.chain(_val_images(s3, bucket, prefix), _listed_images(s3, bucket, prefix)):
        tried += 1
        data = _readable(s3, bucket, key)
        if data is not None:
            return key, data
        if tried >= 2 * MAX_CANDIDATES:
            break
    raise NoSmokeTestImage(f"no decodable .jpg/.jpeg/.png of at most {MAX_IMAGE_BYTES} bytes among {tried} "
                           f"candidates under s3://{bucket}/{prefix}")


def check_response(status: int, response_type: str, body: bytes) -> InvocationResponse:
    if status != 200:
        raise SmokeTestFailed(f"endpoint answered HTTP {status}: {body[:300]!r}")
    if not response_type.startswith("application/json"):
        raise SmokeTestFailed(f"endpoint answered Content-Type {response_type!r}, expected application/json")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise SmokeTestFailed(f"endpoint answered invalid JSON ({exc}): {body[:300]!r}") from exc
    try:
        return InvocationResponse.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise SmokeTestFailed(f"endpoint answer is not detections: {where}: {first['msg']}") from exc


def smoke_test(event: SmokeTestEvent, s3: Any, runtime: Any) -> SmokeTestResult:
    key, image = pick_image(s3, event.bucket, event.prefix)
    started = time.monotonic()
    try:
        response = runtime.invoke_endpoint(EndpointName=event.endpoint_name, ContentType=content_type(key),
                                           Accept="application/json", Body=image)
    except runtime.exceptions.ModelError as exc:
        # The container answered with an error status; its message says why.
        err = exc.response.get("Error", {})
        status = exc.response.get("OriginalStatusCode", "?")
        raise SmokeTestFailed(
            f"endpoint {event.endpoint_name} answered {status} to {key}: {err.get('Message')}") from exc
    latency_ms = int((time.monotonic() - started) * 1000)
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 200))
    parsed = check_response(status, response.get("ContentType", ""), response["Body"].read())
    return SmokeTestResult(endpoint_name=event.endpoint_name, image_key=key, detections=len(parsed.detections),
                           latency_ms=latency_ms)
