"""A `.sync` job whose CreateTrainingJob / CreateProcessingJob answer was lost, offline with real jobs.

The offline runtime injects the fault (``lost_responses``): the create reaches LocalSageMaker, the
job starts, and the task fails as a lost response does (``SageMaker.SdkClientException``). The retry
is then refused with SageMaker's own ``ResourceInUse`` ("... names must be unique ..."), which the
optimised integration reports under its own name, ``SageMaker.ResourceInUseException``, and the
pipeline's states wait for the job the first attempt started. So does a create answered with a 5xx
that did create its job (``failed_answers``). The same machine shows the other faults of issue 20's "fail fast": a
create throttled twice (``throttles``) is tried again and the run goes on; one over the offline
account's quota (d2ops.offline.quotas) ends the run at once. The machine is the pipeline's own
training and evaluation states (from the substituted definition) with what follows them stubbed; it
runs on the interpreter's virtual clock, so the retry waits cost no real time but show in the
history's timestamps. Jobs finish at once (no model is trained here).
"""

from __future__ import annotations

import copy
import functools
import json
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.asl.interpreter import Execution
from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.services.sagemaker_jobs import JobOutcome
from d2ops.offline.task_integrations import ServiceExecutors
from d2ops_core.platform import QuotaRefusal, parse_quota_refusal, quota_name
from d2ops_core.s3_layout import parse_s3_uri
from tests.fixtures.pipeline import support

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAULTS = {"sagemaker:createTrainingJob": 1, "sagemaker:createProcessingJob": 1}


class InstantJobs:
    """Training writes a tiny model.tar.gz (or fails with ``failure``); evaluation writes a report."""

    failure: str | None = None

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        if self.failure is not None:
            return JobOutcome(failure_reason=self.failure)
        (work_dir / "model").mkdir(parents=True, exist_ok=True)
        (work_dir / "model" / "metadata.json").write_text("{}")
        with tarfile.open(work_dir / "model.tar.gz", "w:gz") as tar:
            tar.add(work_dir / "model" / "metadata.json", arcname="metadata.json")
        return JobOutcome(failure_reason=None, model_tar=work_dir / "model.tar.gz", log_lines=[])

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        assert "challenger" in inputs  # the model the training job (the one started first) uploaded
        (work_dir / "out").mkdir(parents=True, exist_ok=True)
        (work_dir / "out" / "evaluation.json").write_text("{}")
        outputs = request["ProcessingOutputConfig"]["Outputs"]
        return JobOutcome(failure_reason=None, processing_outputs={o["OutputName"]: work_dir / "out" for o in outputs})


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("sync-retries") / "work", lost_responses={}) as runtime:
        runtime.sagemaker.jobs = InstantJobs()
        # The plan trains two ml.g4dn.xlarge on spot: an account whose spot GPU quota was raised from a new
        # account's 0 (d2ops.offline.quotas), as its first real run would need.
        runtime.quotas.set(quota_name("ml.g4dn.xlarge", "spot training"), 4)
        s3 = runtime.client("s3")
        for bucket in (support.DATA_BUCKET, support.ARTIFACTS_BUCKET):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=support.DATA_BUCKET, Key="datasets/shapes/v1/annotations/train.json", Body=b"{}")
        # Something under every channel the plan names (the pretrained weights' key, say), so no job fails its
        # download.
        for channel in plan("channels")["plan"]["training_job"].get("InputDataConfig", []):
            bucket, key = parse_s3_uri(channel["DataSource"]["S3DataSource"]["S3Uri"])
            if not s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount"):
                s3.put_object(Bucket=bucket, Key=key + "placeholder" if key.endswith("/") else key, Body=b"{}")
        yield runtime


@pytest.fixture(scope="module")
def machine(rt: OfflineRuntime) -> StateMachine:
    """The pipeline's own Train and Evaluate stages, one after the other; the evaluation report's reading is a
    Succeed, each stage's failure record a Fail named after it."""
    train, evaluate = (copy.deepcopy(rt.machine.definition["States"][stage]) for stage in ("Train", "Evaluate"))
    train["Branches"][0]["States"]["Record training failure"] = {
        "Type": "Fail", "Error": "TrainingFailed", "CausePath": "$.error.Cause"}
    evaluate["Branches"][0]["States"]["Record evaluation failure"] = {
        "Type": "Fail", "Error": "EvaluationFailed", "CausePath": "$.error.Cause"}
    evaluate["Branches"][0]["States"]["Read evaluation report"] = {"Type": "Succeed"}
    train["Next"] = "Evaluate"
    del evaluate["Next"]
    evaluate["End"] = True
    return StateMachine.from_definition({"StartAt": "Train", "States": {"Train": train, "Evaluate": evaluate}},
                                        name="jobs")


