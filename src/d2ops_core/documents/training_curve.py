"""``runs/<run id>/training-curve.json``: a finished training job's progress and loss curve, kept once.

The status API answers ``GET /runs/{runId}`` with the training job's progress, read from the metric
values SageMaker published to CloudWatch (``status_api.service.training_progress``). While the job runs,
every request reads CloudWatch again; once the job has ended and its last values have had time to
arrive (``status_api.curve_store``), nothing can change any more, so the first request after that
writes what it read here and every later one reads it back instead of calling GetMetricData.

- :class:`TrainingProgress` (with :class:`LossPoint`): the answer's ``training.progress``.
- :class:`TrainingCurve`: the stored document, written by the status API (``IfNoneMatch="*"``: once)
  and read by it. Only an ended job's curve is a document: ``job_status`` cannot say the job runs.

Standard library and pydantic only (the Lambda layer).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# DescribeTrainingJob's TrainingJobStatus values after which the job publishes nothing new.
EndedStatus = Literal["Completed", "Failed", "Stopped"]
ENDED_STATUSES: frozenset[str] = frozenset({"Completed", "Failed", "Stopped"})


class LossPoint(BaseModel):
    iteration: int
    loss: float


class TrainingProgress(BaseModel):
    """Where the training job is, from the metric values SageMaker published to CloudWatch while it runs."""

    iteration: int = Field(description="the newest training iteration the job's metric lines named")
    total_iterations: int | None = Field(None, description="the run's iterations (max_iter)")
    fraction: float | None = Field(None, description="iteration / total_iterations, 0 to 1")
    loss: float | None = Field(None, description="train:loss, mean of the newest period")
    learning_rate: float | None = Field(None, description="train:lr, mean of the newest period")
    images_per_second: float | None = None
    seconds_per_iteration: float | None = Field(None, description="train:iter_seconds, mean of the newest period")
    seconds_left: float | None = Field(None, description="iterations left x seconds per iteration (a running job)")
    updated_at: str = Field(description="the newest period with a value (CloudWatch publishes about once a minute)")
    period_seconds: int = Field(description="each loss_series point is the mean loss of one period of this length")
    loss_series: list[LossPoint] = Field(
        default_factory=list, description="the loss curve, oldest first: one point per period, at most 200 "
                                          "(a longer curve is averaged over runs of neighbouring points)")


class TrainingCurve(BaseModel):
    """A training job's progress as it ended, read once from CloudWatch and kept for every later answer."""

    model_config = ConfigDict(extra="forbid")

    job_name: str = Field(min_length=1, description="the run's training job (a stored curve of another job is not "
                                                    "this run's and is ignored)")
    job_status: EndedStatus = Field(description="TrainingJobStatus when the curve was stored: always an ended one")
    job_ended_at: datetime | None = Field(description="the job's TrainingEndTime (None: SageMaker did not say)")
    stored_at: datetime = Field(description="when the status API read CloudWatch and stored this")
    progress: TrainingProgress | None = Field(
        description="the job's progress and loss curve; None: the ended job published no training iteration")
