"""A run's SageMaker training and processing jobs as its readers find them: described by name, missing
told apart from other errors, and known to be the run's by where they write.

Recognised by the botocore ``ClientError``'s ``response["Error"]`` dict, so the core needs no botocore.
"""

from __future__ import annotations

from typing import Any, Literal

JobKind = Literal["training", "processing"]
# SageMaker's API model names no not-found error for Describe/Stop of a job: it answers a name it
# does not know with ValidationException ("Requested resource not found", "Could not find requested
# job with name ...", moto: "Could not find training job '...'"); ResourceNotFound where it does.
_MISSING_PHRASES = ("not found", "could not find", "does not exist")


def is_missing_job(exc: BaseException) -> bool:
    """Whether a SageMaker client error says the job does not exist (and nothing else: throttling,
    access denied, other validation errors are not "missing")."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    if not isinstance(error, dict):
        return False
    code, message = error.get("Code"), str(error.get("Message") or "").lower()
    return code == "ResourceNotFound" or (
        code == "ValidationException" and any(phrase in message for phrase in _MISSING_PHRASES))


def describe_job(sagemaker: Any, kind: JobKind, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob / DescribeProcessingJob of ``name``; None when no job of that name exists.

    Every other error (throttling, access denied) propagates: the caller decides whether the answer
    can do without the job. ``sagemaker`` is a boto3 SageMaker client (or one with the same methods).
    """
    try:
        if kind == "training":
            return dict(sagemaker.describe_training_job(TrainingJobName=name))
        return dict(sagemaker.describe_processing_job(ProcessingJobName=name))
    except Exception as exc:
        if is_missing_job(exc):
            return None
        raise


def described_job_output(described: dict[str, Any]) -> str | None:
    """Where the job of a DescribeTrainingJob/DescribeProcessingJob answer writes (None if it says nothing).

    A job is this run's when this equals the run's output URI (d2ops_core.s3_layout's
    training_output_uri / evaluation_output_uri): the rule the state machine's "Created … job is ours?"
    applies to the same two fields, and the release function before it stops a job. Names alone do not
    prove it: another stack may use the same SageMaker name.
    """
    if "TrainingJobName" in described:
        uri = (described.get("OutputDataConfig") or {}).get("S3OutputPath")
    else:
        outputs = (described.get("ProcessingOutputConfig") or {}).get("Outputs") or [{}]
        uri = (outputs[0].get("S3Output") or {}).get("S3Uri")
    return uri if isinstance(uri, str) else None
