"""An ended training job's curve: read from CloudWatch once, kept at runs/<run id>/training-curve.json, served
from there (status_api.curve_store); a running job's is read from CloudWatch on every request.

Against moto (S3, SageMaker, CloudWatch) with the real definition's run in the ASL interpreter; CloudWatch is
wrapped to count GetMetricData calls, the counts are what is asserted."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from d2ops_core import platform, s3_layout
from d2ops_core.documents.training_curve import TrainingCurve
from tests.fixtures.pipeline import support

support.function_path("status_api")
from status_api import curve_store, service  # noqa: E402
from status_api import handler as api  # noqa: E402

ARTIFACTS = support.ARTIFACTS_BUCKET
KEY = s3_layout.training_curve_key(support.RUN_ID)


class CountingCloudWatch:
    """moto's CloudWatch, counting GetMetricData calls (``fail``: each call refused instead)."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls, self.fail = real, 0, False

    def get_metric_data(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.fail:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetMetricData")
        return self.real.get_metric_data(**kwargs)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    execution = support.run_case("TrainingFailed")  # before moto starts: the run's own Lambdas start and stop it
    support.aws_env(monkeypatch)
    monkeypatch.setenv("STATE_MACHINE_ARN", execution.state_machine.arn)
    monkeypatch.setenv("ARTIFACTS_BUCKET", ARTIFACTS)
    with mock_aws():
        s3, sagemaker = boto3.client("s3"), boto3.client("sagemaker")
        s3.create_bucket(Bucket=ARTIFACTS)
        s3.put_bucket_versioning(Bucket=ARTIFACTS, VersioningConfiguration={"Status": "Enabled"})
        request = json.loads(json.dumps(support.state_output(execution, "Prepare training job")
                                        ["plan"]["training_job"]))
        sagemaker.create_training_job(**request)  # moto: Completed at once
        job = sagemaker.describe_training_job(TrainingJobName=request["TrainingJobName"])
        cloudwatch = boto3.client("cloudwatch")
        for name, value in (("train:iteration", 40.0), ("train:total_iterations", 250.0), ("train:loss", 0.8)):
            cloudwatch.put_metric_data(Namespace=platform.TRAINING_METRICS_NAMESPACE, MetricData=[{
                "MetricName": name, "Value": value, "Timestamp": job["TrainingStartTime"],
                "Dimensions": [{"Name": platform.TRAINING_METRICS_DIMENSION, "Value": job["TrainingJobName"]}]}])
        yield {"s3": s3, "sagemaker": sagemaker, "cloudwatch": CountingCloudWatch(cloudwatch), "job": job,
               "execution": execution, "sfn": support.InterpreterStepFunctions(execution)}


def detail(aws: dict[str, Any], now: datetime | None = None, s3: Any = None) -> Any:
    """GET /runs/{runId} through the service, at ``now`` (default: long after moto's job ended)."""
    later = now or aws["job"]["TrainingEndTime"] + timedelta(seconds=curve_store.SETTLE_SECONDS + 1)
    store = curve_store.CurveStore(s3 or aws["s3"], ARTIFACTS, support.RUN_ID)
    return service.job_progress(aws["cloudwatch"], aws["job"], store, later)


def stored(aws: dict[str, Any]) -> TrainingCurve | None:
    listed = aws["s3"].list_objects_v2(Bucket=ARTIFACTS, Prefix=KEY).get("Contents", [])
    if not listed:
        return None
    return TrainingCurve.model_validate_json(aws["s3"].get_object(Bucket=ARTIFACTS, Key=KEY)["Body"].read())


def get(path: str) -> tuple[int, dict[str, Any]]:
    event = copy.deepcopy(support.load_event("status_api", "list_runs"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    response = api.handler(event, support.FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"])


def test_a_finished_runs_second_get_does_not_call_cloudwatch(aws: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the handler: the first GET of an ended job reads CloudWatch and stores the curve, the second
    answers the same progress with no GetMetricData call. Catches: the curve not stored, or stored but not
    read back (a CloudWatch call on every request, as before), the handler not passing S3 on."""
    monkeypatch.setattr(curve_store, "SETTLE_SECONDS", 0)  # moto's job ended a moment ago
    clients = {"s3": aws["s3"], "stepfunctions": aws["sfn"], "sagemaker": aws["sagemaker"],
               "cloudwatch": aws["cloudwatch"]}
    monkeypatch.setattr(api.clients, "client", lambda name: clients[name])
    status, first = get(f"/runs/{support.RUN_ID}")
    assert status == 200 and aws["cloudwatch"].calls == 1
    assert first["training"]["progress"]["iteration"] == 40
    curve = stored(aws)
    assert curve is not None and curve.job_name == aws["job"]["TrainingJobName"] and curve.job_status == "Completed"
    status, second = get(f"/runs/{support.RUN_ID}")
    assert status == 200 and aws["cloudwatch"].calls == 1, "the second GET of a finished run called CloudWatch"
    assert second["training"] == first["training"]


def test_a_running_job_is_read_from_cloudwatch_every_time_and_never_stored(aws: dict[str, Any]) -> None:
    """Catches: a running job's curve frozen (stored, or a stored one served while the job still trains)."""
    running = {**aws["job"], "TrainingJobStatus": "InProgress"}
    running.pop("TrainingEndTime")
    # A curve stored for this job (by an older stack, or a bug) must not stop a running job's progress.
    frozen = TrainingCurve(job_name=running["TrainingJobName"], job_status="Completed", job_ended_at=None,
                           stored_at=datetime.now(UTC), progress=None)
    store = curve_store.CurveStore(aws["s3"], ARTIFACTS, support.RUN_ID)
    later = datetime.now(UTC) + timedelta(hours=1)
    for n in (1, 2):
        progress = service.job_progress(aws["cloudwatch"], running, store, later)
        assert progress is not None and progress.iteration == 40 and aws["cloudwatch"].calls == n
    assert stored(aws) is None
    store.save(frozen)
    assert service.job_progress(aws["cloudwatch"], running, store, later) is not None
    assert aws["cloudwatch"].calls == 3


def test_a_job_that_ended_moments_ago_is_not_stored_yet(aws: dict[str, Any]) -> None:
    """Catches: a curve stored before the job's last published values can have arrived (frozen short)."""
    just_ended = aws["job"]["TrainingEndTime"] + timedelta(seconds=curve_store.SETTLE_SECONDS - 1)
    assert detail(aws, just_ended) is not None and detail(aws, just_ended) is not None
    assert aws["cloudwatch"].calls == 2 and stored(aws) is None
    assert detail(aws) is not None and detail(aws) is not None  # settled: read once, then from S3
    assert aws["cloudwatch"].calls == 3 and stored(aws) is not None


def test_a_cloudwatch_error_is_not_stored_as_no_curve(aws: dict[str, Any]) -> None:
    """Catches: a throttled read stored as "this job published nothing" (the curve lost for good)."""
    aws["cloudwatch"].fail = True
    assert detail(aws) is None and stored(aws) is None
    aws["cloudwatch"].fail = False
    progress = detail(aws)
    assert progress is not None and progress.iteration == 40 and stored(aws) is not None


def test_an_unusable_stored_curve_is_read_from_cloudwatch_instead(aws: dict[str, Any]) -> None:
    """A half document, another job's curve: never served. Catches: a partial or foreign curve answered."""
    aws["s3"].put_object(Bucket=ARTIFACTS, Key=KEY, Body=b'{"job_name": "x", "job_status": "Compl')
    progress = detail(aws)
    assert progress is not None and progress.iteration == 40 and aws["cloudwatch"].calls == 1
    other = TrainingCurve(job_name="another-run-train", job_status="Completed", job_ended_at=None,
                          stored_at=datetime.now(UTC), progress=None)
    aws["s3"].put_object(Bucket=ARTIFACTS, Key=KEY, Body=other.model_dump_json().encode())
    progress = detail(aws)
    assert progress is not None and progress.iteration == 40 and aws["cloudwatch"].calls == 2


def test_concurrent_first_requests_both_answer_and_one_curve_stays(aws: dict[str, Any]) -> None:
    """Two requests find nothing stored at once: both read CloudWatch and answer, the conditional writes
    let one curve stay and the other's refusal is no error. Catches: the losing write failing its request."""
    answers: list[Any] = []
    start = threading.Barrier(2)

    def request() -> None:
        start.wait()
        answers.append(detail(aws))

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 2 and all(a is not None and a.iteration == 40 for a in answers)
    first = stored(aws)
    assert first is not None
    curve_store.CurveStore(aws["s3"], ARTIFACTS, support.RUN_ID).save(
        first.model_copy(update={"stored_at": datetime.now(UTC) + timedelta(days=1)}))  # refused: it stays
    assert stored(aws) == first
    versions = aws["s3"].list_object_versions(Bucket=ARTIFACTS, Prefix=KEY).get("Versions", [])
    assert len(versions) == 1, "a second write replaced the stored curve"


def test_the_document_cannot_say_the_job_is_running() -> None:
    with pytest.raises(ValidationError, match="job_status"):
        TrainingCurve.model_validate({"job_name": "j", "job_status": "InProgress", "job_ended_at": None,
                                      "stored_at": datetime.now(UTC).isoformat(), "progress": None})


def test_the_curve_stores_s3_calls_are_granted_by_the_template(aws: dict[str, Any]) -> None:
    """Catches: the role missing s3:PutObject (or the GetObject / listing grant) on training-curve.json, and a
    grant wider than that key."""
    from tests.unit.test_status_api_s3_access import problems, s3_statements

    calls: list[tuple[str, dict[str, Any]]] = []
    aws["s3"].meta.events.register("provide-client-params.s3.*",
                                   lambda params, model, **_: calls.append((model.name, dict(params))))
    detail(aws)
    detail(aws)
    assert {op for op, _ in calls} == {"ListObjectsV2", "GetObject", "PutObject"}
    statements = s3_statements()
    assert problems(statements, calls) == []
    puts = [st for st in statements if "s3:PutObject" in str(st["Action"])]
    assert any(st["Resource"] == f"arn:aws:s3:::{ARTIFACTS}/runs/*/training-curve.json" for st in puts)
    fewer = [st for st in statements if st.get("Sid") != "StoreTrainingCurves"]
    assert any("PutObject" in p for p in problems(fewer, calls))
