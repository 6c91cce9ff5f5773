"""What people read about a failed run is one line without a stack trace (issue 10).

d2ops_core.failures turns any Cause a Catch can hold into one bounded line; the describe_failure
Lambda puts it into the run's failure record before the notification goes out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from d2ops_core.failures import MAX_LINE_CHARS, describe, one_line, reason
from tests.fixtures.pipeline import support

support.function_path("describe_failure")
from describe_failure import handler as describe_handler  # noqa: E402

TRACE = """Traceback (most recent call last):
  File "/var/task/validate_dataset/handler.py", line 30, in handler
    summary = validate_dataset(event)
  File "/opt/python/d2ops/validation/coco.py", line 212, in check_split
    width = int(value)
OverflowError: cannot convert float infinity to integer"""


def lambda_cause(message: str, kind: str = "ValidationFailed") -> str:
    return json.dumps({"errorMessage": message, "errorType": kind, "requestId": "c0ffee",
                       "stackTrace": ['  File "/var/task/x/handler.py", line 3, in handler\n    raise X()\n']})


@pytest.mark.parametrize(("cause", "expected"), [
    (lambda_cause("s3://b/datasets/a/v1/manifest.json does not exist"),
     "s3://b/datasets/a/v1/manifest.json does not exist"),
    (lambda_cause("3 validation errors for Plan\ngate.min_map\n  Input should be a valid number"),
     "3 validation errors for Plan gate.min_map Input should be a valid number"),
    (json.dumps({"TrainingJobName": "j", "TrainingJobStatus": "Failed",
                 "FailureReason": "AlgorithmError: CUDA out of memory"}), "AlgorithmError: CUDA out of memory"),
    (json.dumps({"TrainingJobName": "j", "TrainingJobStatus": "Stopped"}), "status Stopped"),
    ("Could not find endpoint \"d2ops-detector\". (Service: SageMaker, Status Code: 400)",
     "Could not find endpoint \"d2ops-detector\". (Service: SageMaker, Status Code: 400)"),
    (f"validation crashed\n{TRACE}", "validation crashed OverflowError: cannot convert float infinity to integer"),
    ('{"errorMessage": "truncated', '{"errorMessage": "truncated'),  # not JSON after all: kept as text
    ("", None),
    (None, None),
])
def test_the_reason_is_the_message_without_the_trace(cause: str | None, expected: str | None) -> None:
    assert reason(cause) == expected


def test_a_cause_nested_beyond_json_is_kept_as_text() -> None:
    """json.loads raised RecursionError on it, out of the failure-describing step itself."""
    cause = '{"errorMessage": ' + "[" * 100_000 + "]" * 100_000 + "}"
    got = reason(cause)
    assert got is not None and got.startswith('{"errorMessage": [[[') and len(got) <= MAX_LINE_CHARS


def test_a_long_message_is_cut_to_one_bounded_line() -> None:
    line = describe("training job j failed (States.TaskFailed)", lambda_cause("x" * 50_000))
    assert len(line) == MAX_LINE_CHARS and line.endswith("…") and line.startswith("training job j failed")


@given(summary=st.text(max_size=300), cause=st.one_of(st.none(), st.text(max_size=2000),
                                                      st.builds(lambda_cause, st.text(max_size=2000))))
def test_any_cause_becomes_one_line_without_a_trace(summary: str, cause: str | None) -> None:
    line = describe(summary, cause)
    assert "\n" not in line and "\r" not in line and len(line) <= MAX_LINE_CHARS
    assert "Traceback (most recent call last)" not in line and '"stackTrace"' not in line
    assert line == one_line(line)  # already one line: describing is stable


def invoke(document: dict[str, Any]) -> dict[str, Any]:
    return dict(describe_handler.handler(document, support.FakeLambdaContext()))


def test_the_lambda_rewrites_only_the_failure_cause() -> None:
    event = support.load_event("describe_failure", "lambda_error")
    out = invoke(json.loads(json.dumps(event)))
    assert out["failure"]["cause"] == (
        "evaluation job shapes-v1-bf3cc289798108cc-eval failed (EvaluationReportInvalid): s3://d2ops-artifacts-example"
        "/runs/shapes_v1_bf3cc289798108cc/evaluation/evaluation.json: challenger.metrics: Field required")
    assert {k: v for k, v in out.items() if k != "failure"} == {k: v for k, v in event.items() if k != "failure"}
    assert {k: v for k, v in out["failure"].items() if k != "cause"} == \
        {k: v for k, v in event["failure"].items() if k != "cause"}


def test_a_record_without_a_caught_error_keeps_its_summary() -> None:
    event = support.load_event("describe_failure", "lambda_error")
    del event["error"]
    assert invoke(event)["failure"]["cause"] == event["failure"]["cause"]


# ------------------------------------------------------- a job SageMaker refused to create (issue 31)
IN_USE = ("Training job names must be unique within an AWS account and region, and a training job with this name "
          "already exists (arn:aws:sagemaker:us-east-1:123456789012:training-job/j) (Service: AmazonSageMaker; "
          "Status Code: 400; Error Code: ResourceInUse; Request ID: 5e3c1a0b; Proxy: null)")


@pytest.mark.parametrize(("error", "cause", "expected"), [
    ("SageMaker.ResourceInUseException", IN_USE,
     "SageMaker refused to create training job j (SageMaker.ResourceInUseException): Training job names must be "
     "unique within an AWS account and region, and a training job with this name already exists "
     "(arn:aws:sagemaker:us-east-1:123456789012:training-job/j)"),
    ("SageMaker.AmazonSageMakerException",
     "Rate exceeded (Service: AmazonSageMaker; Status Code: 400; Error Code: ThrottlingException; Request ID: 5e)",
     "SageMaker refused to create training job j (SageMaker.AmazonSageMakerException): Rate exceeded"),
])
def test_a_refused_create_is_not_called_a_failed_job(error: str, cause: str, expected: str) -> None:
    """Mutation caught: the summary's "training job j failed" kept for a job SageMaker never created."""
    assert describe(f"training job j failed ({error})", cause, error=error) == expected


def test_a_job_that_ran_or_may_have_started_is_still_called_failed() -> None:
    job = json.dumps({"TrainingJobName": "j", "TrainingJobStatus": "Failed", "FailureReason": "AlgorithmError: OOM"})
    assert describe("training job j failed (States.TaskFailed)", job, error="States.TaskFailed") == \
        "training job j failed (States.TaskFailed): AlgorithmError: OOM"
    # A lost answer past its retries may have started the job; a Describe…Job error comes after one that did.
    for error in ("SageMaker.SdkClientException", "SageMaker.SageMakerException"):
        assert describe(f"training job j failed ({error})", "x", error=error).startswith("training job j failed")


def test_the_create_refusals_are_errors_only_the_sync_creates_report() -> None:
    """CREATE_REFUSALS (d2ops_core, standard library only) held to d2ops.aws_contract: each is an error the .sync
    creates can report, and none one the aws-sdk Describe…Job calls of the same stage can."""
    from d2ops import aws_contract
    from d2ops_core.failures import CREATE_REFUSALS

    for job in ("TrainingJob", "ProcessingJob"):
        create = aws_contract.possible_errors(
            aws_contract.parse_resource(f"arn:aws:states:::sagemaker:create{job}.sync"))
        describe_job = aws_contract.possible_errors(
            aws_contract.parse_resource(f"arn:aws:states:::aws-sdk:sagemaker:describe{job}"))
        assert create >= CREATE_REFUSALS and not CREATE_REFUSALS & describe_job, job
