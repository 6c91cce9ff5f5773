"""The evaluation documents and the quality gate's thresholds.

- :class:`ModelEvaluation`: ``evaluation.json`` inside a model artifact (written by the trainers'
  export, read back by ``model_code.artifact``).
- :class:`EvaluationReport`: ``evaluation.json`` of the evaluation processing job
  (``model_code.evaluation.job`` writes it, the ``summarize_evaluation`` Lambda reads it).
- :class:`HeldOutImages`: which val images neither model trained on, hence compared.
- :class:`Comparison`: the paired-bootstrap interval of challenger minus champion inside the report
  (``model_code.evaluation.bootstrap.compare`` computes it; ``d2ops_core.gate_decision`` judges it).
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

    challenger: float = Field(description="the challenger's AP on the compared val images (point estimate)")
    champion: float = Field(description="the champion's AP on the compared val images (point estimate)")
    difference: float = Field(description="challenger - champion")
    low: float = Field(description="lower end of the interval of the difference")
    high: float = Field(description="upper end of the interval of the difference")
    confidence: float = Field(gt=0, lt=1,
                              description="two-sided level of this interval (per class: Bonferroni-adjusted)")
    half_width: float = Field(ge=0, description="(high - low) / 2")
    method: Literal["percentile", "normal"] = Field(
        "percentile", description="percentile: the resampled differences' quantiles (overall); normal: the point "
                                  "difference +- z x the resamples' standard deviation (per class, where a "
                                  "Bonferroni level puts a percentile end on the one or two most extreme resamples)")
    low_mc_error: float | None = Field(
        None, ge=0, description="Monte-Carlo standard error of `low`: how much another seed could move it")
    high_mc_error: float | None = Field(None, ge=0, description="Monte-Carlo standard error of `high`")

    @model_validator(mode="after")
    def _ordered(self) -> DifferenceInterval:
        if self.low > self.high:
            raise ValueError(f"interval low {self.low} is above high {self.high}")
        return self


class ClassDifference(BaseModel):
    """One class with ground truth on the compared images: both point APs, whether it is judged per class or not."""

    challenger: float = Field(ge=0, le=1)
    champion: float = Field(ge=0, le=1)
    difference: float = Field(description="challenger - champion")
    instances: int = Field(ge=1, description="non-crowd instances of the class on the compared images")
    images: int = Field(ge=1, description="compared images holding at least one of them")
    high: float | None = Field(
        None, description="upper end of the class's normal interval of the difference at the Bonferroni level over "
                          "every listed class: below 0, the class is surely worse by some amount, which a point drop "
                          "beyond MaxClassRegression then cannot be noise (None: reports that did not say)")


ExclusionReason = Literal["challenger_trained_on", "champion_trained_on"]


class ExcludedImages(BaseModel):
    """Val images left out of the comparison because a model was trained on their bytes."""

    reason: ExclusionReason
    images: int = Field(ge=1)
    examples: list[str] = Field(default_factory=list, max_length=5, description="a few of their file names")


class HeldOutImages(BaseModel):
    """Which val images the comparison could use: those neither model was trained on (by content hash)."""

    compared: int = Field(ge=0, description="val images both models were scored on in the comparison")
    excluded: list[ExcludedImages] = Field(
        default_factory=list, description="val images left out, by reason (an image both models trained on is "
                                          "counted under the first reason)")
    unverified: list[Literal["challenger", "champion"]] = Field(
        default_factory=list, description="models whose artifact does not list its training images, so their "
                                          "training images could not be left out")

    @property
    def excluded_images(self) -> int:
        return sum(e.images for e in self.excluded)


class Comparison(BaseModel):
    """The paired bootstrap over the held-out val images: the same resampled images score both models."""

    method: Literal["paired_bootstrap"] = "paired_bootstrap"
    metric: str = Field(description="the primary metric compared, e.g. bbox_AP")
    val_images: int = Field(ge=1, description="val images both models were scored on (the held-out ones)")
    resamples: int = Field(ge=1)
    seed: int
    confidence: float = Field(gt=0, lt=1, description="two-sided level of the overall interval")
    overall: DifferenceInterval
    per_class: dict[str, DifferenceInterval] = Field(
        default_factory=dict, description="judged classes only (enough val instances), Bonferroni-adjusted")
    classes: dict[str, ClassDifference] = Field(
        default_factory=dict, description="every class with ground truth on the compared images, judged or not: "
                                          "the mean of their differences is the overall difference, in every "
                                          "resample (a class a resample misses contributes its point difference)")


class EvaluationReport(BaseModel):
    """``evaluation.json`` of the evaluation job: challenger and champion on the same val split."""

    primary_metric: PrimaryMetric
    val_images: int = Field(ge=1)
    class_instances: dict[str, int] = Field(
        description="non-crowd ground-truth instances per class name on the val split (the per-class gate "
                    "judges only classes with enough of them)")
    challenger: ModelScores
    champion: ModelScores | None = None
    held_out: HeldOutImages | None = Field(
        None, description="the val images the comparison could use; required when there is a champion")
    comparison: Comparison | None = Field(
        None, description="challenger vs champion by a paired bootstrap on the held-out images (None without a "
                          "champion, or when no held-out image holds ground truth: the gate then asks a person)")
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
        if self.champion is not None and self.held_out is None:
            raise ValueError("held_out is required when there is a champion")
        if self.comparison is not None and self.champion is None:
            raise ValueError("comparison given without a champion")
        if self.comparison is not None and self.held_out is not None \
                and self.comparison.val_images != self.held_out.compared:
            raise ValueError(f"comparison.val_images {self.comparison.val_images} is not held_out.compared "
                             f"{self.held_out.compared}")
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
    min_compared_images: int = Field(
        gate.DEFAULT_MIN_COMPARED_IMAGES, ge=1,
        description="held-out val images the comparison needs before the gate may approve (MinComparedImages); "
                    "with fewer the decision is review")
    confidence: float = Field(
        gate.DEFAULT_CONFIDENCE, gt=gate.MIN_CONFIDENCE_EXCLUSIVE, lt=gate.MAX_CONFIDENCE_EXCLUSIVE,
        description="two-sided level of the interval of challenger - champion the gate judges (GateConfidence; "
                    "a manifest may raise it: a wider interval approves less readily)")
    resamples: int = Field(
        gate.DEFAULT_RESAMPLES, ge=gate.MIN_RESAMPLES, le=gate.MAX_RESAMPLES,
        description="paired-bootstrap resamples of the val images (GateResamples; a manifest may raise it)")