def plan(tag: str) -> dict[str, Any]:
    """The prepare Lambda's plan of the mock cases (tests/unit/test_pipeline_paths.py checks it is what the
    Lambda builds), with job names of its own: job names stay taken."""
    mocked = json.loads(support.MOCK_CONFIG.read_text())["MockedResponses"]["PlanFirstRun"]["0"]["Return"]
    return {"plan": json.loads(json.dumps(mocked["Payload"]).replace("shapes-v1-bf3cc289798108cc", f"shapes-v1-{tag}"))}


def run(rt: OfflineRuntime, machine: StateMachine, tag: str, faults: dict[str, int],
        throttles: dict[str, int] | None = None, failed_answers: dict[str, int] | None = None) -> Execution:
    clients = functools.cache(rt.client)  # one boto3 client per service: a new one per call costs ~1 s under load
    executors = ServiceExecutors(rt.lambdas, clients, faults, throttles, failed_answers)
    return machine.run(plan(tag), executors=executors.registry())


def failures(execution: Execution, state: str) -> list[dict[str, str]]:
    failed, current = [], None
    for event in execution.history:
        if event["type"].endswith("StateEntered"):
            current = event["stateEnteredEventDetails"]["name"]
        elif event["type"] == "TaskFailed" and current == state:
            failed.append(event["taskFailedEventDetails"])
    return failed


def jobs(rt: OfflineRuntime) -> set[str]:
    return {j["TrainingJobName"] for j in rt.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]}


def test_a_run_whose_create_answers_were_lost_waits_for_the_jobs_it_started(rt: OfflineRuntime,
                                                                            machine: StateMachine) -> None:
    before = jobs(rt)
    faults = dict(FAULTS)
    ex = run(rt, machine, "lost", faults)
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    assert faults == {"sagemaker:createTrainingJob": 0, "sagemaker:createProcessingJob": 0}  # both were lost
    assert jobs(rt) - before == {"shapes-v1-lost-train"}  # one job, the first attempt's
    for state, refusal in (("Train model", "Training job names must be unique within an AWS account and region"),
                           ("Evaluate challenger and champion", "Job name must be unique within an AWS account and "
                                                                "region")):
        first, *retries = failures(ex, state)
        assert first["error"] == "SageMaker.SdkClientException" and "Read timed out" in first["cause"]
        assert len(retries) == 1  # the one retry a lost answer gets, told the name is taken
        for refused in retries:
            assert refused["error"] == "SageMaker.ResourceInUseException"
            assert refused["cause"].startswith(refusal)
            assert "Error Code: ResourceInUse" in refused["cause"]

    control = run(rt, machine, "control", {})
    assert control.status == "SUCCEEDED", (control.error, control.cause)
    assert not failures(control, "Train model") and "Training job already created?" not in [
        e["stateEnteredEventDetails"]["name"] for e in control.history if e["type"].endswith("StateEntered")]
    # The same result, in the same place, as the .sync states give.
    for output, tag in ((ex.output, "lost"), (control.output, "control")):
        assert output["training"] == {
            "job_name": f"shapes-v1-{tag}-train", "status": "Completed",
            "job_arn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/shapes-v1-{tag}-train",
            "model_data": f"s3://{support.ARTIFACTS_BUCKET}/runs/shapes_v1_bf3cc289798108cc/training/"
                          f"shapes-v1-{tag}-train/output/model.tar.gz"}
        assert output["evaluation_job"] == {"job_name": f"shapes-v1-{tag}-eval", "status": "Completed"}
    rt.client("s3").head_object(Bucket=support.ARTIFACTS_BUCKET,
                                Key="runs/shapes_v1_bf3cc289798108cc/training/shapes-v1-lost-train/output/model.tar.gz")


def test_a_create_answered_with_a_5xx_that_created_its_job_waits_for_it_and_trains_once(
        rt: OfflineRuntime, machine: StateMachine) -> None:
    """The create reaches SageMaker and starts the job, but its answer is an internal error (HTTP 500): the
    state retries it, the retry is refused under SageMaker's own name for a name in use, and the run waits
    for the job it started. Mutations caught: the offline runtime naming ResourceInUse with the catch-all
    AmazonSageMakerException; the definition's Catch or "already created?" Choice on the catch-all only (the
    ResourceInUseException then falls to States.ALL: TrainingFailed while the job trains on)."""
    before = jobs(rt)
    answers = {"sagemaker:createTrainingJob": 1}
    ex = run(rt, machine, "answered500", {}, failed_answers=answers)
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    assert answers == {"sagemaker:createTrainingJob": 0}
    assert jobs(rt) - before == {"shapes-v1-answered500-train"}  # trained once: the first attempt's job
    internal, taken = failures(ex, "Train model")
    assert internal["error"] == "SageMaker.AmazonSageMakerException"
    assert "Status Code: 500; Error Code: InternalFailure" in internal["cause"]
    assert taken["error"] == "SageMaker.ResourceInUseException" and "Error Code: ResourceInUse" in taken["cause"]
    entered = _entered(ex)
    assert entered.count("Train model") == 2 and "Start waiting for created training job" in entered
    assert ex.output["training"]["job_name"] == "shapes-v1-answered500-train"
    assert ex.output["training"]["status"] == "Completed"


