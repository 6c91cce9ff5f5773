"""What the endpoint's monitor compares and decides (issue 32; docs/monitoring.md).

- :class:`MonitoringBaseline`: ``runs/<run id>/evaluation/monitoring-baseline.json``. The model's own
  answers on its val split, summarised the way the monitor summarises captured traffic. The evaluation
  job writes it beside its report; once that run's model is deployed it is the baseline every window of
  capture is compared with.
- :class:`MonitoringWindow`: ``monitoring/<endpoint>/windows/<start>.json``. One window of capture
  (default an hour) compared with the baseline: one :class:`StatisticVerdict` per statistic, and the window's
  verdict. Written by the monitor (functions/monitor_endpoint); read by the status API
  (``GET /endpoint/monitoring``), the console and ``d2ops monitor``.

Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The statistics, by name. A distribution is compared with a two-sample Kolmogorov-Smirnov test; a
# rate (a class's detections per image, the low-confidence fraction) with the population stability
# index of its histogram. ``class_rate:<class name>`` is one statistic per class of the model.
DISTRIBUTIONS: tuple[str, ...] = ("score", "boxes_per_image", "box_area_fraction", "image_width", "image_height",
                                  "brightness")
LOW_CONFIDENCE = "low_confidence_fraction"
CLASS_RATE_PREFIX = "class_rate:"
TestName = Literal["ks", "psi"]
WindowVerdict = Literal["ok", "drifted", "too_few_records", "no_baseline"]


class MonitoringBaseline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    run_id: str = Field(description="the run whose model these are the answers of")
    class_names: list[str] = Field(description="the model's classes, in label order")
    images: int = Field(ge=0, description="val images the baseline was computed on")
    detections: int = Field(ge=0, description="detections the model answered on them (its own thresholds)")
    created_at: datetime
    distributions: dict[str, list[float]] = Field(
        description="statistic name (DISTRIBUTIONS) -> a sorted sample of its values (at most a few thousand, "
                    "subsampled deterministically)")
    class_rates: dict[str, list[float]] = Field(
        description="class name -> its detections in each baseline image (one value per image, same order for "
                    "every class)")
    low_confidence: list[float] = Field(
        description="each image's fraction of detections that are low-confidence (score below the class's "
                    "threshold plus the margin the monitor documents); empty images count 0")
    score_thresholds: dict[str, float] = Field(
        default_factory=dict, description="the model's own score threshold of each class (its artifact's); the "
                                          "low-confidence rule uses it where a captured answer names none")


class StatisticVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    statistic: str = Field(description="a DISTRIBUTIONS name, LOW_CONFIDENCE, or 'class_rate:<class>'")
    test: TestName
    value: float = Field(description="the test's statistic: KS D (0-1) or PSI (>= 0)")
    threshold: float = Field(description="the stack parameter's threshold the value is held against")
    p_value: float | None = Field(None, description="the difference's significance: the KS test's p-value; for PSI "
                                                   "the chi-square test of the window's bin counts against the "
                                                   "baseline's bin proportions")
    drifted: bool
    baseline: float | None = Field(None, description="the baseline's mean of the statistic, for the message")
    window: float | None = Field(None, description="the window's mean of the statistic, for the message")


class MonitoringWindow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    endpoint: str
    variant: str | None = None
    model_run_id: str | None = Field(None, description="the run whose model served the window (the baseline's)")
    window_start: datetime
    window_end: datetime
    records: int = Field(ge=0, description="captured invocations read in the window")
    unreadable: int = Field(0, ge=0, description="capture lines or images that could not be read, skipped")
    problems: list[str] = Field(default_factory=list,
                                description="one line per skipped item (file and line), at most 20")
    verdict: WindowVerdict
    statistics: list[StatisticVerdict] = Field(default_factory=list)
    computed_at: datetime

    @property
    def drifted_statistics(self) -> list[StatisticVerdict]:
        return [s for s in self.statistics if s.drifted]
