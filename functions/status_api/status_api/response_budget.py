"""Keeping ``GET /runs/{runId}/evaluation`` under Lambda's response limit.

Lambda returns at most 6 MB from a synchronous invocation; API Gateway then answers 502 (the function
"succeeded", but its answer is lost). The evaluation answer grows with the dataset's classes: per-class
AP tables, precision-recall curves (2 x 101 points per class, IoU type and model), AP by object size and
the bootstrap's per-class differences. A few hundred classes with masks pass 6 MB.

An answer over :data:`RESPONSE_BUDGET` leaves out its largest parts, in :data:`DROPS` order (the least
needed for the summary first), until it fits, and says so: ``truncated``, ``left_out`` naming each part,
and ``full_report`` with a short-lived presigned link to each S3 document the answer was made from. An
answer within the budget is returned as it is. Paging each per-class map was the alternative; a client
that wants all of it wants it whole, and links give it that in one request per document, of any size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Lambda's quota for a synchronous invocation's response payload ("Invocation payload (request and
# response): 6 MB each for request and response (synchronous)").
LAMBDA_RESPONSE_SOURCE = "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html"
LAMBDA_RESPONSE_LIMIT = 6 * 1024 * 1024
# The body as :func:`encoded_size` measures it, leaving a megabyte for the response's other fields
# (status, headers) and whatever the encoders do differently from this measure.
RESPONSE_BUDGET = 5 * 1024 * 1024


def encoded_size(document: Any) -> int:
    """Bytes of ``document`` as the function returns it: compact JSON text (Powertools' serializer), itself
    a JSON string in the response (each quote and backslash escaped, non-ASCII as ``\\uXXXX``: the most
    any encoder of the response can spend)."""
    return len(json.dumps(json.dumps(document, separators=(",", ":"))))


Slot = tuple[dict[str, Any], str, Any]  # (the map holding a part, the part's key, what replaces it)


def _clear(path: tuple[str, ...], empty: Any) -> Callable[[dict[str, Any]], list[Slot]]:
    """The slots of the field at ``path`` (``*``: every key of a map) that hold something, to set to ``empty``."""

    def slots(document: dict[str, Any]) -> list[Slot]:
        parents: list[Any] = [document]
        for step in path[:-1]:
            parents = [child for parent in parents if isinstance(parent, dict)
                       for child in (parent.values() if step == "*" else [parent.get(step)])]
        return [(parent, path[-1], empty) for parent in parents if isinstance(parent, dict) and parent.get(path[-1])]

    return slots


def _thumbnails(document: dict[str, Any]) -> list[Slot]:
    gallery = (document.get("errors") or {}).get("gallery") or []
    return [(image, "thumbnails", {}) for image in gallery if isinstance(image, dict) and image.get("thumbnails")]


# What a too-large answer leaves out, in order: (the part's name in ``left_out``, where it is).
DROPS: tuple[tuple[str, Callable[[dict[str, Any]], list[Slot]]], ...] = (
    ("errors.gallery.thumbnails", _thumbnails),  # up to ~2.5 MB of pictures, whatever the classes
    ("pr_curves", _clear(("pr_curves",), None)),
    ("errors.models.per_class_ap_by_size", _clear(("errors", "models", "*", "per_class_ap_by_size"), {})),
    ("comparison.classes", _clear(("comparison", "classes"), {})),
    ("challenger.per_class", _clear(("challenger", "per_class"), {})),
    ("champion.per_class", _clear(("champion", "per_class"), {})),
    ("errors", _clear(("errors",), None)),
    ("comparison.per_class", _clear(("comparison", "per_class"), {})),
)


def fit(document: dict[str, Any], budget: int = RESPONSE_BUDGET) -> list[str]:
    """Drop parts of ``document`` (in place, in DROPS order) until it fits ``budget``; the parts dropped.

    The whole is encoded once; a dropped part's share is its own encoding less the two quotes around it
    (escaping is character by character, so a part costs the same inside the whole as alone). What is left
    after every drop (metrics, the overall comparison, held-out counts) does not grow with the classes or
    images; an answer still over the budget then is returned as it is."""
    size = encoded_size(document)
    dropped: list[str] = []
    for name, where in DROPS:
        if size <= budget:
            break
        slots = where(document)
        for parent, key, empty in slots:
            size += encoded_size(empty) - encoded_size(parent[key])
            parent[key] = empty
        if slots:
            dropped.append(name)
    return dropped
