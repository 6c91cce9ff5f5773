"""The summarize Lambda's input and output; the documents it reads are d2ops_core.documents.evaluation's."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from d2ops_core.documents.evaluation import GateThresholds
from d2ops_core.gate_decision import GateVerdict


class DatasetLabel(BaseModel):
    """The run's ``$.dataset`` as far as the Model Registry description needs it (from the S3 key: any text)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    version: str


class SummarizeEvent(BaseModel):
    report_uri: str = Field(pattern=r"^s3://")
    gate: GateThresholds
    dataset: DatasetLabel


class EvaluationSummary(GateVerdict):
    """The gate's verdict (d2ops_core.gate_decision, the decision made once) and what the pipeline's later
    states need beside it: the report's location, the challenger's metrics and the registry's texts."""

    report_uri: str
    challenger_metrics: dict[str, float]
    champion_floor: float = Field(description="champion_value - max_regression (0 without a champion): where the "
                                              "point estimate alone would put the bar; the gate judges the interval")
    class_gate_description: str = Field(
        description="class_gate_reason fit for the Model Registry: characters SageMaker refuses replaced, cut to "
                    "what the description has room for with an ellipsis and the count of characters left out")
    description_head: str = Field(description="'<dataset name> <version>: ' cleaned and bounded the same way: "
                                              "the start of every registry description")
    gate_description: str = Field(description="gate_reason fit for the Model Registry, bounded like "
                                              "class_gate_description")
    score_thresholds: str = Field(
        min_length=1, description="the challenger's per-class score thresholds as one registry metadata value "
                                  "(d2ops_core.score_thresholds.registry_value: name=score words, at most 256 "
                                  "characters; the full map is the artifact's metadata.json)")
