"""A finished training job's progress, kept in S3 after one CloudWatch read (d2ops_core.documents.training_curve).

``GET /runs/{runId}`` used to call GetMetricData on every request, for finished runs as well, whose
curve can no longer change. Now, for a job that ended at least :data:`SETTLE_SECONDS` ago, the first
request reads CloudWatch and stores what it read at ``runs/<run id>/training-curve.json``; later ones
read that instead. A running job (or one that ended moments ago) is always read from CloudWatch.

Races: two requests may both find nothing stored, both read CloudWatch and both write; the write is
conditional (``IfNoneMatch="*"``), so the first stays and the second's refusal is expected, and the
two documents would say the same anyway (the same ended job, its values all published). S3 never
shows a partly written object, and a stored document is used only when it validates, names the run's
job and the job has ended; anything else is read from CloudWatch again. Failing to read or store the
document never fails the answer: it falls back to CloudWatch (logged).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from d2ops_core import s3_layout, s3_probe
from d2ops_core.documents.training_curve import ENDED_STATUSES, TrainingCurve

# How long after a job ends its curve is taken as final. SageMaker publishes the values its metric
# definitions find in the job's log to CloudWatch as the log arrives, about once a minute; the last
# ones can land after DescribeTrainingJob already says the job ended. Ten minutes is a generous
# margin (a judgment, not a documented bound): until then every answer reads CloudWatch afresh.
SETTLE_SECONDS = 600
# Answers of a conditional PutObject when another request wrote (or is writing) the key first.
WRITTEN_BY_ANOTHER = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})

logger = Logger(child=True)


def settled(job: dict[str, Any], now: datetime) -> bool:
    """Whether the job ended at least SETTLE_SECONDS before ``now``: its published values are all there."""
    if job.get("TrainingJobStatus") not in ENDED_STATUSES:
        return False
    ended: datetime | None = job.get("TrainingEndTime") or job.get("LastModifiedTime")
    return ended is not None and (now - ended).total_seconds() >= SETTLE_SECONDS


class CurveStore:
    """The run's stored curve in the artifacts bucket."""

    def __init__(self, s3: Any, bucket: str, run_id: str) -> None:
        self.s3, self.bucket = s3, bucket
        self.key = s3_layout.training_curve_key(run_id)

    def load(self, job_name: str) -> TrainingCurve | None:
        """The stored curve of ``job_name``; None when there is none (or it cannot be used: logged)."""
        where = s3_layout.s3_uri(self.bucket, self.key)
        try:
            # Listed first: a GET of a missing key answers 403 to a role that lists only some prefixes.
            if not s3_probe.key_listed(self.s3, self.bucket, self.key):
                return None
            body = self.s3.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            logger.warning("stored training curve %s not read (reading CloudWatch instead): %s", where, exc)
            return None
        try:
            curve = TrainingCurve.model_validate_json(body)
        except ValidationError as exc:
            logger.warning("stored training curve %s is not a TrainingCurve (reading CloudWatch instead): %s",
                           where, exc.errors()[0]["msg"])
            return None
        if curve.job_name != job_name:
            logger.warning("stored training curve %s is job %s's, not %s's", where, curve.job_name, job_name)
            return None
        return curve

    def save(self, curve: TrainingCurve) -> None:
        """Store ``curve`` unless a curve is stored already (then that one stays)."""
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=curve.model_dump_json().encode(),
                               ContentType="application/json", IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in WRITTEN_BY_ANOTHER:
                logger.warning("training curve of %s not stored at %s: %s", curve.job_name,
                               s3_layout.s3_uri(self.bucket, self.key), exc)
        except BotoCoreError as exc:
            logger.warning("training curve of %s not stored: %s", curve.job_name, exc)
