"""The evaluation report (interfaces: evaluation processing job) and what the quality gate reads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class GateThresholds(BaseModel):
    primary_metric: Literal["bbox_AP", "segm_AP"] | None = Field(
        None, description="the metric the run's task is judged by (plan.gate); default: the report's")
    min_map: float = Field(ge=0, le=1)
    max_regression: float = Field(ge=0, le=1)


class SummarizeEvent(BaseModel):
    report_uri: str = Field(pattern=r"^s3://")
    gate: GateThresholds


class ModelScores(BaseModel):
    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]] = Field(default_factory=dict)


class EvaluationReport(BaseModel):
    """``evaluation.json`` as the processing job writes it (AP values are fractions)."""

    primary_metric: Literal["bbox_AP", "segm_AP"]
    val_images: int = Field(ge=1)
    challenger: ModelScores
    champion: ModelScores | None = None


class EvaluationSummary(BaseModel):
    """Named numbers for the "Quality gate" Choice state (never positions in a list)."""

    report_uri: str
    primary_metric: str
    challenger_value: float
    challenger_metrics: dict[str, float]
    has_champion: bool
    champion_value: float | None
    champion_floor: float = Field(description="champion_value - max_regression (0 without a champion)")
    min_map: float
    max_regression: float
