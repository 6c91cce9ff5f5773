"""Per-request options: score threshold, max detections, masks.

Without ``score_threshold`` a request gets the model's own per-class thresholds (the artifact's
``score_thresholds``); with it, that one threshold for every class.

A caller can set them in the JSON body, in the query string (``/invocations?score_threshold=0.3``)
or, since SageMaker's InvokeEndpoint forwards no query string, in the
``X-Amzn-SageMaker-Custom-Attributes`` header (``score_threshold=0.3;masks=true``). When a key
appears in several places the JSON body wins over the query string, which wins over the header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_code.serving.errors import bad_request
from model_code.serving.json_body import describe

CUSTOM_ATTRIBUTES_HEADER = "x-amzn-sagemaker-custom-attributes"
# TorchServe adds the query string to the request's parameters; /invocations also reads this one
# itself to pick a model, so it is allowed and ignored here.
ROUTING_PARAMETERS = frozenset({"model_name"})
MAX_CUSTOM_ATTRIBUTES_CHARS = 1024  # InvokeEndpoint's own limit
MAX_DETECTIONS_LIMIT = 1000  # the most detections one request may ask for


class PredictOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: each class's own threshold from the artifact (metadata.json's score_thresholds, chosen on val);
    # a number: that threshold for every class, as before thresholds shipped with the model.
    score_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    max_detections: int = Field(default=100, ge=1, le=MAX_DETECTIONS_LIMIT)
    masks: bool = Field(default=False, description="return COCO RLE masks (instance segmentation models only)")


OPTION_NAMES = frozenset(PredictOptions.model_fields)


def parse_custom_attributes(header: str) -> dict[str, str]:
    """``key=value`` pairs separated by ``;`` or ``,`` (SageMaker passes the string through untouched)."""
    if len(header) > MAX_CUSTOM_ATTRIBUTES_CHARS:
        raise bad_request("invalid_option",
                          f"custom attributes header is longer than {MAX_CUSTOM_ATTRIBUTES_CHARS} characters")
    pairs: dict[str, str] = {}
    for item in header.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise bad_request("invalid_option", f"custom attributes header: {item!r} is not key=value "
                                                "(expected e.g. score_threshold=0.3)")
        pairs[key.strip()] = value.strip()
    return pairs


def resolve_options(*sources: tuple[str, Mapping[str, Any]]) -> PredictOptions:
    """Merge option sources, lowest precedence first; each is (where it came from, key -> value)."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, values in sources:
        for key, value in values.items():
            if key in ROUTING_PARAMETERS:
                continue
            if key not in OPTION_NAMES:
                raise bad_request("invalid_option", f"unknown option {describe(key)} in the {where}; "
                                                    f"known options: {', '.join(sorted(OPTION_NAMES))}")
            merged[key] = value
            origin[key] = where
    try:
        return PredictOptions.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = str(first["loc"][0]) if first["loc"] else "?"
        raise bad_request("invalid_option", f"option {key}={describe(merged.get(key))} in the "
                                            f"{origin.get(key, 'request')}: {first['msg']}") from exc