def test_a_started_job_that_fails_fails_the_run_as_the_sync_state_does(rt: OfflineRuntime,
                                                                       machine: StateMachine) -> None:
    rt.sagemaker.jobs.failure = "AlgorithmError: CUDA out of memory (see /opt/ml/output/failure)"
    try:
        ex = run(rt, machine, "lostfail", {"sagemaker:createTrainingJob": 1})
        control = run(rt, machine, "fail", {})
    finally:
        rt.sagemaker.jobs.failure = None
    for execution in (ex, control):
        assert (execution.status, execution.error) == ("FAILED", "TrainingFailed")
    assert "Read created training job failure" in [e["stateEnteredEventDetails"]["name"] for e in ex.history
                                                    if e["type"].endswith("StateEntered")]
    # States.TaskFailed with the job's description as the Cause, like the .sync state's.
    lost, normal = json.loads(ex.cause), json.loads(control.cause)
    assert lost["FailureReason"] == normal["FailureReason"] == "AlgorithmError: CUDA out of memory (see " \
                                                               "/opt/ml/output/failure)"
    assert lost["TrainingJobStatus"] == normal["TrainingJobStatus"] == "Failed" and set(lost) == set(normal)


def test_a_name_taken_by_another_job_is_not_waited_for(rt: OfflineRuntime, machine: StateMachine) -> None:
    request = plan("taken")["plan"]["training_job"]
    rt.client("sagemaker").create_training_job(**{**request, "OutputDataConfig": {
        "S3OutputPath": f"s3://{support.ARTIFACTS_BUCKET}/runs/another-run/training/"}})
    ex = run(rt, machine, "taken", {})
    assert (ex.status, ex.error) == ("FAILED", "TrainingFailed")
    assert ex.cause.startswith("Training job names must be unique") and "training-job/shapes-v1-taken-train" in ex.cause
    (refused,) = failures(ex, "Train model")  # a name in use is never retried
    # A repeated create is refused under SageMaker's own name for it (modelled, so not the catch-all).
    assert refused["error"] == "SageMaker.ResourceInUseException" and "Error Code: ResourceInUse" in refused["cause"]


def _entered(execution: Execution) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in execution.history if e["type"].endswith("StateEntered")]


def test_a_create_throttled_twice_is_tried_again_and_trains(rt: OfflineRuntime, machine: StateMachine) -> None:
    throttles = {"sagemaker:createTrainingJob": 2}
    ex = run(rt, machine, "throttled", {}, throttles)
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    assert throttles == {"sagemaker:createTrainingJob": 0}
    refused = failures(ex, "Train model")
    assert len(refused) == 2 and all("Error Code: ThrottlingException" in r["cause"] for r in refused)
    assert _entered(ex).count("Wait to retry creating training job") == 2
    assert ex.output["training"]["job_name"] == "shapes-v1-throttled-train" and ex.output["training"]["status"] == \
        "Completed"


def test_a_create_over_the_accounts_quota_ends_the_run_at_once(rt: OfflineRuntime, machine: StateMachine) -> None:
    before = jobs(rt)
    request = plan("quota")["plan"]["training_job"]
    instance_type, count = request["ResourceConfig"]["InstanceType"], request["ResourceConfig"]["InstanceCount"]
    name = quota_name(instance_type, "spot training" if request.get("EnableManagedSpotTraining") else "training")
    raised = rt.quotas.value(name)
    rt.quotas.set(name, 0)
    try:
        ex = run(rt, machine, "quota", {})
    finally:
        rt.quotas.set(name, raised)
    assert (ex.status, ex.error) == ("FAILED", "TrainingFailed")
    (refused,) = failures(ex, "Train model")  # sent once, refused once
    assert "Error Code: ResourceLimitExceeded" in refused["cause"]
    assert parse_quota_refusal(refused["cause"]) == QuotaRefusal(name=name, value=0, used=0, requested=count)
    assert not any(s.startswith("Wait") for s in _entered(ex))
    ended = ex.history[-1]["timestamp"]
    started = next(e["timestamp"] for e in ex.history if e["type"] == "TaskStateEntered")
    assert (ended - started).total_seconds() < 60  # virtual time: any wait would show here
    assert jobs(rt) == before  # SageMaker started nothing
