"""The evaluation documents and the quality gate's thresholds.

- :class:`ModelEvaluation`: ``evaluation.json`` inside a model artifact (written by the trainers'
  export, read back by ``model_code.artifact``).
- :class:`EvaluationReport`: ``evaluation.json`` of the evaluation processing job
  (``model_code.evaluation.job`` writes it, the ``summarize_evaluation`` Lambda reads it).
- :class:`Comparison`: the paired-bootstrap interval of challenger minus champion inside the report
  (``model_code.evaluation.bootstrap.compare`` computes it; the gate judges its upper bound).
- :class:`GateThresholds`: ``$.plan.gate`` (``prepare_training`` writes it, ``summarize_evaluation``
  reads it).

AP values are fractions in [0, 1]. A metric COCO cannot define on a split (no ground truth in
an area range) is left out rather than written as -1, so every number present is a real AP.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from d2ops_core import gate
from d2ops_core.metrics import PrimaryMetric


class ModelScores(BaseModel):
    """One model's numbers on one split: ``metrics`` (``bbox_AP``, ...) and per class name ``{"bbox_AP": ...}``."""

    metrics: dict[str, float]
    per_class: dict[str, dict[str, float]] = Field(default_factory=dict)


class ModelEvaluation(ModelScores):
    """``evaluation.json`` in a model artifact: the model on its own val split."""

    primary_metric: PrimaryMetric
    val_images: int = Field(ge=1)
    iteration: int | None = Field(default=None, ge=0, description="the training iteration the weights come from")


class DifferenceInterval(BaseModel):
    """Challenger minus champion on one metric: both point estimates and the bootstrap interval of the difference."""

    challenger: float = Field(description="the challenger's AP on the val images (point estimate)")
    champion: float = Field(description="the champion's AP on the val images (point estimate)")
    difference: float = Field(description="challenger - champion")
    low: float = Field(description="lower end of the percentile interval of the difference")
    high: float = Field(description="upper end of the percentile interval of the difference")
    confidence: float = Field(gt=0, lt=1,
                              description="two-sided level of this interval (per class: Bonferroni-adjusted)")
    half_width: float = Field(ge=0, description="(high - low) / 2")

    @model_validator(mode="after")
    def _ordered(self) -> DifferenceInterval:
        if self.low > self.high:
            raise ValueError(f"interval low {self.low} is above high {self.high}")
        return self


class Comparison(BaseModel):
    """The paired bootstrap over val images: the same resampled images score both models."""

    method: Literal["paired_bootstrap"] = "paired_bootstrap"
    metric: str = Field(description="the primary metric compared, e.g. bbox_AP")
    val_images: int = Field(ge=1)
    resamples: int = Field(ge=1)
    seed: int
    confidence: float = Field(gt=0, lt=1, description="two-sided level of the overall interval")
    overall: DifferenceInterval
    per_class: dict[str, DifferenceInterval] = Field(
        default_factory=dict, description="judged classes only (enough val instances), Bonferroni-adjusted")


class EvaluationReport(BaseModel):
    """``evaluation.json`` of the evaluation job: challenger and champion on the same val split."""

    primary_metric: PrimaryMetric
    val_images: int = Field(ge=1)
    class_instances: dict[str, int] = Field(
        description="non-crowd ground-truth instances per class name on the val split (the per-class gate "
                    "judges only classes with enough of them)")
    challenger: ModelScores
    champion: ModelScores | None = None
    comparison: Comparison | None = Field(
        None, description="challenger vs champion by a paired bootstrap; required when there is a champion")
    challenger_score_thresholds: dict[str, float] = Field(
        default_factory=dict, description="the challenger artifact's per-class score thresholds (its metadata.json's "
                                          "score_thresholds; empty when it has none), for the registry entry")

    @model_validator(mode="after")
    def _classes_are_counted(self) -> EvaluationReport:
        # A class with an AP but no count would silently escape the per-class gate.
        for who, scores in (("challenger", self.challenger), ("champion", self.champion)):
            uncounted = sorted(set(scores.per_class) - set(self.class_instances)) if scores else []
            if uncounted:
                raise ValueError(f"{who}.per_class names classes missing from class_instances: {uncounted}")
        if any(n < 0 for n in self.class_instances.values()):
            raise ValueError("class_instances must not be negative")
        # Without the interval the gate could only compare two point estimates, the coin toss it replaces.
        if self.champion is not None and self.comparison is None:
            raise ValueError("comparison is required when there is a champion")
        if self.comparison is not None and self.champion is None:
            raise ValueError("comparison given without a champion")
        return self


class GateThresholds(BaseModel):
    """The thresholds one run is judged by: the stack's parameters, tightened by the manifest."""

    primary_metric: PrimaryMetric | None = Field(
        None, description="the metric the run's task is judged by (d2ops_core.metrics.primary_metric); "
                          "None (plans from before it was recorded): the report's")
    min_map: float = Field(ge=0, le=1, description="the challenger's primary AP must reach this")
    max_regression: float = Field(ge=0, le=1, description="allowed primary-AP drop below the champion")
    max_class_regression: float | None = Field(
        None, ge=0, le=1, description="allowed per-class AP drop below the champion (None: plans from before the "
                                      "per-class gate)")
    min_class_instances: int | None = Field(
        None, ge=1, description="classes with fewer val instances are not judged per class")
    confidence: float = Field(
        gate.DEFAULT_CONFIDENCE, gt=gate.MIN_CONFIDENCE_EXCLUSIVE, lt=gate.MAX_CONFIDENCE_EXCLUSIVE,
        description="two-sided level of the interval of challenger - champion the gate judges (GateConfidence; "
                    "a manifest may lower it: a narrower interval refuses more readily)")
    resamples: int = Field(
        gate.DEFAULT_RESAMPLES, ge=gate.MIN_RESAMPLES, le=gate.MAX_RESAMPLES,
        description="paired-bootstrap resamples of the val images (GateResamples; a manifest may raise it)")
