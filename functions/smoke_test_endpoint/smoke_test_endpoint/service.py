"""Send one validation image to the endpoint and check the answer is well-formed detections."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from d2ops_core import images as rule
from d2ops_core.documents.capture import SMOKE_TEST_INFERENCE_ID
from d2ops_core.validation.manifest import MANIFEST_FILE, parse_manifest
from smoke_test_endpoint.models import InvocationResponse, SmokeTestEvent, SmokeTestResult

# Real-time endpoints accept at most 6 MB per request.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_LISTED_KEYS = 10_000
MAX_CANDIDATES = 20
# COCO val2017's instances file is 25 MB; a larger split is not parsed just to pick one image.
MAX_VAL_ANNOTATION_BYTES = 64 * 1024 * 1024
# Keys of a dataset version that are never images (its manifest and COCO documents).
NOT_IMAGES = (".json",)


class SmokeTestFailed(Exception):
    """The endpoint answered badly (error status, wrong content type, malformed detections)."""


class NoSmokeTestImage(Exception):
    """The dataset version has no JPEG/PNG image small enough to send."""


def _listed_images(s3: Any, bucket: str, prefix: str) -> Iterator[str]:
    """Keys of the dataset version that may be images, in key order (the first MAX_LISTED_KEYS objects).

    Names do not decide: a PNG named .jpg is an image, a GIF named .png is not; the content does.
    """
    seen = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if not obj["Key"].lower().endswith(NOT_IMAGES) and obj["Size"] > 0:
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
    except (s3.exceptions.NoSuchKey, ValueError, AttributeError, RecursionError):
        return []
    keys = (prefix + manifest.images_prefix + str(image.get("file_name", "")) for image in images
            if isinstance(image, dict) and image.get("file_name"))
    return list(itertools.islice(keys, MAX_CANDIDATES))


def _acceptable(s3: Any, bucket: str, key: str) -> tuple[bytes, str] | None:
    """The image's bytes and Content-Type if the endpoint would accept it, else None.

    The same rule as the endpoint (d2ops_core.images): JPEG/MPO or PNG by content, within the size
    limits, and it decodes completely.
    """
    try:
        obj = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey:
        return None
    if not 0 < obj["ContentLength"] <= MAX_IMAGE_BYTES:
        obj["Body"].close()
        return None
    data: bytes = obj["Body"].read()
    try:
        with rule.open_image(data, key) as image:
            image.load()
            image_format = str(image.format)
    except (rule.ImageRejected, OSError, ValueError, SyntaxError):  # Pillow's decoders raise these for bad data
        return None
    return data, rule.CONTENT_TYPES[image_format]


def pick_image(s3: Any, bucket: str, prefix: str) -> tuple[str, bytes, str]:
    """The first acceptable image of the val split, else of the dataset version in key order.

    Deterministic, so reruns send the same image; missing, oversized, corrupt or other-format
    files are skipped so a bad file in the dataset cannot fail (and roll back) a good model.
    Returns (key, bytes, Content-Type).
    """
    tried = 0
    for key in itertools.chain(_val_images(s3, bucket, prefix), _listed_images(s3, bucket, prefix)):
        tried += 1
        found = _acceptable(s3, bucket, key)
        if found is not None:
            return key, found[0], found[1]
        if tried >= 2 * MAX_CANDIDATES:
            break
    raise NoSmokeTestImage(f"no decodable JPEG or PNG image of at most {MAX_IMAGE_BYTES} bytes among {tried} "
                           f"candidates under s3://{bucket}/{prefix}")


def check_response(status: int, response_type: str, body: bytes) -> InvocationResponse:
    if status != 200:
        raise SmokeTestFailed(f"endpoint answered HTTP {status}: {body[:300]!r}")
    if not response_type.startswith("application/json"):
        raise SmokeTestFailed(f"endpoint answered Content-Type {response_type!r}, expected application/json")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json reads
        raise SmokeTestFailed(f"endpoint answered invalid JSON ({exc}): {body[:300]!r}") from exc
    try:
        return InvocationResponse.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise SmokeTestFailed(f"endpoint answer is not detections: {where}: {first['msg']}") from exc


def _invoke_once(event: SmokeTestEvent, runtime: Any, key: str, image: bytes, image_type: str) -> tuple[int, int]:
    """One InvokeEndpoint: (detections, latency in ms), or SmokeTestFailed saying what was wrong."""
    started = time.monotonic()
    try:
        # InferenceId marks the request in the endpoint's data capture as the smoke test's, not traffic.
        response = runtime.invoke_endpoint(EndpointName=event.endpoint_name, ContentType=image_type,
                                           Accept="application/json", Body=image, InferenceId=SMOKE_TEST_INFERENCE_ID)
    except runtime.exceptions.ModelError as exc:
        # The container answered with an error status; its message says why.
        err = exc.response.get("Error", {})
        status = exc.response.get("OriginalStatusCode", "?")
        raise SmokeTestFailed(
            f"endpoint {event.endpoint_name} answered {status} to {key}: {err.get('Message')}") from exc
    latency_ms = int((time.monotonic() - started) * 1000)
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 200))
    parsed = check_response(status, response.get("ContentType", ""), response["Body"].read())
    return len(parsed.detections), latency_ms


def smoke_test(event: SmokeTestEvent, s3: Any, runtime: Any) -> SmokeTestResult:
    """`event.requests` calls with the same image; the first bad answer fails the test, naming which call it was."""
    key, image, image_type = pick_image(s3, event.bucket, event.prefix)
    detections, slowest = 0, 0
    for attempt in range(event.requests):
        try:
            found, latency_ms = _invoke_once(event, runtime, key, image, image_type)
        except SmokeTestFailed as exc:
            raise SmokeTestFailed(f"request {attempt + 1} of {event.requests}: {exc}") from exc
        detections = found if attempt == 0 else detections
        slowest = max(slowest, latency_ms)
    return SmokeTestResult(endpoint_name=event.endpoint_name, image_key=key, detections=detections,
                           latency_ms=slowest, requests=event.requests)
