"""A stopped run gives the endpoint lease back and leaves no job running: no state of the run runs after
StopExecution, so both come from ReleaseEndpointLeaseFunction on EventBridge's execution status change,
which the offline runtime delivers to the rules of template.yaml as EventBridge would. The jobs are the
offline SageMaker's real local jobs (moto's training jobs are born Completed and cannot be stopped).

The stop and the CreateTrainingJob answer race on a real machine; each test decides their order itself: it
waits for the history event that shows the state recorded the answer, or holds the answer at the service
(the job exists, the state has not heard back) until after the stop. Never by sleeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.services.sagemaker_jobs import JobOutcome
from d2ops_core import run_ids, s3_layout
from tests.fixtures.offline.support import tiny_dataset
from tests.fixtures.pipeline import support

support.function_path("release_endpoint_lease")
from release_endpoint_lease.models import ExecutionStatusChange  # noqa: E402
from release_endpoint_lease.service import handle_status_change, stop_job  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RUN_ID = "shapes_v1_0123456789abcdef"
FAILS = "fail"  # a job with this hyperparameter fails at once instead of running until stopped


class HeldJobs:
    """Jobs that run until they are stopped (the run is stopped while they run)."""

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        if (request.get("HyperParameters") or {}).get(FAILS):
            return JobOutcome(failure_reason="AlgorithmError: failed at once")
        stop.wait(120)
        return JobOutcome(failure_reason="stopped")

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        stop.wait(120)
        return JobOutcome(failure_reason="stopped")


def _until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    # A test sets rt.lost_responses["sagemaker:createTrainingJob"] = 1 to lose its run's CreateTrainingJob answer:
    # the job runs, the Train model state never learns of it, so stopping the execution does not stop it (a .sync
    # state that knows its job would); only the execution's end (ReleaseEndpointLeaseFunction) can.
    with OfflineRuntime(tmp_path_factory.mktemp("lease") / "work", jobs=HeldJobs(), lost_responses={}) as runtime:
        yield runtime


def training_request(rt: OfflineRuntime, run_id: str, output: str | None = None,
                     hyperparameters: dict[str, str] | None = None) -> dict[str, Any]:
    return {"TrainingJobName": run_ids.sagemaker_name(run_id, run_ids.TRAINING_JOB_SUFFIX),
            "RoleArn": support.ROLE_ARN, "HyperParameters": hyperparameters or {},
            "AlgorithmSpecification": {"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
                                       "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": output or s3_layout.training_output_uri(rt.stack.artifacts_bucket,
                                                                                         run_id)},
            "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": 600}}


def processing_request(rt: OfflineRuntime, run_id: str) -> dict[str, Any]:
    return {"ProcessingJobName": run_ids.sagemaker_name(run_id, run_ids.EVALUATION_JOB_SUFFIX),
            "RoleArn": support.ROLE_ARN,
            "AppSpecification": {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1"},
            "ProcessingOutputConfig": {"Outputs": [{"OutputName": "evaluation", "S3Output": {
                "S3Uri": s3_layout.evaluation_output_uri(rt.stack.artifacts_bucket, run_id),
                "LocalPath": "/opt/ml/processing/output", "S3UploadMode": "EndOfJob"}}]},
            "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                      "VolumeSizeInGB": 1}}}


def ended(rt: OfflineRuntime, run_id: str, status: str) -> ExecutionStatusChange:
    arn = run_ids.execution_arn(rt.stack.state_machine_arn, run_id)
    return ExecutionStatusChange.model_validate({
        "source": "aws.states", "detail-type": "Step Functions Execution Status Change",
        "detail": {"executionArn": arn, "stateMachineArn": rt.stack.state_machine_arn, "name": run_id,
                   "status": status}})


def deliver(rt: OfflineRuntime, run_id: str, status: str, sagemaker: Any = None) -> dict[str, Any]:
    (table,) = rt.stack.tables
    result = handle_status_change(ended(rt, run_id, status), rt.client("dynamodb"), table, rt.stack.endpoint_name,
                                  sagemaker or rt.client("sagemaker"), rt.stack.artifacts_bucket)
    return {job.kind: (job.action, job.status) for job in result.jobs}


def training_status(rt: OfflineRuntime, run_id: str) -> str | None:
    name = run_ids.sagemaker_name(run_id, run_ids.TRAINING_JOB_SUFFIX)
    try:
        return str(rt.client("sagemaker").describe_training_job(TrainingJobName=name)["TrainingJobStatus"])
    except ClientError:
        return None


def processing_status(rt: OfflineRuntime, run_id: str) -> str:
    name = run_ids.sagemaker_name(run_id, run_ids.EVALUATION_JOB_SUFFIX)
    return str(rt.client("sagemaker").describe_processing_job(ProcessingJobName=name)["ProcessingJobStatus"])


class HeldAnswers:
    """The local SageMaker creates the training job at once and holds its answer until ``release``: the
    job exists and runs while the state that asked for it has not heard back (a slow network, ordered by
    the test). ``stops`` records StopTrainingJob calls, whoever makes them (appended: gateway threads)."""

    def __init__(self, rt: OfflineRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.holding, self.release = threading.Event(), threading.Event()
        self.stops: list[str] = []
        create, stop = rt.sagemaker.job_api.create_training_job, rt.sagemaker.job_api.stop_training_job

        def held_create(request: dict[str, Any]) -> dict[str, Any]:
            answer = create(request)
            self.holding.set()
            self.release.wait(60)
            return answer

        def counted_stop(request: dict[str, Any]) -> dict[str, Any]:
            self.stops.append(str(request.get("TrainingJobName")))
            return stop(request)

        monkeypatch.setattr(rt.sagemaker.job_api, "create_training_job", held_create)
        monkeypatch.setattr(rt.sagemaker.job_api, "stop_training_job", counted_stop)


def start_run(rt: OfflineRuntime, datasets: Path, version: str) -> tuple[str, str]:
    """Upload a dataset version and deliver its event: the run starts. -> (execution ARN, run id)."""
    dataset = tiny_dataset(datasets, "tiny", version, images=8, size=64)
    manifest_key, _ = rt.upload_dataset(dataset)
    started = rt.deliver_event(rt.upload_event(rt.stack.data_bucket, manifest_key))
    assert started is not None and started["action"] == "started", started
    return started["execution_arn"], started["run_id"]


def history(rt: OfflineRuntime, arn: str) -> list[dict[str, Any]]:
    return list(rt.client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)["events"])


def task_events(events: list[dict[str, Any]], state: str) -> list[dict[str, Any]]:
    """The Task* events of ``state``, in order."""
    found, current = [], None
    for event in events:
        if event["type"].endswith("StateEntered"):
            current = event["stateEnteredEventDetails"]["name"]
        elif current == state and event["type"].startswith("Task"):
            found.append(event)
    return found


def lease_holder(rt: OfflineRuntime) -> str | None:
    (table,) = rt.stack.tables
    item = rt.client("dynamodb").get_item(TableName=table, Key={"endpoint_name": {"S": rt.stack.endpoint_name}},
                                          ConsistentRead=True).get("Item")
    return item["holder"]["S"] if item else None


def test_a_stopped_run_gives_its_endpoint_lease_back_and_its_job_is_stopped(rt: OfflineRuntime,
                                                                            tmp_path: Path) -> None:
    # The stop comes after the Train model state recorded its create's (lost) answer.
    rt.lost_responses["sagemaker:createTrainingJob"] = 1
    arn, run_id = start_run(rt, tmp_path / "datasets", "v1")
    failed = _until(lambda: [e for e in task_events(history(rt, arn), "Train model") if e["type"] == "TaskFailed"],
                    90, "the Train model state recording its create's lost answer")
    assert "Read timed out" in failed[0]["taskFailedEventDetails"]["cause"]
    assert rt.lost_responses["sagemaker:createTrainingJob"] == 0
    # The state never heard of its job, which runs.
    assert "TaskSubmitted" not in [e["type"] for e in task_events(history(rt, arn), "Train model")]
    assert training_status(rt, run_id) == "InProgress"
    assert lease_holder(rt) == arn  # it trains under the lease

    rt.client("stepfunctions").stop_execution(executionArn=arn, error="Operator", cause="stopped by the test")
    assert rt.client("stepfunctions").describe_execution(executionArn=arn)["status"] == "ABORTED"
    _until(lambda: lease_holder(rt) is None, 20, "the stopped run's lease released")
    _until(lambda: training_status(rt, run_id) == "Stopped", 30, "the stopped run's training job stopped")


@pytest.mark.parametrize("lost", [True, False], ids=["answer-lost", "answer-arrives"])
def test_a_run_stopped_before_its_creates_answer_gives_its_lease_back_and_its_job_is_stopped(
        rt: OfflineRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: bool) -> None:
    rt.lost_responses["sagemaker:createTrainingJob"] = 1 if lost else 0
    answers = HeldAnswers(rt, monkeypatch)
    try:
        arn, run_id = start_run(rt, tmp_path / "datasets", "v2-lost" if lost else "v2")
        assert answers.holding.wait(90), "the run's CreateTrainingJob never reached the service"
        assert training_status(rt, run_id) == "InProgress"
        assert [e["type"] for e in task_events(history(rt, arn), "Train model")] == ["TaskScheduled", "TaskStarted"]
        assert lease_holder(rt) == arn

        rt.client("stepfunctions").stop_execution(executionArn=arn, error="Operator", cause="stopped by the test")
        assert rt.client("stepfunctions").describe_execution(executionArn=arn)["status"] == "ABORTED"
    finally:
        answers.release.set()
    _until(lambda: lease_holder(rt) is None, 20, "the stopped run's lease released")
    _until(lambda: training_status(rt, run_id) == "Stopped", 30, "the stopped run's training job stopped")
    if lost:  # the abandoned task got its answer, lost: only the execution's end stopped the job
        _until(lambda: rt.lost_responses["sagemaker:createTrainingJob"] == 0, 30, "the held answer delivered")
        assert len(answers.stops) == 1
    else:  # the abandoned .sync task got its answer and stops its job too (SageMaker: nothing left to stop)
        _until(lambda: len(answers.stops) == 2, 30, "the abandoned task stopping its job")
    # Whatever the abandoned task heard after the stop, the run's history ends where the run did.
    events = history(rt, arn)
    # (the task inside the Train stage, then the stage's Parallel, then the execution)
    assert [e["type"] for e in events[-3:]] == ["TaskStateAborted", "ParallelStateAborted", "ExecutionAborted"], \
        events[-4:]
    assert [e["type"] for e in task_events(events, "Train model")] == ["TaskScheduled", "TaskStarted",
                                                                       "TaskStateAborted"]


def test_an_aborted_or_timed_out_runs_running_jobs_are_stopped_once(rt: OfflineRuntime) -> None:
    for run_id, status in (("shapes_v1_aaaaaaaaaaaaaaaa", "ABORTED"), ("shapes_v1_bbbbbbbbbbbbbbbb", "TIMED_OUT")):
        sagemaker = rt.client("sagemaker")
        sagemaker.create_training_job(**training_request(rt, run_id))
        sagemaker.create_processing_job(**processing_request(rt, run_id))
        assert deliver(rt, run_id, status) == {"training": ("stopped", "InProgress"),
                                              "processing": ("stopped", "InProgress")}
        _until(lambda run_id=run_id: training_status(rt, run_id) == processing_status(rt, run_id) == "Stopped",
               20, "both jobs stopped")
        # EventBridge may deliver twice: nothing left to do.
        assert deliver(rt, run_id, status) == {"training": ("not-running", "Stopped"),
                                              "processing": ("not-running", "Stopped")}


def test_jobs_that_are_not_the_runs_or_not_running_are_left_alone(rt: OfflineRuntime) -> None:
    sagemaker = rt.client("sagemaker")
    # Another stack's job of the same name (it writes elsewhere) keeps running.
    other = "shapes_v1_cccccccccccccccc"
    sagemaker.create_training_job(**training_request(rt, other, output=f"s3://{support.ARTIFACTS_BUCKET}/runs/x/"))
    try:
        assert deliver(rt, other, "FAILED") == {"training": ("not-ours", "InProgress"),
                                               "processing": ("not-found", None)}
        assert training_status(rt, other) == "InProgress"
    finally:
        sagemaker.stop_training_job(TrainingJobName=run_ids.sagemaker_name(other, run_ids.TRAINING_JOB_SUFFIX))
    # A job that already failed; a run that never created any job; a run that succeeded (not even looked at).
    failed = "shapes_v1_dddddddddddddddd"
    sagemaker.create_training_job(**training_request(rt, failed, hyperparameters={FAILS: "1"}))
    _until(lambda: training_status(rt, failed) == "Failed", 20, "the job failed")
    assert deliver(rt, failed, "FAILED")["training"] == ("not-running", "Failed")
    assert deliver(rt, "shapes_v1_eeeeeeeeeeeeeeee", "ABORTED") == {"training": ("not-found", None),
                                                                    "processing": ("not-found", None)}
    running = "shapes_v1_ffffffffffffffff"
    sagemaker.create_training_job(**training_request(rt, running))
    try:
        assert deliver(rt, running, "SUCCEEDED") == {}
        assert training_status(rt, running) == "InProgress"
    finally:
        sagemaker.stop_training_job(TrainingJobName=run_ids.sagemaker_name(running, run_ids.TRAINING_JOB_SUFFIX))


def _stubbed_sagemaker() -> tuple[Any, Stubber]:
    client = boto3.client("sagemaker", region_name=support.REGION, aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def test_a_job_that_ends_between_describe_and_stop_is_not_an_error() -> None:
    client, stubber = _stubbed_sagemaker()
    name, output = run_ids.sagemaker_name(RUN_ID, "train"), s3_layout.training_output_uri("bucket", RUN_ID)
    described = {"TrainingJobName": name,
                 "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
                 "AlgorithmSpecification": {"TrainingInputMode": "File"},
                 "ModelArtifacts": {"S3ModelArtifacts": f"{output}{name}/output/model.tar.gz"},
                 "OutputDataConfig": {"S3OutputPath": output}, "ResourceConfig": {"VolumeSizeInGB": 1},
                 "StoppingCondition": {}, "CreationTime": "2026-11-23T00:00:00Z", "SecondaryStatus": "Training"}
    stubber.add_response("describe_training_job", {**described, "TrainingJobStatus": "InProgress"})
    # SageMaker's answer to stopping a job that has just completed.
    stubber.add_client_error("stop_training_job", "ValidationException",
                             "The request was rejected because the training job is in status Completed.", 400)
    stubber.add_response("describe_training_job", {**described, "TrainingJobStatus": "Completed"})
    with stubber:
        job = stop_job(client, "training", name, output)
    assert (job.action, job.status) == ("not-running", "Completed")


def test_other_errors_fail_the_delivery_so_eventbridge_retries_and_the_lease_is_still_released(
        rt: OfflineRuntime) -> None:
    client, stubber = _stubbed_sagemaker()
    stubber.add_client_error("describe_training_job", "AccessDeniedException", "not authorized", 400)
    dynamodb = rt.client("dynamodb")
    (table,) = rt.stack.tables
    arn = run_ids.execution_arn(rt.stack.state_machine_arn, RUN_ID)
    dynamodb.put_item(TableName=table, Item={"endpoint_name": {"S": rt.stack.endpoint_name}, "holder": {"S": arn}})
    with stubber, pytest.raises(ClientError, match="AccessDenied"):
        deliver(rt, RUN_ID, "TIMED_OUT", sagemaker=client)
    assert "Item" not in dynamodb.get_item(TableName=table, Key={"endpoint_name": {"S": rt.stack.endpoint_name}},
                                           ConsistentRead=True)
