"""The evaluation.json documents: one model's (in the artifact) and the processing job's report.

Shapes are fixed by docs/model-artifact.md and interfaces.md; AP values are fractions in
[0, 1]. A metric COCO cannot define on this split (no ground truth in an area range) is
left out rather than written as -1, so every number present is a real AP.
"""

from __future__ import annotations

from typing import Any, Literal

from model_code.evaluation.coco import Evaluation

PrimaryMetric = Literal["bbox_AP", "segm_AP"]


def primary_metric_for(task: str) -> PrimaryMetric:
    return "segm_AP" if task == "instance_segmentation" else "bbox_AP"


def model_evaluation_document(evaluation: Evaluation, primary: PrimaryMetric, *, iteration: int | None = None
                              ) -> dict[str, Any]:
    doc: dict[str, Any] = {"primary_metric": primary, "val_images": evaluation.val_images, **evaluation.summary()}
    if iteration is not None:
        doc["iteration"] = iteration
    return doc


def job_report(primary: PrimaryMetric, challenger: Evaluation, champion: Evaluation | None) -> dict[str, Any]:
    """What the evaluation processing job writes and the pipeline's gate reads."""
    return {"primary_metric": primary, "val_images": challenger.val_images,
            "challenger": challenger.summary(), "champion": champion.summary() if champion else None}
