"""A COCO detection results file: the list ``loadRes`` takes (``image_id``, ``category_id``, ``bbox`` as
``[x, y, width, height]``, ``score``, and ``segmentation`` for masks).

Read by ``d2ops gate`` (a person's results files) through :func:`parse_results`, which answers a
bad file with one line naming the entry and the field; the evaluation job writes the same shape
(model_code.evaluation.coco.detections_to_coco).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator


class RleSegmentation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: list[int] = Field(min_length=2, max_length=2, description="[height, width]")
    counts: str | list[int]


class CocoResult(BaseModel):
    """One detection of a results file; other keys (``id``, ``area``) are COCO's own and pass through."""

    model_config = ConfigDict(extra="allow")

    image_id: int = Field(strict=True)
    category_id: int = Field(strict=True)
    bbox: list[float] = Field(min_length=4, max_length=4, description="[x, y, width, height] in pixels")
    score: float
    segmentation: RleSegmentation | list[list[float]] | None = None

    @field_validator("bbox")
    @classmethod
    def _box(cls, bbox: list[float]) -> list[float]:
        if not all(math.isfinite(v) for v in bbox):
            raise ValueError(f"bbox {bbox} has a non-finite number")
        if bbox[2] < 0 or bbox[3] < 0:
            raise ValueError(f"bbox {bbox} has a negative width or height")
        return bbox

    @field_validator("score")
    @classmethod
    def _score(cls, score: float) -> float:
        if not math.isfinite(score):
            raise ValueError(f"score {score} is not a finite number")
        return score


_RESULTS = TypeAdapter(list[CocoResult])


class ResultsInvalid(ValueError):
    """A results file is not a COCO detection results list (the message names the entry and the field)."""


def parse_results(raw: bytes, images: set[int], categories: set[int]) -> list[dict[str, Any]]:
    """The results as ``loadRes`` dicts; each must name an image and a category of the val file."""
    try:
        results = _RESULTS.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]) or "the document"
        if first["type"].startswith("json_"):
            raise ResultsInvalid(f"not valid JSON ({first['msg']})") from None
        raise ResultsInvalid(f"{where.lstrip('.')}: {first['msg']}") from None
    for index, result in enumerate(results):
        if result.image_id not in images:
            raise ResultsInvalid(f"[{index}].image_id: image {result.image_id} is not in the val annotations")
        if result.category_id not in categories:
            raise ResultsInvalid(f"[{index}].category_id: category {result.category_id} is not in the val "
                                 "annotations")
    return [r.model_dump(exclude_none=True) for r in results]
