"""The pipeline's canary end to end offline: real state machine, Lambdas, evaluation jobs and TorchServes.

Training is not what this module tests, so its training jobs hand back the serving tests'
session-cached exported detector (no model is trained here). The first run creates the
endpoint; the second deploys the same model as a canary and is promoted after its smoke test
in the bake; the third deploys a model that loads and warms up but fails on real images: the
smoke test in the bake fails, the smoke-test alarm rolls the update back, the run waits until
the previous config serves again and ends DeploymentFailed, and the old model keeps answering.
The fourth deploys a good model while the endpoint's error alarm goes into ALARM (traffic the
pipeline did not send): SageMaker's guardrails roll it back on their own, and the endpoint
history records the attempt, the alarm and the config that kept serving, as the status API shows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.services.sagemaker_endpoints import ServedModel, ServingBackend
from d2ops.offline.services.sagemaker_jobs import JobBackend, JobOutcome
from model_code import artifact
from tests.fixtures.offline.support import tiny_dataset
from tests.fixtures.serving.failing_model import failing_artifact, for_synthetic_shapes
from tests.fixtures.serving.support import cached_artifact

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]


class ReuseExportedModel:
    """Training jobs answer with an already exported model; processing (evaluation) jobs run for real."""

    def __init__(self, jobs: JobBackend, model_tar: Path) -> None:
        self.jobs, self.model_tar = jobs, model_tar

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        return JobOutcome(failure_reason=None, model_tar=self.model_tar, log_lines=[])

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        return self.jobs.run_processing(request, inputs, work_dir, stop)


class AlarmOnStart:
    """Puts ``alarm`` into ALARM as soon as the new fleet has started (an operator's alarm firing
    during the bake); offline SageMaker then rolls the update back as the real one does."""

    def __init__(self, serving: ServingBackend, cloudwatch: Any, alarm: str) -> None:
        self.serving, self.cloudwatch, self.alarm = serving, cloudwatch, alarm

    def start(self, model_tar: Path, work_dir: Path, name: str, environment: Any = None) -> ServedModel:
        served = self.serving.start(model_tar, work_dir, name, environment=environment)
        self.cloudwatch.set_alarm_state(AlarmName=self.alarm, StateValue="ALARM",
                                        StateReason="Threshold Crossed: 5 Invocation5XXErrors in 1 minute")
        return served


class ServeInstead:
    """Serves ``replacement`` for every endpoint started while ``active`` (the bad model's deployment)."""

    def __init__(self, serving: ServingBackend, replacement: Path) -> None:
        self.serving, self.replacement, self.active = serving, replacement, False

    def start(self, model_tar: Path, work_dir: Path, name: str, environment: Any = None) -> ServedModel:
        return self.serving.start(self.replacement if self.active else model_tar, work_dir, name,
                                  environment=environment)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    model = for_synthetic_shapes(cached_artifact(), tmp_path_factory.mktemp("model"))
    # The reused detector was trained on none of these images (an empty list: held-out is verifiable), and every
    # run serves the same weights, so the gate's interval is exactly 0 on the tiny val splits: approved once
    # MinComparedImages lets 12-image splits be judged (the deployment, not the gate, is under test here).
    artifact.write_training_images(model, [])
    with OfflineRuntime(tmp_path_factory.mktemp("canary-e2e") / "work",
                        parameters={"MinMap": "0", "MinComparedImages": "1"}) as rt:
        rt.sagemaker.jobs = ReuseExportedModel(rt.sagemaker.jobs,
                                               artifact.pack_artifact(model, model.parent / "model.tar.gz"))
        rt.sagemaker.max_bake_seconds = 90  # the 24-request smoke test inside the bake on a loaded machine
        yield rt


def run(rt: OfflineRuntime, root: Path, version: str) -> Any:
    dataset = tiny_dataset(root, "canary", version, images=12, size=64, seed=len(version),
                           gate={"min_map": 0.0})
    lines: list[str] = []
    summary = run_pipeline(rt, dataset, out=lines.append, timeout=1500)
    return summary, lines


def answer(rt: OfflineRuntime, root: Path) -> dict[str, Any]:
    image = next(p for p in sorted((root / "canary-v1" / "images").rglob("*")) if p.suffix in (".png", ".jpg"))
    body = rt.client("sagemaker-runtime").invoke_endpoint(
        EndpointName=rt.stack.endpoint_name, Body=image.read_bytes(),
        ContentType="image/png" if image.suffix == ".png" else "image/jpeg")["Body"]
    result: dict[str, Any] = json.loads(body.read())
    return result


def champion(rt: OfflineRuntime) -> dict[str, Any]:
    body = rt.client("s3").get_object(Bucket=rt.stack.artifacts_bucket, Key="champion.json")["Body"].read()
    record: dict[str, Any] = json.loads(body)
    return record


def test_a_good_canary_is_promoted_and_a_bad_one_rolled_back(runtime: OfflineRuntime,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("datasets")
    sm = runtime.client("sagemaker")
    first, lines = run(runtime, root, "v1")
    assert first.status == "SUCCEEDED", (first.error, first.cause, lines[-10:])
    assert "Create endpoint" in first.states_visited

    second, lines = run(runtime, root, "v2")
    assert second.status == "SUCCEEDED", (second.error, second.cause, lines[-10:])
    visited = second.states_visited
    assert "Update endpoint (blue/green)" in visited and "Canary baking?" in visited
    assert visited.index("Canary baking?") < visited.index("Smoke test endpoint") < visited.index("Record champion")
    promoted = sm.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    assert promoted["EndpointConfigName"] == second.output["plan"]["names"]["endpoint_config"]
    assert champion(runtime)["run_id"] == second.run_id
    served = runtime.sagemaker.served(runtime.stack.endpoint_name)
    assert served[promoted["EndpointConfigName"]] >= 6  # a quarter of the 24 smoke requests, at least

    bad_dir = tmp_path_factory.mktemp("failing")
    model = for_synthetic_shapes(cached_artifact(), bad_dir)
    serving = ServeInstead(runtime.sagemaker.serving, failing_artifact(model, bad_dir / "failing"))
    runtime.sagemaker.serving = serving
    serving.active = True
    try:
        third, lines = run(runtime, root, "v3")
    finally:
        serving.active = False
    assert (third.status, third.error) == ("FAILED", "DeploymentFailed"), (third.cause, lines[-10:])
    assert "SmokeTestFailed" in str(third.cause)
    visited = third.states_visited
    assert {"Canary baking?", "Trip smoke test alarm", "Rolled back?"} <= set(visited), visited
    assert "Promote to champion" not in visited
    after = sm.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    assert (after["EndpointStatus"], after["EndpointConfigName"]) == ("InService", promoted["EndpointConfigName"])
    assert "SmokeTestAlarm" in after["FailureReason"]
    assert champion(runtime)["run_id"] == second.run_id
    assert isinstance(answer(runtime, root)["detections"], list)  # the old model still answers

    # An alarm the pipeline did not trip. The smoke-test alarm run 3 tripped has since evaluated back
    # to OK in CloudWatch (no new failures); moto does not evaluate alarms, so say so for it.
    cloudwatch, names = runtime.client("cloudwatch"), runtime.stack.substitutions
    cloudwatch.set_alarm_state(AlarmName=names["SmokeTestAlarmName"], StateValue="OK", StateReason="no failures")
    runtime.sagemaker.serving = AlarmOnStart(serving.serving, cloudwatch, names["EndpointErrorAlarmName"])
    try:
        fourth, lines = run(runtime, root, "v4")
    finally:
        runtime.sagemaker.serving = serving.serving
    assert (fourth.status, fourth.error) == ("FAILED", "DeploymentFailed"), (fourth.cause, lines[-10:])
    visited = fourth.states_visited
    assert {"Endpoint rolled back by alarms", "Find rollback alarms", "Record alarm rollback"} <= set(visited)
    # (The run may smoke-test the canary first, if its poll sees the bake before the rollback: it passes.)
    assert "Promote to champion" not in visited and "Trip smoke test alarm" not in visited
    after = sm.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    assert (after["EndpointStatus"], after["EndpointConfigName"]) == ("InService", promoted["EndpointConfigName"])
    history = offline_status_api(runtime.status_api.url).get(f"/endpoints/{runtime.stack.endpoint_name}/history")
    by_run = {r["run_id"]: r for r in history["rolled_back"]}
    assert by_run[third.run_id]["rolled_back_by"] == "pipeline"
    attempt = by_run[fourth.run_id]
    assert attempt["rolled_back_by"] == "alarm"
    assert attempt["alarms"] == [names["EndpointErrorAlarmName"]]
    assert attempt["alarm_reasons"] == ["Threshold Crossed: 5 Invocation5XXErrors in 1 minute"]
    assert attempt["kept_serving"] == promoted["EndpointConfigName"]
    assert history["served"][0]["run_id"] == second.run_id and history["served"][0]["served_to"] is None
    assert isinstance(answer(runtime, root)["detections"], list)  # the old model still answers
