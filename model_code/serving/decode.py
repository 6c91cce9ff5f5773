"""Turn one HTTP request (body, content type, query, headers) into an image tensor and options.

Every way a request can be wrong ends here as a :class:`RequestError` with a 4xx status and a
message naming the problem; nothing reaches the model that is not a decoded RGB image.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from model_code.inference import image_to_tensor
from model_code.serving.errors import bad_request, too_large, unsupported_media_type
from model_code.serving.options import (
    CUSTOM_ATTRIBUTES_HEADER,
    PredictOptions,
    parse_custom_attributes,
    resolve_options,
)

# SageMaker real-time endpoints take at most 6 MB per request; TorchServe's max_request_size
# (containers/serving/config.properties) refuses longer bodies before they reach Python.
MAX_IMAGE_BYTES = 6 * 1024 * 1024
# A small compressed file can expand to a huge bitmap (a decompression bomb): refuse more than
# 36 megapixels (6000 x 6000) before decoding the pixels.
MAX_PIXELS = 36_000_000
IMAGE_FORMATS = ("JPEG", "PNG")
RAW_IMAGE_TYPES = frozenset({"image/jpeg", "image/jpg", "image/png", "application/x-image", "application/octet-stream"})
JSON_TYPES = frozenset({"application/json"})
SUPPORTED_TYPES = "image/jpeg, image/png, application/x-image or application/json"


@dataclass(frozen=True)
class DecodedRequest:
    image: torch.Tensor  # uint8 [3, H, W], RGB
    options: PredictOptions

    @property
    def width(self) -> int:
        return int(self.image.shape[2])

    @property
    def height(self) -> int:
        return int(self.image.shape[1])


def media_type(content_type: str | None) -> str:
    """``image/PNG; charset=x`` -> ``image/png``; a missing header counts as a raw image."""
    if not content_type:
        return "application/x-image"
    return content_type.split(";", 1)[0].strip().lower()


def as_bytes(body: Any) -> bytes:
    """TorchServe hands the body over as bytes, or as str/dict when it decoded it itself."""
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body).encode("utf-8")


def decode_image(data: bytes, where: str = "request body") -> torch.Tensor:
    """JPEG or PNG bytes -> uint8 [3, H, W] RGB, refusing empty, huge, truncated or non-image data."""
    if not data:
        raise bad_request("empty_body", f"{where} is empty: send a JPEG or PNG image")
    if len(data) > MAX_IMAGE_BYTES:
        raise too_large("body_too_large", f"{where} is {len(data)} bytes; the limit is {MAX_IMAGE_BYTES} bytes")
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise too_large("image_too_large", f"{where}: {exc}") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise bad_request("not_an_image", f"{where} ({len(data)} bytes) is not a JPEG or PNG image: "
                                          "cannot identify an image format") from exc
    with image:
        if image.format not in IMAGE_FORMATS:
            raise unsupported_media_type(f"{where} is a {image.format} image; send a JPEG or PNG")
        width, height = image.size
        if width <= 0 or height <= 0:
            raise bad_request("zero_size_image", f"{where} is a {width}x{height} image; it has no pixels")
        if width * height > MAX_PIXELS:
            raise too_large("image_too_large", f"{where} is a {width}x{height} image ({width * height} pixels); "
                                               f"the limit is {MAX_PIXELS} pixels")
        try:
            image.load()
            return image_to_tensor(image)
        except (OSError, SyntaxError, ValueError) as exc:
            # Pillow says "image file is truncated" or names the broken chunk: pass that on.
            raise bad_request("corrupt_image", f"{where} is a truncated or corrupt {image.format} image "
                                               f"({width}x{height}): {exc}") from exc


def decode_base64_image(value: Any) -> bytes:
    where = "JSON field 'image'"
    if not isinstance(value, str):
        raise bad_request("invalid_json", f"{where} must be a base64 string, got {type(value).__name__}")
    if value.startswith("data:"):
        # data URLs (data:image/png;base64,....) are what browsers produce
        header, _, value = value.partition(",")
        if not header.endswith(";base64"):
            raise bad_request("invalid_base64", f"{where} is a data URL without ';base64'")
    compact = "".join(value.split())
    if len(compact) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise too_large("body_too_large", f"{where} holds more than {MAX_IMAGE_BYTES} bytes of image")
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request("invalid_base64", f"{where} is not valid base64: {exc}") from exc


def decode_request(body: Any, content_type: str | None, query: Mapping[str, Any] | None = None,
                   headers: Mapping[str, str] | None = None) -> DecodedRequest:
    """Decode one request. ``headers`` keys may be in any case; ``query`` values may be bytes."""
    kind = media_type(content_type)
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    attributes = lowered.get(CUSTOM_ATTRIBUTES_HEADER)
    sources: list[tuple[str, Mapping[str, Any]]] = []
    if attributes:
        sources.append(("custom attributes header", parse_custom_attributes(attributes)))
    if query:
        sources.append(("query string", {k: as_bytes(v).decode("utf-8", "replace") for k, v in query.items()}))

    if kind in JSON_TYPES:
        raw = as_bytes(body)
        if not raw:
            raise bad_request("empty_body", 'request body is empty: send {"image": "<base64 JPEG or PNG>"}')
        if len(raw) > 2 * MAX_IMAGE_BYTES:
            raise too_large("body_too_large", f"JSON body is {len(raw)} bytes; the limit is {2 * MAX_IMAGE_BYTES}")
        try:
            document = body if isinstance(body, dict) else json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad_request("invalid_json", f"request body is not valid JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise bad_request("invalid_json", f'JSON body must be an object like {{"image": "<base64>"}}, '
                                              f"got {type(document).__name__}")
        if "image" not in document:
            raise bad_request("invalid_json", "JSON body has no 'image' field (a base64 JPEG or PNG)")
        fields = dict(document)
        data = decode_base64_image(fields.pop("image"))
        sources.append(("JSON body", fields))
        options = resolve_options(*sources)
        return DecodedRequest(image=decode_image(data, "JSON field 'image'"), options=options)

    if kind in RAW_IMAGE_TYPES or kind.startswith("image/"):
        options = resolve_options(*sources)
        return DecodedRequest(image=decode_image(as_bytes(body)), options=options)
    raise unsupported_media_type(f"Content-Type {kind!r} is not supported; use {SUPPORTED_TYPES}")
