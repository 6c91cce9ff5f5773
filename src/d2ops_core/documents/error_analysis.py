"""``report/errors.json``: where a model goes wrong on the val split, for the challenger beside the champion.

The evaluation job writes it beside ``pr_curves.json`` (``model_code.evaluation.errors`` computes it,
``model_code.evaluation.report`` writes it); the status API serves it with the evaluation report and
the console draws it. Three views, each bounded whatever the dataset's size:

- **AP by object size**: COCO's APs/APm/APl (area under 32², 32²-96², over 96² pixels), overall and
  per class, from the same COCOeval run as the report's metrics.
- **Confusion matrix with background**, at IoU 0.5 on boxes, counting only detections whose score is
  at least their class's threshold (the artifact's ``score_thresholds``, else 0.5). Rows are the true
  class, columns the predicted class; the row ``background`` holds false positives (a detection on no
  object), the column ``background`` missed objects. Matching: detections by descending score, each
  takes the unmatched object of its own class with the highest IoU >= 0.5 (COCO's greedy rule; a
  detection on a crowd region of its class is ignored, as COCO ignores it); a detection left over then
  takes the unmatched object of another class with the highest IoU >= 0.5 (a confusion, off the
  diagonal); what is left is background. A class row therefore sums to the class's non-crowd objects.
- **The worst val images**, ranked by :data:`ERROR_SCORE_RULE`, drawn (true against predicted boxes)
  for every model, the challenger's worst first.

Standard library and pydantic only: the status API Lambda imports this through the CoreLayer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

# The threshold of a class the artifact has none for: the one fallback, shared with serving (re-exported here).
from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD

ERRORS_NAME = "errors.json"
BACKGROUND = "background"
OTHER_CLASSES = "(other classes)"
IOU_THRESHOLD = 0.5
MAX_MATRIX_CLASSES = 30  # beyond it, the classes with the most errors are kept and the rest folded together
MAX_WORST_IMAGES = 8
MAX_THUMBNAIL_CHARS = 150_000  # one drawn picture as a data URI; the gallery's whole size stays under ~2.5 MB
ERROR_SCORE_RULE = ("missed objects + false positives + confusions (a detection on an object of another "
                    "class), each counting 1 at IoU 0.5 and the class's score threshold; ties: the higher "
                    "summed score of the wrong detections (confident mistakes first), then val order")
# The drawn pictures' colours (model_code.evaluation.report draws them; the console prints this legend).
LEGEND = {"#00c000": "true object found", "#ffd700": "true object missed", "#1e90ff": "correct detection",
          "#ff8c00": "detection of the wrong class", "#ff0000": "false positive"}


class SizeAP(BaseModel):
    """COCO AP (a fraction) on objects of one size range; None where the split has no such object."""

    small: float | None = Field(None, description="area < 32² px (COCO's APs)")
    medium: float | None = Field(None, description="32² <= area < 96² px (APm)")
    large: float | None = Field(None, description="area >= 96² px (APl)")


class ConfusionMatrix(BaseModel):
    labels: list[str] = Field(min_length=1, description=f"row and column labels in order; the last is {BACKGROUND!r} "
                              "(known by its place: a dataset may name a class 'background' too)")
    counts: list[list[int]] = Field(description="counts[i][j]: objects of labels[i] detected as labels[j]; row "
                                    f"{BACKGROUND!r}: false positives, column {BACKGROUND!r}: missed objects")
    folded: list[str] = Field(default_factory=list, description=f"classes summed into {OTHER_CLASSES!r} (over "
                              f"{MAX_MATRIX_CLASSES} classes: those with the fewest errors)")

    @model_validator(mode="after")
    def _square_with_background(self) -> ConfusionMatrix:
        if self.labels[-1] != BACKGROUND:
            raise ValueError(f"the last label must be {BACKGROUND!r}")
        if len(self.counts) != len(self.labels) or any(len(row) != len(self.labels) for row in self.counts):
            raise ValueError(f"counts must be {len(self.labels)} x {len(self.labels)}")
        if self.counts[-1][-1] != 0:
            raise ValueError("background predicted as background is not counted")
        return self


class ImageErrors(BaseModel):
    image_id: int
    file_name: str
    objects: int = Field(ge=0, description="non-crowd true objects")
    correct: int = Field(ge=0, description="detections on an object of their class")
    confused: int = Field(ge=0, description="detections on an object of another class")
    missed: int = Field(ge=0, description="objects no detection took")
    false_positives: int = Field(ge=0, description="detections on no object (duplicates included)")
    error_score: int = Field(ge=0, description="missed + false_positives + confused")
    wrong_score_sum: float = Field(ge=0, description="summed scores of the false positives and confusions")


class ErrorTotals(BaseModel):
    objects: int = Field(ge=0)
    detections: int = Field(ge=0, description="at or above their class's threshold, crowd-ignored ones left out")
    correct: int = Field(ge=0)
    confused: int = Field(ge=0)
    missed: int = Field(ge=0)
    false_positives: int = Field(ge=0)


class ModelErrors(BaseModel):
    score_thresholds: dict[str, float] = Field(description="class name -> the score a detection needs to count")
    thresholds_from: Literal["artifact", "default"] = Field(
        description=f"the artifact's score_thresholds, or {DEFAULT_SCORE_THRESHOLD} for every class")
    ap_by_size: dict[str, SizeAP] = Field(description="IoU type (bbox, segm) -> AP by object size, all classes")
    per_class_ap_by_size: dict[str, dict[str, SizeAP]] = Field(
        default_factory=dict, description="IoU type -> class name -> AP by object size")
    confusion: ConfusionMatrix
    totals: ErrorTotals
    worst_images: list[ImageErrors] = Field(max_length=MAX_WORST_IMAGES,
                                            description="this model's worst val images, worst first")


class GalleryImage(BaseModel):
    """One of the challenger's worst val images, drawn for every model (true boxes against predicted)."""

    image_id: int
    file_name: str
    errors: dict[str, ImageErrors] = Field(description="model -> its errors on this image")
    pictures: dict[str, str] = Field(description="model -> the drawn picture, relative to the report folder")
    thumbnails: dict[str, str] = Field(
        default_factory=dict, description="model -> the drawn picture, smaller, as a data:image/jpeg;base64 URI "
        "(for readers that cannot reach the report folder: the console)")

    @model_validator(mode="after")
    def _bounded(self) -> GalleryImage:
        for who, uri in self.thumbnails.items():
            if not uri.startswith("data:image/") or len(uri) > MAX_THUMBNAIL_CHARS:
                raise ValueError(f"thumbnail of {who!r}: a data:image URI of at most {MAX_THUMBNAIL_CHARS} characters")
        return self


class ErrorAnalysis(BaseModel):
    iou_threshold: float = IOU_THRESHOLD
    error_score: str = ERROR_SCORE_RULE
    legend: dict[str, str] = Field(
        default_factory=lambda: dict(LEGEND), description="what each colour of the drawn pictures means")
    models: dict[str, ModelErrors] = Field(description="challenger, and champion when the run has one")
    gallery: list[GalleryImage] = Field(default_factory=list, max_length=MAX_WORST_IMAGES)

    @model_validator(mode="after")
    def _challenger_first(self) -> ErrorAnalysis:
        if "challenger" not in self.models:
            raise ValueError("the challenger's errors are required")
        return self
