"""The evaluation documents and the quality gate's thresholds.

- :class:`ModelEvaluation`: ``evaluation.json`` inside a model artifact (written by the trainers'
  export, read back by ``model_code.artifact``).
- :class:`EvaluationReport`: ``evaluation.json`` of the evaluation processing job
  (``model_code.evaluation.job`` writes it, the ``summarize_evaluation`` Lambda reads it).
- :class:`GateThresholds`: ``$.plan.gate`` (``prepare_training`` writes it, ``summarize_evaluation``
  reads it).

AP values are fractions in [0, 1]. A metric COCO cannot define on a split (no ground truth in
an area range) is left out rather than written as -1, so every number present is a real AP.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

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


class EvaluationReport(BaseModel):
    """``evaluation.json`` of the evaluation job: challenger and champion on the same val split."""

    primary_metric: PrimaryMetric
    val_images: int = Field(ge=1)
    class_instances: dict[str, int] = Field(
        description="non-crowd ground-truth instances per class name on the val split (the per-class gate "
                    "judges only classes with enough of them)")
    challenger: ModelScores
    champion: ModelScores | None = None

    @model_validator(mode="after")
    def _classes_are_counted(self) -> EvaluationReport:
        # A class with an AP but no count would silently escape the per-class gate.
        for who, scores in (("challenger", self.challenger), ("champion", self.champion)):
            uncounted = sorted(set(scores.per_class) - set(self.class_instances)) if scores else []
            if uncounted:
                raise ValueError(f"{who}.per_class names classes missing from class_instances: {uncounted}")
        if any(n < 0 for n in self.class_instances.values()):
            raise ValueError("class_instances must not be negative")
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
