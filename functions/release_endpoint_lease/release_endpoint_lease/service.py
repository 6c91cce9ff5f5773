"""After a pipeline execution ends: release the endpoint lease if, and only if, the execution still
holds it; after an abnormal end (stopped, timed out, failed) also stop the run's SageMaker jobs still
running, as a ``.sync`` state would have."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from d2ops_core import run_ids, s3_layout, sagemaker_jobs
from release_endpoint_lease.models import (
    ABNORMAL_END_STATUSES,
    ENDED_STATUSES,
    HOLDER_ATTRIBUTE,
    KEY_ATTRIBUTE,
    ExecutionStatusChange,
    JobStop,
    ReleaseResult,
)


def release_lease(dynamodb: Any, table: str, endpoint_name: str, holder: str) -> bool:
    """Delete the lease item when ``holder`` holds it; False when it does not (released, or another run's)."""
    try:
        dynamodb.delete_item(TableName=table, Key={KEY_ATTRIBUTE: {"S": endpoint_name}},
                             ConditionExpression="#holder = :holder",
                             ExpressionAttributeNames={"#holder": HOLDER_ATTRIBUTE},
                             ExpressionAttributeValues={":holder": {"S": holder}})
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise  # throttling or access: fail so Lambda retries the event (then dead-letters it)
    return True


def _status(kind: sagemaker_jobs.JobKind, described: dict[str, Any]) -> str:
    return str(described.get("TrainingJobStatus" if kind == "training" else "ProcessingJobStatus"))


def stop_job(sagemaker: Any, kind: sagemaker_jobs.JobKind, name: str, output_uri: str) -> JobStop:
    """Stop the job ``name`` if it is this run's (it writes to ``output_uri``) and still InProgress.

    Idempotent: a job already Stopping/Stopped/Completed/Failed, or none of that name, is left as it
    is. Any other error propagates: Lambda retries the event twice, then dead-letters it.
    """
    described = sagemaker_jobs.describe_job(sagemaker, kind, name)
    if described is None:  # the run never got that far
        return JobStop(kind=kind, name=name, action="not-found")
    status = _status(kind, described)
    if sagemaker_jobs.described_job_output(described) != output_uri:  # another stack's job of the same name
        return JobStop(kind=kind, name=name, action="not-ours", status=status)
    if status != "InProgress":
        return JobStop(kind=kind, name=name, action="not-running", status=status)
    try:
        if kind == "training":
            sagemaker.stop_training_job(TrainingJobName=name)
        else:
            sagemaker.stop_processing_job(ProcessingJobName=name)
    except ClientError as exc:
        # It may have ended between the Describe and the Stop (SageMaker then refuses the stop with
        # ValidationException): look again rather than fail a delivery that has nothing left to do.
        if exc.response.get("Error", {}).get("Code") not in ("ValidationException", "ResourceNotFound"):
            raise
        again = sagemaker_jobs.describe_job(sagemaker, kind, name)
        if again is not None and _status(kind, again) == "InProgress":
            raise
        return JobStop(kind=kind, name=name, action="not-running",
                       status=None if again is None else _status(kind, again))
    return JobStop(kind=kind, name=name, action="stopped", status=status)


def stop_run_jobs(sagemaker: Any, artifacts_bucket: str, run_id: str) -> list[JobStop]:
    """The run's training and evaluation jobs (names from d2ops_core.run_ids, outputs from
    d2ops_core.s3_layout), stopped if running."""
    return [
        stop_job(sagemaker, "training", run_ids.sagemaker_name(run_id, run_ids.TRAINING_JOB_SUFFIX),
                 s3_layout.training_output_uri(artifacts_bucket, run_id)),
        stop_job(sagemaker, "processing", run_ids.sagemaker_name(run_id, run_ids.EVALUATION_JOB_SUFFIX),
                 s3_layout.evaluation_output_uri(artifacts_bucket, run_id)),
    ]


def handle_status_change(event: ExecutionStatusChange, dynamodb: Any, table: str, endpoint_name: str,
                         sagemaker: Any, artifacts_bucket: str) -> ReleaseResult:
    detail = event.detail
    if detail.status not in ENDED_STATUSES:  # RUNNING, PENDING_REDRIVE: the run may still need its lease
        return ReleaseResult(execution_arn=detail.executionArn, endpoint_name=endpoint_name, status=detail.status,
                             action="still-running")
    jobs: list[JobStop] = []
    try:
        if detail.status in ABNORMAL_END_STATUSES:
            jobs = stop_run_jobs(sagemaker, artifacts_bucket, detail.name)  # the execution name is the run id
    finally:  # the lease goes back even when a stop failed (that error still fails the delivery)
        released = release_lease(dynamodb, table, endpoint_name, detail.executionArn)
    return ReleaseResult(execution_arn=detail.executionArn, endpoint_name=endpoint_name, status=detail.status,
                         action="released" if released else "not-held", jobs=jobs)
