"""Step Functions Local mock configurations: parsing, test case selection, and every path of a
small pipeline-shaped definition run with mocked Return/Throw responses per invocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import AslDefinitionError, Execution, MockConfig, StateMachine, TaskContext

FIXTURES = Path(__file__).parents[1] / "fixtures" / "asl"
DEFINITION = FIXTURES / "mini_pipeline.asl.json"
SUBSTITUTIONS = json.loads((FIXTURES / "mini_pipeline.substitutions.json").read_text())
INPUT = json.loads((FIXTURES / "mini_pipeline.input.json").read_text())
MOCKS = MockConfig.from_file(FIXTURES / "mini_pipeline.mock.json")


def run_case(case: str, **options: Any) -> Execution:
    machine = StateMachine.from_file(DEFINITION, substitutions=SUBSTITUTIONS)
    return machine.run(INPUT, mock=MOCKS.test_case(machine.name, case), execution_name="run-1", **options)


def states_entered(execution: Execution) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in execution.history if e["type"].endswith("StateEntered")]


def test_happy_path_loops_until_the_endpoint_is_in_service() -> None:
    execution = run_case("HappyPath")
    assert execution.status == "SUCCEEDED", execution.cause
    assert execution.output == {"job": "r-train", "model": "s3://artifacts/runs/r/model.tar.gz"}
    assert states_entered(execution) == [
        "Validate dataset", "Dataset valid?", "Train", "Describe endpoint", "In service?", "Wait for endpoint",
        "Describe endpoint", "In service?", "Wait for endpoint", "Describe endpoint", "In service?",
        "Notify success", "Done"]
    scheduled = [json.loads(e["taskScheduledEventDetails"]["parameters"]) for e in execution.history
                 if e["type"] == "TaskScheduled"]
    assert scheduled[0] == {"FunctionName": SUBSTITUTIONS["ValidateFunctionArn"],
                            "Payload": {"prefix": "datasets/shapes/v1/", "run_id": "run-1"}}
    assert scheduled[1] == {"TrainingJobName": "run-1-train"}
    assert scheduled[-1]["Message"] == "run run-1 deployed s3://artifacts/runs/r/model.tar.gz"
    assert (execution.stop_date - execution.start_date).total_seconds() == 60


def test_dataset_rejected() -> None:
    execution = run_case("DatasetRejected")
    assert (execution.status, execution.error, execution.cause) == (
        "FAILED", "DatasetRejected", "s3://artifacts/runs/r/validation/report.json")


def test_a_throttled_lambda_is_retried_with_backoff() -> None:
    execution = run_case("LambdaThrottledThenValid")
    assert execution.status == "SUCCEEDED"
    failures = [e for e in execution.history if e["type"] == "TaskFailed"]
    assert [e["taskFailedEventDetails"]["error"] for e in failures] == ["Lambda.TooManyRequestsException"] * 2
    validate_starts = [e["timestamp"] for e in execution.history if e["type"] == "TaskScheduled"][:3]
    assert [(t - validate_starts[0]).total_seconds() for t in validate_starts] == [0, 2, 6]


def test_training_throttled_then_completed() -> None:
    execution = run_case("TrainingThrottledThenCompleted")
    assert execution.status == "SUCCEEDED"
    errors = [e["taskFailedEventDetails"]["error"] for e in execution.history if e["type"] == "TaskFailed"]
    assert errors == ["ThrottlingException", "ThrottlingException"]


def test_training_failed_reports_the_job_failure_reason() -> None:
    execution = run_case("TrainingFailed")
    assert (execution.status, execution.error) == ("FAILED", "TrainingFailed")
    assert json.loads(execution.cause or "") == {"FailureReason": "AlgorithmError: loss is NaN"}
    assert "Notify training failure" in states_entered(execution)


def test_endpoint_failed() -> None:
    execution = run_case("EndpointFailed")
    assert (execution.status, execution.error, execution.cause) == ("FAILED", "PipelineFailed", "EndpointFailed")


def test_an_invocation_without_a_mocked_response_fails_clearly() -> None:
    execution = run_case("MockTooShort")
    assert execution.error == "States.Runtime"
    assert execution.cause == ("mocked response 'CreatingOnce' of state 'Describe endpoint' has no entry "
                               "for invocation 1 (it has: 0)")


def test_unmocked_tasks_go_to_executors_and_missing_ones_are_refused_up_front() -> None:
    machine = StateMachine.from_file(DEFINITION, substitutions=SUBSTITUTIONS)
    with pytest.raises(AslDefinitionError) as info:
        machine.run(INPUT)
    assert "Task state 'Train': no mocked response and no executor for " \
           "'arn:aws:states:::sagemaker:createTrainingJob.sync'" in str(info.value)
    partial = MOCKS.test_case("mini_pipeline", "DatasetRejected")  # mocks Validate and Notify rejection only
    assert machine.run(INPUT, mock=partial).error == "DatasetRejected"  # the unmocked states are not reached
    mock = MockConfig({"StateMachines": {"m": {"TestCases": {"T": {"Validate dataset": "V"}}}},
                       "MockedResponses": {"V": {"0": {"Return": {"Payload": {"valid": True, "report_uri": "s3://r"}}}}}})
    stuck = machine.run(INPUT, mock=mock.test_case("m", "T"))
    assert (stuck.error, stuck.cause) == ("States.Runtime", "Task state 'Train' is not mocked in test case 'T' and "
                                          "has no executor for 'arn:aws:states:::sagemaker:createTrainingJob.sync'")

    published: list[Any] = []

    def sns(resource: str, parameters: Any, context: TaskContext) -> Any:
        published.append(parameters)
        return {"MessageId": "real"}

    execution = machine.run(INPUT, mock=partial, executors={"arn:aws:states:::*": sns})
    assert execution.error == "DatasetRejected"
    assert published == []  # Notify rejection is mocked, so the executor is not called
    hybrid = machine.run(INPUT, mock=MOCKS.test_case("mini_pipeline", "HappyPath"),
                         executors={"arn:aws-cn:states:::sns:publish": sns})
    assert hybrid.status == "SUCCEEDED" and published == []


def test_a_test_case_naming_an_unknown_state_is_refused() -> None:
    config = MockConfig({"StateMachines": {"m": {"TestCases": {"T": {"Typo state": "R"}}}},
                         "MockedResponses": {"R": {"0": {"Return": 1}}}})
    machine = StateMachine.from_file(DEFINITION, substitutions=SUBSTITUTIONS)
    with pytest.raises(AslDefinitionError, match="mocks 'Typo state', which is not a Task state"):
        machine.run(INPUT, mock=config.test_case("m", "T"))


def test_state_machine_selection_by_name_or_the_only_one() -> None:
    assert MOCKS.test_case("mini_pipeline", "HappyPath").state_machine == "mini_pipeline"
    assert MOCKS.test_case("renamed", "HappyPath").state_machine == "mini_pipeline"  # the only one present
    two = MockConfig({"StateMachines": {"a": {"TestCases": {"T": {}}}, "b": {"TestCases": {"T": {}}}}})
    assert two.test_case("b", "T").state_machine == "b"
    with pytest.raises(AslDefinitionError, match="no state machine named 'c' in the mock config \\(it has: a, b\\)"):
        two.test_case("c", "T")
    with pytest.raises(AslDefinitionError, match="has no test case 'Nope' \\(it has: T\\)"):
        two.test_case("a", "Nope")


@pytest.mark.parametrize(("data", "message"), [
    ({"StateMachines": {}, "Extra": 1}, "mock.json: Extra: Extra inputs are not permitted"),
    ({"MockedResponses": {"R": {"0": {"Return": 1, "Throw": {"Error": "E"}}}}}, "exactly one of Return or Throw"),
    ({"MockedResponses": {"R": {"0": {}}}}, "exactly one of Return or Throw"),
    ({"MockedResponses": {"R": {"0": {"Throw": {"Cause": "no error name"}}}}}, "Error: Field required"),
    ({"MockedResponses": {"R": {"first": {"Return": 1}}}}, "'first' is not an invocation number or range"),
    ({"MockedResponses": {"R": {"3-1": {"Return": 1}}}}, "'3-1' is not an invocation number or range"),
    ({"MockedResponses": {"R": {"0-2": {"Return": 1}, "2": {"Return": 2}}}}, "'2' overlaps another entry"),
    ({"StateMachines": {"m": {"TestCases": {"T": {"S": "Missing"}}}}}, "no MockedResponses entry named 'Missing'"),
])
def test_malformed_mock_configs_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(AslDefinitionError, match=message):
        MockConfig(data, source="mock.json")


def test_mock_config_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(AslDefinitionError, match=r"bad\.json: not valid JSON"):
        MockConfig.from_file(bad)
    with pytest.raises(AslDefinitionError, match="cannot read the mock config"):
        MockConfig.from_file(tmp_path / "absent.json")


def test_null_return_is_a_valid_mocked_result() -> None:
    config = MockConfig({"StateMachines": {"m": {"TestCases": {"T": {"T": "R"}}}},
                         "MockedResponses": {"R": {"0": {"Return": None}}}})
    definition = {"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "arn:aws:states:::x:y", "End": True}}}
    execution = StateMachine.from_definition(definition, name="m").run({"a": 1}, mock=config.test_case("m", "T"))
    assert (execution.status, execution.output) == ("SUCCEEDED", None)
