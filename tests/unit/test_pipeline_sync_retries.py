"""A retried ``.sync`` job whose first CreateTrainingJob / CreateProcessingJob answer was lost.

The job started; the lost answer is tried again (tests/unit/test_pipeline_fail_fast.py: the retry loop of
the ``.sync`` creates; the lost answer is ``SageMaker.SdkClientException``), and the retry is refused because
its name is taken (``SageMaker.ResourceInUseException``: SageMaker models it, so the optimised integration
keeps its name).
The run then waits for the job it started and goes on exactly as the ``.sync`` state would have: the
same result in the same place on success, the same error and Cause on failure. Mock cases in
tests/fixtures/pipeline/training_pipeline.mock.json; the offline runtime's version with real jobs is
tests/integration/test_offline_sync_job_retries.py.
"""

from __future__ import annotations

import json

from d2ops import template as sam
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import entered_states, run_case, state_output, task_parameters

STATES = all_states(json.loads(support.DEFINITION.read_text()))
# Step Functions' execution history holds at most 25,000 events.
HISTORY_LIMIT = 25_000
# Events one pass of a wait loop writes: Wait (entered, exited), Pass (entered, exited), Task (entered,
# scheduled, started, succeeded, exited), Choice (entered, exited).
EVENTS_PER_CHECK = 11


def _bound(kind: str) -> tuple[int, int]:
    """(checks, seconds between checks) of the wait loop for the created job."""
    (rule,) = [r for r in STATES[f"Created {kind} job is ours?"]["Choices"] if r.get("Next", "").startswith("Wait")]
    checks = next(c["NumericLessThan"] for c in rule["And"] if "NumericLessThan" in c)
    return checks, STATES[f"Wait for created {kind} job"]["Seconds"]


def test_the_wait_outlasts_the_longest_job_and_fits_the_history() -> None:
    support.function_path("prepare_training")
    from prepare_training.service import EVALUATION_MAX_SECONDS

    max_training = int(sam.load_template().document["Parameters"]["MaxTrainingSeconds"]["MaxValue"])
    checks, seconds = _bound("training")
    assert checks * seconds >= 2 * max_training  # spot: MaxWaitTimeInSeconds = 2 x MaxRuntimeInSeconds
    assert checks * EVENTS_PER_CHECK < 0.7 * HISTORY_LIMIT  # room for the rest of the run
    checks, seconds = _bound("evaluation")
    assert checks * seconds >= EVALUATION_MAX_SECONDS and checks * EVENTS_PER_CHECK < 0.1 * HISTORY_LIMIT


def test_only_a_name_in_use_leads_to_the_created_job() -> None:
    """Mutation caught: the Catch on the old catch-all name only (a ResourceInUseException would fall to
    States.ALL and record a training failure while the job trains on)."""
    for sync, choice in (("Train model", "Training job already created?"),
                         ("Evaluate challenger and champion", "Evaluation job already created?")):
        catchers = STATES[sync]["Catch"]
        assert [c["ErrorEquals"] for c in catchers] == [
            ["SageMaker.ResourceInUseException", "SageMaker.AmazonSageMakerException", "SageMaker.SdkClientException"],
            ["States.ALL"]]
        assert catchers[0]["Next"] == choice and catchers[0]["ResultPath"] == catchers[1]["ResultPath"] == "$.error"
        # Any other service error fails as before, unless it may pass on a retry (test_pipeline_fail_fast.py).
        assert STATES[STATES[choice]["Default"]]["Default"] == catchers[1]["Next"]
        (taken,) = STATES[choice]["Choices"]
        assert taken["Variable"] == "$.error.Error" and taken["StringEquals"] == "SageMaker.ResourceInUseException"
        assert taken["Next"].startswith("Start waiting for created")


