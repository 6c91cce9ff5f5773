"""``report/pr_curves.json``: the evaluation job's precision-recall curves as numbers.

The evaluation job writes it beside ``pr_curves.png`` (``model_code.evaluation.report``); the
status API serves it with the evaluation report so the console can draw the curves itself.
Precision is sampled at COCO's 101 recall points; ``None`` where COCO leaves it undefined (-1).

Standard library and pydantic only: the status API Lambda imports this through the CoreLayer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

RECALL_POINTS = [round(i / 100, 2) for i in range(101)]
PR_CURVES_NAME = "pr_curves.json"


class PrCurve(BaseModel):
    iou50: list[float | None] = Field(min_length=101, max_length=101, description="precision at IoU 0.5")
    iou50_95: list[float | None] = Field(min_length=101, max_length=101,
                                         description="precision averaged over IoU 0.5:0.95")


class PrCurves(BaseModel):
    recall: list[float] = Field(default_factory=lambda: list(RECALL_POINTS))
    curves: dict[str, dict[str, dict[str, PrCurve]]] = Field(
        description="model (challenger, champion) -> IoU type (bbox, segm) -> class name -> curve")


def from_precisions(models: dict[str, dict[str, dict[str, dict[str, list[float]]]]]) -> PrCurves:
    """COCOeval-style precisions (-1 where undefined) -> the document (4 decimals: it stays small)."""

    def clean(values: list[float]) -> list[float | None]:
        return [round(float(v), 4) if v >= 0 else None for v in values]

    return PrCurves(curves={who: {iou: {name: PrCurve(iou50=clean(c["iou50"]), iou50_95=clean(c["iou50_95"]))
                                        for name, c in classes.items()}
                                  for iou, classes in per_iou.items()}
                            for who, per_iou in models.items()})
