"""Two uploads racing: both runs go through the real definition at once (real clock), against moto's
DynamoDB, S3, SageMaker control plane and SNS, with the real Lambda handlers (the fast path of
test_pipeline_offline_run). The endpoint lease serialises them: the second run waits, then compares
against the first run's model and deploys after it; champion.json and the endpoint agree at the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import StateMachine
from d2ops.asl.interpreter import Execution
from d2ops_core import run_ids, run_start, s3_layout
from d2ops_core.documents.evaluation import EvaluationReport, ModelScores
from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import FakeRuntime, entered_states, task_parameters
from tests.integration.test_pipeline_offline_run import (  # noqa: F401 (stack is a fixture)
    DETECTIONS,
    WithUpdateEndpoint,
    champion,
    stack,
    upload,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class RacingIntegrations(WithUpdateEndpoint):
    """Also answers ``aws-sdk:sfn:describeExecution`` (moto's Step Functions does not know these executions)."""

    def __init__(self, executions: dict[str, Execution], **options: Any) -> None:
        super().__init__(**options)
        self.executions = executions

    def __call__(self, resource: str, parameters: Any, context: Any) -> Any:
        if resource.endswith(":aws-sdk:sfn:describeExecution"):
            execution = self.executions[parameters["ExecutionArn"]]
            return {"ExecutionArn": execution.arn, "Status": execution.status}
        return super().__call__(resource, parameters, context)


def write_evaluation(stack: dict[str, Any], kind: str, request: dict[str, Any]) -> None:  # noqa: F811
    """What the evaluation container writes: the challenger clears the gate, against a champion if it had one."""
    if kind != "ProcessingJob":
        return
    inputs = {i["InputName"] for i in request["ProcessingInputs"]}
    # Enough held-out images (MinComparedImages) for the gate to approve the better challenger unattended.
    document: dict[str, Any] = {"primary_metric": "bbox_AP", "val_images": 60, "class_instances": {},
                                "challenger": ModelScores(metrics={"bbox_AP": 0.55}).model_dump(), "champion": None}
    if "champion" in inputs:
        document["champion"] = ModelScores(metrics={"bbox_AP": 0.5}).model_dump()
        document["comparison"] = support.point_comparison(document)
        document["held_out"] = support.held_out(document)
    report = EvaluationReport.model_validate(document)
    bucket, prefix = s3_layout.parse_s3_uri(request["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"])
    stack["s3"].put_object(Bucket=bucket, Key=prefix + "evaluation.json", Body=report.model_dump_json())


def _entered(execution: Execution, state: str) -> list[float]:
    return [e["timestamp"].timestamp() for e in execution.history
            if e["type"].endswith("StateEntered") and e["stateEnteredEventDetails"]["name"] == state]


def test_two_runs_racing_deploy_one_after_the_other(stack: dict[str, Any], tmp_path: Path,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENDPOINT_POLL_SECONDS", "1")  # real clock: poll the (at once InService) endpoint quickly
    # Short lease waits for a test; the defaults (60 s doubling to 900 s) are for real runs.
    machine = StateMachine.from_file(support.DEFINITION, region=support.REGION, account_id=support.ACCOUNT,
                                     substitutions={**support.substitutions(), "LeaseWaitSeconds": "1",
                                                    "LeaseMaxWaitSeconds": "1", "LeaseMaxWaits": "240"})
    FakeRuntime.answers += [(200, "application/json", json.dumps(DETECTIONS).encode())] * 200
    executions: dict[str, Execution] = {}
    aws = RacingIntegrations(executions, after_job=lambda kind, request: write_evaluation(stack, kind, request))
    started = []
    for version in ("race-a", "race-b"):
        dataset = upload(stack, tmp_path, version)
        trigger = run_start.Trigger(source="s3-event", object_key=dataset.manifest_key,
                                    object_version=dataset.manifest_version)
        execution = machine.start(run_start.execution_input(dataset, trigger),
                                  execution_name=run_ids.run_id_for(dataset.name, dataset.version,
                                                                    dataset.manifest_version),
                                  executors={"arn:aws:states:::lambda:invoke": stack["lambdas"],
                                             "arn:aws:states:::*": aws})
        executions[execution.arn] = execution
        started.append(execution)
    deadline = time.monotonic() + 240
    for execution in started:
        assert execution.wait(max(1.0, deadline - time.monotonic())), f"{execution.name} still running"
        assert execution.status == "SUCCEEDED", (execution.name, execution.error, execution.cause)

    # One of them found the endpoint leased and waited; the other never did.
    first, second = sorted(started, key=lambda e: _entered(e, "Prepare training job")[0])
    assert "Wait for endpoint lease" not in entered_states(first)
    assert entered_states(second).count("Wait for endpoint lease") >= 1
    # Serialised: the second read the champion only after the first released the lease (promoted) ...
    assert _entered(first, "Release endpoint lease")[0] < _entered(second, "Prepare training job")[0]
    # ... so it was evaluated against the first run's model and updated the endpoint the first created.
    record_after_first = json.loads(task_parameters(first, "Promote to champion")[0]["Body"])
    job = stack["sagemaker"].describe_processing_job(
        ProcessingJobName=second.output["plan"]["names"]["evaluation_job"])
    champion_input = next(i for i in job["ProcessingInputs"] if i["InputName"] == "champion")
    assert champion_input["S3Input"]["S3Uri"] == record_after_first["model_data"]
    assert "Update endpoint (blue/green)" in entered_states(second)

    # The end: champion.json names the last deployment, and the endpoint serves exactly that config.
    record = champion(stack)
    assert record.run_id == second.name
    endpoint = stack["sagemaker"].describe_endpoint(EndpointName=support.ENDPOINT_NAME)
    assert endpoint["EndpointConfigName"] == record.endpoint_config_name == \
        second.output["plan"]["names"]["endpoint_config"]
    lease = stack["dynamodb"].get_item(TableName=support.LEASE_TABLE,
                                       Key={"endpoint_name": {"S": support.ENDPOINT_NAME}}, ConsistentRead=True)
    assert "Item" not in lease  # released