def test_jobs_retried_after_lost_responses_wait_for_the_jobs_they_started() -> None:
    ex = run_case("JobsRetriedAfterLostResponses")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    normal = run_case("FirstDeployment")
    states = entered_states(ex)
    # Lost once, then refused once as a name in use: 2 requests, one name.
    for sync, name in (("Train model", "TrainingJobName"), ("Evaluate challenger and champion", "ProcessingJobName")):
        sent = task_parameters(ex, sync)
        assert len(sent) == 2 and len({p[name] for p in sent}) == 1
    # The lost answer may pass on a retry; the retry finds the name taken and waits for the job.
    i = states.index("Training job already created?")
    assert states[i:i + 8] == [
        "Training job already created?", "Retry creating training job?", "Training job creation retries left?",
        "Start retrying training job creation", "Wait to retry creating training job",
        "Count training job creation retry", "Train model", "Training job already created?"]
    i += 7
    assert states[i:i + 10] == [
        "Training job already created?", "Start waiting for created training job", "Check created training job",
        "Created training job is ours?", "Wait for created training job", "Count created training job check",
        "Check created training job", "Created training job is ours?", "Read created training job",
        "Evaluate challenger and champion"]
    (described,) = {json.dumps(p) for p in task_parameters(ex, "Check created training job")}
    assert json.loads(described) == {"TrainingJobName": "shapes-v1-bf3cc289798108cc-train"}
    assert states.count("Check created evaluation job") == 2 and "Read created evaluation job" in states
    # What later states read is what the .sync states would have given them.
    assert state_output(ex, "Read created training job")["training"] == state_output(normal, "Train model")["training"]
    assert (state_output(ex, "Read created evaluation job")["evaluation_job"]
            == state_output(normal, "Evaluate challenger and champion")["evaluation_job"])
    assert ex.output["gate"] == normal.output["gate"]


def test_a_created_training_job_that_failed_fails_the_run_as_the_sync_state_does() -> None:
    ex = run_case("CreatedTrainingJobFailed")
    normal = run_case("TrainingFailed")
    assert (ex.status, ex.error, ex.cause) == ("FAILED", "TrainingFailed", normal.cause)
    error = state_output(ex, "Read created training job failure")["error"]
    assert error["Error"] == "States.TaskFailed"
    assert json.loads(error["Cause"])["FailureReason"] == json.loads(
        state_output(normal, "Record training failure")["error"]["Cause"])["FailureReason"]
    assert "Evaluate challenger and champion" not in entered_states(ex)


def test_a_created_evaluation_job_that_failed_fails_the_run_as_the_sync_state_does() -> None:
    ex = run_case("CreatedEvaluationJobFailed")
    normal = run_case("EvaluationFailed")
    assert (ex.status, ex.error, ex.cause) == ("FAILED", "EvaluationFailed", normal.cause)
    assert "Read evaluation report" not in entered_states(ex)


def test_a_name_taken_by_a_job_that_is_not_ours_fails_the_training() -> None:
    ex = run_case("TrainingJobNameTakenByAnother")
    assert (ex.status, ex.error) == ("FAILED", "TrainingFailed")
    # The people-facing cause says why: the name is taken (by what, the ARN).
    assert "Training job names must be unique" in ex.cause and "training-job/shapes-v1-" in ex.cause
    # Not "training job ... failed": this run's job was never created.
    assert ex.cause.startswith("SageMaker refused to create training job shapes-v1-bf3cc289798108cc-train "
                               "(SageMaker.ResourceInUseException): ")
    states = entered_states(ex)
    assert "Wait for created training job" not in states and "Read created training job" not in states


def test_the_sync_creates_keep_sagemakers_modelled_names_and_share_one_for_the_rest() -> None:
    """Why the .sync creates retry through a Choice on the Cause, not a Retry (docs/pipeline.md): SageMaker's
    modelled errors keep their names (a name in use, a quota), but throttling, 5xx, validation and access
    refusals are all AmazonSageMakerException, and a retrier matches names only."""
    from d2ops import aws_contract

    for sync in ("Train model", "Evaluate challenger and champion"):
        integration = aws_contract.parse_resource(STATES[sync]["Resource"].replace("${Partition}", "aws"))
        modelled = aws_contract.modelled_errors(integration.service, integration.operation)
        assert {"ResourceInUse", "ResourceLimitExceeded"} <= modelled
        assert aws_contract.possible_errors(integration) == {f"SageMaker.{name}Exception" for name in modelled} | {
            "SageMaker.AmazonSageMakerException", "SageMaker.SdkClientException"}
        assert "Retry" not in STATES[sync]
