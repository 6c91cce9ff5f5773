"""Turn one HTTP request (body, content type, query, headers) into an image tensor and options.

Every way a request can be wrong ends here as a :class:`RequestError` with a 4xx status and a
message naming the problem; nothing reaches the model that is not a decoded RGB image.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from d2ops_core import images as rule
from model_code.inference import image_to_tensor
from model_code.serving.errors import RequestError, bad_request, too_large, unsupported_media_type
from model_code.serving.json_body import describe, parse_json_body
from model_code.serving.options import (
    CUSTOM_ATTRIBUTES_HEADER,
    PredictOptions,
    parse_custom_attributes,
    resolve_options,
)

# SageMaker real-time endpoints take at most 6 MB per request; TorchServe's max_request_size
# (model_code/serving/resources/config.properties) refuses longer bodies before they reach Python.
MAX_IMAGE_BYTES = 6 * 1024 * 1024
RAW_IMAGE_TYPES = frozenset({"image/jpeg", "image/jpg", "image/png", "application/x-image", "application/octet-stream"})
JSON_TYPES = frozenset({"application/json"})
# d2ops_core.images' reasons -> the answer: other formats are 415, too many pixels 413, the rest 400.
_STATUS: dict[str, Callable[[str, str], RequestError]] = {
    "empty": lambda code, message: bad_request("empty_body", f"{message}: send a JPEG or PNG image"),
    "not_an_image": bad_request,
    "unsupported_format": lambda code, message: RequestError(415, "unsupported_content_type",
                                                              f"{message}; send a JPEG or PNG"),
    "too_large": lambda code, message: too_large("image_too_large", message),
    "bad_shape": lambda code, message: bad_request("extreme_aspect_ratio", message),
    "corrupt": lambda code, message: bad_request("corrupt_image", message),
}
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
    """TorchServe hands the body over as bytes (decode_input_request=false); tests may pass str."""
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    raise bad_request("invalid_body", f"request body arrived as {type(body).__name__}, not bytes")


def _text(value: Any, where: str) -> str:
    """A header or query value as text: servers hand over str or bytes (TorchServe's parameters are bytes).

    A bytes header once failed on ``str.replace`` and a bytes query name showed as the very option it
    named ("unknown option 'score_threshold'"); anything else is refused naming where it came from.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    raise bad_request("invalid_option", f"{where} arrived as {type(value).__name__} {describe(value)}, not text")


def decode_image(data: bytes, where: str = "request body") -> torch.Tensor:
    """JPEG (MPO included) or PNG bytes -> uint8 [3, H, W] upright RGB, through the one image rule.

    ``d2ops_core.images`` decides the formats (Pillow tries only its JPEG and PNG openers), the size
    limits (checked from the header, before decoding) and applies the EXIF orientation exactly
    as training and evaluation do; its refusals become 4xx here.
    """
    if len(data) > MAX_IMAGE_BYTES:
        raise too_large("body_too_large", f"{where} is {len(data)} bytes; the limit is {MAX_IMAGE_BYTES} bytes")
    try:
        return image_to_tensor(rule.load_rgb(data, where))
    except rule.ImageRejected as exc:
        raise _STATUS.get(exc.reason, _STATUS["corrupt"])(exc.reason, exc.message) from exc


def decode_base64_image(value: Any) -> bytes:
    where = "JSON field 'image'"
    if not isinstance(value, str):
        raise bad_request("invalid_json", f"{where} must be a base64 string, got {type(value).__name__} "
                                          f"{describe(value)}")
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
    lowered = {_text(k, "a header name").lower(): v for k, v in (headers or {}).items()}
    attributes = lowered.get(CUSTOM_ATTRIBUTES_HEADER)
    sources: list[tuple[str, Mapping[str, Any]]] = []
    if attributes:
        sources.append(("custom attributes header", parse_custom_attributes(_text(attributes,
                                                                                    "the custom attributes header"))))
    if query:
        sources.append(("query string", {_text(k, "a query parameter name"): _text(v, f"query parameter {describe(k)}")
                                         for k, v in query.items()}))

    if kind in JSON_TYPES:
        fields = parse_json_body(body)
        if "image" not in fields:
            raise bad_request("invalid_json", "JSON body has no 'image' field (a base64 JPEG or PNG)")
        data = decode_base64_image(fields.pop("image"))
        sources.append(("JSON body", fields))
        options = resolve_options(*sources)
        return DecodedRequest(image=decode_image(data, "JSON field 'image'"), options=options)

    if kind in RAW_IMAGE_TYPES or kind.startswith("image/"):
        options = resolve_options(*sources)
        return DecodedRequest(image=decode_image(as_bytes(body)), options=options)
    raise unsupported_media_type(f"Content-Type {kind!r} is not supported; use {SUPPORTED_TYPES}")
