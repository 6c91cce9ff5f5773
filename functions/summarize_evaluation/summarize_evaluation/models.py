"""The summarize Lambda's input and output; the documents it reads are d2ops_core.documents.evaluation's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.documents.evaluation import DifferenceInterval, GateThresholds


class DatasetLabel(BaseModel):
    """The run's ``$.dataset`` as far as the Model Registry description needs it (from the S3 key: any text)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    version: str


class SummarizeEvent(BaseModel):
    report_uri: str = Field(pattern=r"^s3://")
    gate: GateThresholds
    dataset: DatasetLabel


class ClassRegression(BaseModel):
    """One class on which the challenger significantly trails the champion by more than the per-class margin:
    the upper end of the (Bonferroni-adjusted) interval of its AP difference is below -max_class_regression."""

    class_name: str
    metric: str = Field(description="the per-class AP compared: the run's primary metric, e.g. bbox_AP")
    challenger_ap: float
    champion_ap: float
    drop: float = Field(description="champion_ap - challenger_ap")
    instances: int = Field(description="non-crowd instances of the class on the val split")
    interval: DifferenceInterval = Field(description="the paired-bootstrap interval of challenger - champion")


# The gate's refusals, in the order the reason names them: the summary's booleans of the same names.
Refusal = Literal["below_min_map", "regressed", "class_regressed"]


class EvaluationSummary(BaseModel):
    """The gate's decision and the named numbers behind it (never positions in a list)."""

    report_uri: str
    primary_metric: str
    challenger_value: float
    challenger_metrics: dict[str, float]
    has_champion: bool
    champion_value: float | None
    champion_floor: float = Field(description="champion_value - max_regression (0 without a champion): where the "
                                              "point estimate alone would put the bar; the gate judges the interval")
    min_map: float
    max_regression: float
    max_class_regression: float | None
    min_class_instances: int | None
    refused_by: Refusal | None = Field(
        description="the decision, made once here: the first of below_min_map, regressed, class_regressed that "
                    "holds, or None when the model passes; the \"Quality gate\" Choice state branches on it")
    below_min_map: bool = Field(description="challenger_value < min_map")
    regressed: bool = Field(description="a champion exists and the upper end of the interval of challenger - champion "
                                        "is below -max_regression: the drop beyond the tolerance is significant")
    interval: DifferenceInterval | None = Field(
        description="the report's paired-bootstrap interval of challenger - champion on the primary metric "
                    "(None without a champion)")
    val_images: int = Field(ge=1, description="val images both models were scored on")
    resamples: int | None = Field(description="bootstrap resamples behind the interval (None without a champion)")
    more_val_images: int | None = Field(
        ge=1, description="when the interval is wider than the tolerance (half_width > max_regression > 0) and "
                          "straddles -max_regression (the decision is uncertain): about how many more val images "
                          "would narrow it to the tolerance, ceil(val_images * (half_width / max_regression)^2) - "
                          "val_images; None otherwise")
    class_regressed: bool = Field(description="true when class_regressions is not empty")
    class_regression_count: int = Field(ge=0, description="how many classes regressed (all of them)")
    class_regressions: list[ClassRegression] = Field(
        max_length=10, description="the worst of the classes with at least min_class_instances val instances whose "
                                   "AP dropped significantly by more than max_class_regression (the interval's "
                                   "upper end below -max_class_regression), worst first (at most 10: the state "
                                   "payload stays small whatever the number of classes)")
    class_gate_reason: str = Field(description="one line naming them (empty when none): the notification's and "
                                               "status API's reason, whole")
    class_gate_description: str = Field(
        description="class_gate_reason fit for the Model Registry: characters SageMaker refuses replaced, cut to "
                    "what the description has room for with an ellipsis and the count of characters left out")
    description_head: str = Field(description="'<dataset name> <version>: ' cleaned and bounded the same way: "
                                              "the start of every registry description")
    gate_reason: str = Field(description="the decision's reason, whole, quoting the interval: the notification's, "
                                         "the status API's and the run's cause")
    gate_description: str = Field(description="gate_reason fit for the Model Registry, bounded like "
                                              "class_gate_description")
    score_thresholds: str = Field(
        min_length=1, description="the challenger's per-class score thresholds as one registry metadata value "
                                  "(d2ops_core.score_thresholds.registry_value: name=score words, at most 256 "
                                  "characters; the full map is the artifact's metadata.json)")
