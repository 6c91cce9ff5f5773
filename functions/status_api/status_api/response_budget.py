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


def _clear(path: tuple[str, ...], empty: Any) -> Callable[[dict[str, Any]], bool]:
    """Set the field at ``path`` (``*``: every key of a map) to ``empty``; whether anything was there."""

    def drop(document: dict[str, Any]) -> bool:
        found = False
        parents: list[Any] = [document]
        for step in path[:-1]:
            parents = [child for parent in parents if isinstance(parent, dict)
                       for child in (parent.values() if step == "*" else [parent.get(step)])]
        for parent in parents:
            if isinstance(parent, dict) and parent.get(path[-1]):
                parent[path[-1]] = empty
                found = True
        return found

    return drop


def _thumbnails(document: dict[str, Any]) -> bool:
    gallery = (document.get("errors") or {}).get("gallery") or []
    found = any(image.get("thumbnails") for image in gallery)
    for image in gallery:
        image["thumbnails"] = {}
    return found


# What a too-large answer leaves out, in order: (the part's name in ``left_out``, how to drop it).
DROPS: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
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

    What is left after every drop (metrics, the overall comparison, held-out counts) does not grow with
    the classes or images; an answer still over the budget then is returned as it is."""
    dropped: list[str] = []
    for name, drop in DROPS:
        if encoded_size(document) <= budget:
            break
        if drop(document):
            dropped.append(name)
    return dropped
