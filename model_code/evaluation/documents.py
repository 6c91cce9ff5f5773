"""The evaluation.json documents: one model's (in the artifact) and the processing job's report.

Their shapes are the pydantic models in :mod:`d2ops_core.documents.evaluation`, which the readers
(``model_code.artifact``, the ``summarize_evaluation`` Lambda) import as well; this module only
fills them from an :class:`~model_code.evaluation.coco.Evaluation`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from d2ops_core.documents.evaluation import (
    Comparison,
    EvaluationReport,
    HeldOutImages,
    ModelEvaluation,
    ModelScores,
)
from d2ops_core.metrics import PrimaryMetric
from model_code.evaluation.scoring import Evaluation


def scores(evaluation: Evaluation) -> ModelScores:
    return ModelScores(metrics=evaluation.metrics, per_class=evaluation.per_class)


def model_evaluation_document(evaluation: Evaluation, primary: PrimaryMetric, *, iteration: int | None = None
                              ) -> dict[str, Any]:
    doc = ModelEvaluation(primary_metric=primary, val_images=evaluation.val_images, metrics=evaluation.metrics,
                          per_class=evaluation.per_class, iteration=iteration)
    return doc.model_dump(mode="json", exclude_none=True)


def class_instances(gt: dict[str, Any]) -> dict[str, int]:
    """Non-crowd ground-truth instances per class name (every category listed, 0 when it has none).

    Crowd regions are ignored by COCO's AP, so they do not make a class's AP trustworthy.
    """
    counts = Counter(int(a["category_id"]) for a in gt["annotations"] if not a.get("iscrowd"))
    return {str(c["name"]): counts.get(int(c["id"]), 0) for c in gt["categories"]}


def job_report(primary: PrimaryMetric, challenger: Evaluation, champion: Evaluation | None,
               instances: dict[str, int], comparison: Comparison | None = None,
               challenger_score_thresholds: dict[str, float] | None = None,
               held_out: HeldOutImages | None = None) -> dict[str, Any]:
    """What the evaluation processing job writes and the pipeline's gate reads (validated on the way out:
    a champion needs ``held_out`` and, where those images hold ground truth, the ``comparison``,
    model_code.evaluation.comparison.compare_models)."""
    report = EvaluationReport(primary_metric=primary, val_images=challenger.val_images, class_instances=instances,
                              challenger=scores(challenger), champion=scores(champion) if champion else None,
                              held_out=held_out, comparison=comparison,
                              challenger_score_thresholds=challenger_score_thresholds or {})
    return report.model_dump(mode="json")
