"""Path tests: the real definition (substituted as template.yaml says) through the ASL interpreter,
with every Task answered by the Step Functions Local mock config in tests/fixtures/pipeline/."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from d2ops.asl.interpreter import Execution
from d2ops_core.champion import ChampionRecord, EndpointRollback, build_history
from tests.fixtures.pipeline import support
from tests.fixtures.pipeline.support import entered_states, run_case, state_output, task_parameters

support.function_path("prepare_training")
from prepare_training.models import Plan, PrepareEvent, PrepareSettings  # noqa: E402
from prepare_training.service import build_plan  # noqa: E402

# Every run past validation takes the endpoint lease first and gives it back after notifying.
LEASE_TAKEN = ["Prepare endpoint lease wait", "Acquire endpoint lease"]
NOTIFIED_RELEASED = ["Compose failure notification", "Notify failure", "Holding endpoint lease?",
                     "Release endpoint lease after failure", "Route failure"]
# Report failure starts by deciding whether the recorded failure needs Describe failure (a caught error to read).
EXPLAINED = ["Failure explained?"]
DESCRIBED = ["Failure explained?", "Describe failure"]
TO_THE_GATE = ["Validate dataset", "Dataset valid?", "Dataset accepted", *LEASE_TAKEN, "Prepare training job",
               "Train model", "Evaluate challenger and champion", "Read evaluation report", "Quality gate"]
TO_TRAINING = TO_THE_GATE[:7]  # through "Train model"
REJECTED_BY_THE_GATE = ["Register model version", "Model approved?", "Record quality gate failure", *EXPLAINED,
                        *NOTIFIED_RELEASED, "Quality gate failed"]


def notified_failure(execution: Execution) -> dict:
    (params,) = task_parameters(execution, "Notify failure")[-1:]
    assert params["TopicArn"] == support.TOPIC_ARN
    message = json.loads(params["Message"])
    # The real compose_notification handler ran. The mocked jobs do not exist in SageMaker, so only a
    # deployment's endpoint time is billed; before one, nothing is.
    cost = message["cost"]
    price = "nothing billed" if cost is None else f"cost ${cost['total_usd']:,.2f}"
    assert params["Subject"] == (f"d2ops run failed: {message['error']} "
                                 f"({message['dataset']['name']} {message['dataset']['version']}, {price})")
    assert message["cost_unknown"] is None
    if cost is None:
        assert message["cost_summary"] == "no SageMaker job ran: nothing billed"
    else:
        assert cost["endpoint"]["seconds"] > 0 and cost["training"] is None
    return message


def assert_failed(execution: Execution, error: str, fail_state: str) -> dict:
    assert execution.status == "FAILED", (execution.error, execution.cause)
    assert execution.error == error
    states = entered_states(execution)
    # The lease is taken right before "Prepare training job": runs that got there give it back.
    released = ["Release endpoint lease after failure"] if "Prepare training job" in states else []
    assert states[-5 - len(released):] == ["Compose failure notification", "Notify failure", "Holding endpoint lease?",
                                           *released, "Route failure", fail_state]
    if released:  # only the lease this execution holds
        (release,) = task_parameters(execution, released[0])
        assert release["ExpressionAttributeValues"] == {":holder": {"S": execution.arn}}
    message = notified_failure(execution)
    assert message["error"] == error and message["cause"] == execution.cause
    assert message["run_id"] == support.RUN_ID and message["dataset"]["name"] == "shapes"
    return message


def test_first_deployment_creates_the_endpoint_and_promotes_the_champion() -> None:
    ex = run_case("FirstDeployment")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    assert "Create endpoint" in states and "Update endpoint (blue/green)" not in states
    assert states.count("Check endpoint status") == 3  # Creating, Creating, InService
    assert states[-5:] == ["Promote to champion", "Release endpoint lease", "Compose success notification",
                           "Notify success", "Run succeeded"]

    (register,) = task_parameters(ex, "Register model version")
    assert register["ModelApprovalStatus"] == "Approved"
    assert register["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"].endswith(
        f"runs/{support.RUN_ID}/evaluation/evaluation.json")
    assert register["ModelPackageGroupName"] == support.substitutions()["ModelPackageGroupName"]
    (create,) = task_parameters(ex, "Create endpoint")
    assert create["EndpointName"] == support.ENDPOINT_NAME

    (promote,) = task_parameters(ex, "Promote to champion")
    assert (promote["Bucket"], promote["Key"]) == (support.ARTIFACTS_BUCKET, "champion.json")
    champion = ChampionRecord.model_validate_json(promote["Body"])  # the record readers parse
    (history,) = task_parameters(ex, "Record endpoint history")  # written first, never overwritten
    assert history["Key"] == f"endpoint-history/{support.ENDPOINT_NAME}/promoted-{support.RUN_ID}.json"
    assert ChampionRecord.model_validate_json(history["Body"]) == champion
    assert champion.run_id == support.RUN_ID and champion.primary_metric == "bbox_AP"
    assert champion.primary_value == 0.71 and champion.gate.approval_status == "Approved"
    assert champion.model_data.endswith("/output/model.tar.gz") and champion.endpoint_name == support.ENDPOINT_NAME
    (notify,) = task_parameters(ex, "Notify success")
    message = json.loads(notify["Message"])
    assert message["dataset"]["version"] == "v1" and message["run_id"] == support.RUN_ID
    # The endpoint's time so far, from entering "Create endpoint" to composing the notification,
    # priced like GET /runs/{id}; the mocked jobs do not exist in SageMaker, so they are not in it.
    endpoint = message["cost"]["endpoint"]
    assert endpoint["instance_type"] == state_output(ex, "Prepare training job")["plan"]["endpoint"]["instance_type"]
    assert endpoint["seconds"] > 0 and message["cost"]["total_usd"] == endpoint["cost_usd"] > 0
    assert notify["Subject"] == f"d2ops: shapes v1 deployed (cost ${message['cost']['total_usd']:,.2f})"
    # The whole run's payload stays far below the 256 KB limit: documents travel as S3 URIs.
    assert len(json.dumps(ex.output)) < 32 * 1024


def test_update_deployment_is_blue_green_with_alarm_rollback() -> None:
    ex = run_case("UpdateDeployment")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    assert "Update endpoint (blue/green)" in states and "Create endpoint" not in states
    (update,) = task_parameters(ex, "Update endpoint (blue/green)")
    config = update["DeploymentConfig"]
    policy = config["BlueGreenUpdatePolicy"]
    routing = policy["TrafficRoutingConfiguration"]
    # The plan's routing, passed on as is: this plan's one instance cannot take a canary (SageMaker
    # refuses one over 50 % of the variant's instances), so all at once with the same bake.
    plan = state_output(ex, "Prepare training job")["plan"]["endpoint"]
    assert plan["instance_count"] == 1 and routing == plan["traffic_routing"]
    assert routing == {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600}
    # The bake outlasts a poll plus the smoke test (tests/unit/test_pipeline_canary.py checks the budgets).
    assert routing["WaitIntervalInSeconds"] >= 10 * plan["poll_seconds"]
    assert policy["MaximumExecutionTimeoutInSeconds"] >= routing["WaitIntervalInSeconds"]
    assert [a["AlarmName"] for a in config["AutoRollbackConfiguration"]["Alarms"]] == [
        "d2ops-EndpointErrorAlarm-1", "d2ops-EndpointLatencyAlarm-1", "d2ops-SmokeTestAlarm-1"]
    assert update["EndpointConfigName"] == state_output(ex, "Prepare training job")["plan"]["names"]["endpoint_config"]
    assert ex.output["gate"]["decision"] == "approved"


def test_training_throttled_twice_then_succeeds_with_backoff() -> None:
    ex = run_case("TrainingThrottledThenSucceeds")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    assert len(task_parameters(ex, "Train model")) == 3
    scheduled = [datetime.fromisoformat(str(e["timestamp"])) if isinstance(e["timestamp"], str) else e["timestamp"]
                 for e in ex.history if e["type"] == "TaskScheduled"
                 and json.loads(e["taskScheduledEventDetails"]["parameters"]).get("TrainingJobName")]
    assert len(scheduled) == 3 and scheduled[1] > scheduled[0] and scheduled[2] > scheduled[1]
    # The same job name on every attempt: a throttled CreateTrainingJob created nothing.
    assert len({p["TrainingJobName"] for p in task_parameters(ex, "Train model")}) == 1


def test_invalid_dataset_is_rejected_with_its_report() -> None:
    ex = run_case("DatasetRejected")
    message = assert_failed(ex, "DatasetRejected", "Dataset rejected")
    assert message["report_uri"].endswith(f"runs/{support.RUN_ID}/validation/report.json")
    assert message["first_errors"][0]["code"] == "BBOX_OUTSIDE_IMAGE"
    assert "failed validation with 2 errors" in ex.cause
    assert entered_states(ex) == ["Validate dataset", "Dataset valid?", "Record dataset rejection", *EXPLAINED,
                                  "Compose failure notification", "Notify failure", "Holding endpoint lease?",
                                  "Route failure", "Dataset rejected"]


@pytest.mark.parametrize(("case", "error", "described"), [
    ("DatasetRejected", "DatasetRejected", False),  # its validation report explains it
    ("GateFailedThreshold", "QualityGateFailed", False),  # the gate's reason
    ("EndpointBusy", "EndpointBusy", False),  # who held the lease, through how many waits
    ("TrainingFailed", "TrainingFailed", True),  # the job's FailureReason is in the caught error
    ("ManifestMissing", "DatasetRejected", True),  # unreadable: no report, the Lambda's message is in the error
])
def test_only_failures_their_record_does_not_explain_are_described(case: str, error: str, described: bool) -> None:
    """Report failure keeps the old records' routing: a rejected dataset with its report, a refused model and a
    busy endpoint go straight to the notification; every other failure (an unreadable dataset included, the same
    error name without a report) is described from its caught error first."""
    ex = run_case(case)
    assert ex.status == "FAILED" and ex.error == error, (ex.error, ex.cause)
    states = entered_states(ex)
    after = states[states.index("Failure explained?") + 1]
    assert after == ("Describe failure" if described else "Compose failure notification")
    assert ("Describe failure" in states) is described


def test_missing_manifest_is_rejected_with_the_lambda_error() -> None:
    ex = run_case("ManifestMissing")
    assert_failed(ex, "DatasetRejected", "Dataset rejected")
    assert "manifest.json does not exist" in ex.cause
    # The function's message, not its error document (errorType, requestId, stackTrace).
    assert "stackTrace" not in ex.cause and "requestId" not in ex.cause and "\n" not in ex.cause


def test_a_failing_notification_keeps_the_original_error() -> None:
    ex = run_case("DatasetRejectedNotificationDown")
    assert ex.status == "FAILED" and ex.error == "DatasetRejected"
    assert len(task_parameters(ex, "Notify failure")) == 4  # the first try and 3 retries


def test_training_failure_ends_in_training_failed_with_the_reason() -> None:
    ex = run_case("TrainingFailed")
    assert_failed(ex, "TrainingFailed", "Training failed")
    assert "CUDA out of memory" in ex.cause and support.RUN_ID.replace("_", "-") in ex.cause
    # One line from the job's FailureReason, not the whole DescribeTrainingJob answer.
    assert ex.cause == (f"training job {support.RUN_ID.replace('_', '-')}-train failed (States.TaskFailed): "
                        "AlgorithmError: CUDA out of memory (see /opt/ml/output/failure)")
    assert len(task_parameters(ex, "Train model")) == 1, "a failed job is not retried"
    assert entered_states(ex) == [*TO_TRAINING, "Record training failure", *DESCRIBED, *NOTIFIED_RELEASED,
                                  "Training failed"]


def test_evaluation_failure() -> None:
    ex = run_case("EvaluationFailed")
    assert_failed(ex, "EvaluationFailed", "Evaluation failed")
    assert "has no model.pt" in ex.cause
    assert entered_states(ex) == [*TO_TRAINING, "Evaluate challenger and champion", "Record evaluation failure",
                                  *DESCRIBED, *NOTIFIED_RELEASED, "Evaluation failed"]


def test_gate_below_threshold_registers_rejected_then_fails() -> None:
    ex = run_case("GateFailedThreshold")
    message = assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    assert ex.cause == "challenger bbox_AP 0.210 is below the threshold 0.3"  # the Lambda's gate_reason
    (register,) = task_parameters(ex, "Register model version")
    assert register["ModelApprovalStatus"] == "Rejected"
    assert message["model_package_arn"].endswith("/2")
    # Registered as Rejected, and nothing of the endpoint was touched.
    assert entered_states(ex) == [*TO_THE_GATE, "Below quality threshold", *REJECTED_BY_THE_GATE]


def test_gate_regression_against_the_champion_fails() -> None:
    ex = run_case("GateFailedRegression")
    assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    # 0.6 clears the threshold 0.3: only the interval of the difference, wholly below -0.01, rejects it;
    # the reason quotes it (no count of more val images: they would not change a refusal beyond doubt).
    assert ex.cause == ("challenger bbox_AP 0.600 vs champion 0.620: difference -0.020, 95% interval [-0.034, -0.012], "
                        "beyond the tolerance 0.01")
    assert entered_states(ex) == [*TO_THE_GATE, "Worse than champion", *REJECTED_BY_THE_GATE]
    (register,) = task_parameters(ex, "Register model version")
    assert register["ModelApprovalStatus"] == "Rejected"


def test_a_class_regression_fails_the_gate_naming_the_class() -> None:
    ex = run_case("GateFailedClassRegression")
    assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    # Primary AP 0.66 beats the champion's 0.62: only the per-class comparison rejects it, and the
    # 12-instance class (below MinClassInstances 30) is not judged although its AP dropped 0.18.
    assert ex.cause == ("challenger bbox_AP trails the champion by more than 0.1 on 1 class (challenger vs champion): "
                        "disc 0.410 vs 0.600, difference -0.190, 97.5% interval [-0.290, -0.110] (41 instances); "
                        "overall vs champion 0.620: difference 0.040, 95% interval [-0.020, 0.100]")
    assert entered_states(ex) == [*TO_THE_GATE, "Worse than champion on a class", *REJECTED_BY_THE_GATE]
    (register,) = task_parameters(ex, "Register model version")
    assert register["ModelApprovalStatus"] == "Rejected"
    assert "disc 0.410 vs 0.600" in register["ModelPackageDescription"]


def test_a_mocked_validation_code_must_be_one_the_validator_has() -> None:
    support.function_path("validate_dataset")
    from pydantic import ValidationError
    from validate_dataset.models import IssueSummary

    IssueSummary(code="BBOX_OUTSIDE_IMAGE", message="m", location="l")
    with pytest.raises(ValidationError, match="code"):
        IssueSummary(code="ANNOTATION_BBOX_OUT_OF_BOUNDS", message="m", location="l")


def test_smoke_test_failure_rolls_back_to_the_previous_config() -> None:
    ex = run_case("SmokeTestFailsRollsBack")
    message = assert_failed(ex, "DeploymentFailed", "Deployment failed")
    (rollback,) = task_parameters(ex, "Roll back endpoint")
    assert rollback == {"EndpointName": support.ENDPOINT_NAME,
                        "EndpointConfigName": "shapes-v0-0123456789abcdef-config"}
    # The config the endpoint served before this run (found before the update), not the new one.
    previous = state_output(ex, "Find current endpoint")["previous_endpoint"]["endpoint_config"]
    (update,) = task_parameters(ex, "Update endpoint (blue/green)")
    assert rollback["EndpointConfigName"] == previous != update["EndpointConfigName"]
    # The bake had ended (InService on the new config): updated back, and waited for until verified.
    states = entered_states(ex)
    start = states.index("Smoke test endpoint")
    assert states[start:start + 8] == ["Smoke test endpoint", "Undo deployment", "Roll back endpoint",
                                       "Start waiting for rollback", "Wait for rollback", "Check rollback",
                                       "Count rollback check", "Rolled back?"]
    assert states[start + 8: start + 10] == ["Record rolled-back deployment", "Record rollback in endpoint history"]
    (history,) = task_parameters(ex, "Record rollback in endpoint history")
    assert history["Key"] == f"endpoint-history/{support.ENDPOINT_NAME}/rolled-back-{support.RUN_ID}.json"
    record = EndpointRollback.model_validate_json(history["Body"])  # the record the status API reads
    assert record.endpoint_name == support.ENDPOINT_NAME and "SmokeTestFailed" in record.cause
    assert record.rollback and record.rollback["action"] == "rolled back to the previous endpoint config"
    assert "Trip smoke test alarm" not in states
    assert message["rollback"]["action"] == "rolled back to the previous endpoint config"
    assert "SmokeTestFailed" in ex.cause
    assert "Promote to champion" not in entered_states(ex)


def test_canary_passing_its_smoke_test_during_the_bake_is_promoted_once_it_serves_everyone() -> None:
    ex = run_case("CanaryPassesDuringBake")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    # Checks: Creating (wait), Baking (smoke test), ActivatingTraffic (wait), InService on the new config.
    assert states.count("Check endpoint status") == 4 and states.count("Smoke test endpoint") == 1
    smoke = states.index("Smoke test endpoint")
    assert states[smoke - 1] == "Canary baking?" and states[smoke + 1] == "Deployment complete?"
    assert states[smoke + 2] == "Wait for endpoint"
    assert state_output(ex, "Smoke test endpoint")["smoke_test"]["requests"] == 24
    (smoke_params,) = task_parameters(ex, "Smoke test endpoint")
    assert smoke_params["Payload"]["requests"] == 24
    assert "Record champion" in states and "Undo deployment" not in states
    # A two-instance plan: a 25 % canary, passed on to UpdateEndpoint as planned.
    (update,) = task_parameters(ex, "Update endpoint (blue/green)")
    routing = update["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]
    assert routing == state_output(ex, "Prepare training job")["plan"]["endpoint"]["traffic_routing"]
    assert routing["Type"] == "CANARY" and routing["CanarySize"] == {"Type": "CAPACITY_PERCENT", "Value": 25}


def test_canary_failing_its_smoke_test_is_rolled_back_by_the_alarm_and_verified() -> None:
    ex = run_case("CanarySmokeTestFailsDuringBake")
    message = assert_failed(ex, "DeploymentFailed", "Deployment failed")
    states = entered_states(ex)
    assert "Roll back endpoint" not in states  # UpdateEndpoint is refused while the canary bakes
    (metric,) = task_parameters(ex, "Report smoke test failure")
    assert metric["Namespace"] == "d2ops/Deployment"
    assert metric["MetricData"][0]["Dimensions"] == [{"Name": "EndpointName", "Value": support.ENDPOINT_NAME}]
    (trip,) = task_parameters(ex, "Trip smoke test alarm")
    assert (trip["AlarmName"], trip["StateValue"]) == ("d2ops-SmokeTestAlarm-1", "ALARM")
    # Not failed until DescribeEndpoint shows the previous config in service: Baking, RollingBack, InService.
    assert states.count("Check rollback") == 3
    assert states[states.index("Rolled back?", len(states) - states[::-1].index("Check rollback") - 1) + 1] == \
        "Record rolled-back deployment"
    assert "SmokeTestFailed" in ex.cause
    assert message["rollback"]["action"].startswith("tripped the smoke test alarm")
    assert "Promote to champion" not in states


def test_smoke_test_failure_on_first_deployment_deletes_the_endpoint() -> None:
    ex = run_case("SmokeTestFailsFirstDeployment")
    message = assert_failed(ex, "DeploymentFailed", "Deployment failed")
    assert task_parameters(ex, "Delete new endpoint") == [{"EndpointName": support.ENDPOINT_NAME}]
    assert message["rollback"] == {"action": "deleted the new endpoint"}
    assert "Roll back endpoint" not in entered_states(ex)


def test_update_rolled_back_by_alarms_is_a_deployment_failure_recorded_in_the_endpoint_history() -> None:
    ex = run_case("UpdateRolledBackByAlarms")
    message = assert_failed(ex, "DeploymentFailed", "Deployment failed")
    assert "an alarm rolled the update back" in ex.cause
    states = entered_states(ex)
    assert "Smoke test endpoint" not in states and "Roll back endpoint" not in states
    rolled_back = states.index("Endpoint rolled back by alarms")
    assert states[rolled_back:rolled_back + 6] == ["Endpoint rolled back by alarms", "Find rollback alarms",
                                                   "Record alarm rollback", "Record rollback in endpoint history",
                                                   *DESCRIBED]
    (lookup,) = task_parameters(ex, "Find rollback alarms")
    assert lookup == {"AlarmNames": ["d2ops-EndpointErrorAlarm-1", "d2ops-EndpointLatencyAlarm-1",
                                     "d2ops-SmokeTestAlarm-1"], "StateValue": "ALARM"}
    (history,) = task_parameters(ex, "Record rollback in endpoint history")
    assert history["Key"] == f"endpoint-history/{support.ENDPOINT_NAME}/rolled-back-{support.RUN_ID}.json"
    # The same record shape as the pipeline's own rollback, read back through the status API's model.
    record = EndpointRollback.model_validate_json(history["Body"])
    assert record.rolled_back_by == "alarm" and record.alarms == ["d2ops-EndpointLatencyAlarm-1"]
    previous = state_output(ex, "Find current endpoint")["previous_endpoint"]["endpoint_config"]
    assert record.kept_serving == previous
    assert record.rollback is not None and record.rollback["failure_reason"] == []  # DescribeEndpoint gave none
    assert record.rollback["alarm_reasons"][0].startswith("Threshold Crossed")
    attempt = build_history(support.ENDPOINT_NAME, [], [record]).rolled_back[0]
    assert (attempt.run_id, attempt.alarms, attempt.kept_serving) == (support.RUN_ID, record.alarms, previous)
    assert message["rolled_back_by"] == "alarm"


def test_alarm_rollback_is_recorded_even_when_its_alarms_cannot_be_read() -> None:
    ex = run_case("UpdateRolledBackAlarmsUnreadable")
    assert_failed(ex, "DeploymentFailed", "Deployment failed")
    assert "Rollback alarms unreadable" in entered_states(ex)
    (history,) = task_parameters(ex, "Record rollback in endpoint history")
    record = EndpointRollback.model_validate_json(history["Body"])
    assert record.rolled_back_by == "alarm" and record.alarms == []
    assert record.rollback is not None
    assert record.rollback["alarm_reasons"] == [
        "the rollback alarms could not be read (CloudWatch.CloudWatchException)"]


def test_endpoint_wait_is_bounded() -> None:
    ex = run_case("EndpointNeverInService")
    assert_failed(ex, "DeploymentFailed", "Deployment failed")
    assert entered_states(ex).count("Check endpoint status") == 4  # ENDPOINT_MAX_WAIT_ATTEMPTS in the tests
    assert "is Creating after 4 checks" in ex.cause


def test_the_mocked_plan_is_what_the_prepare_lambda_builds() -> None:
    """The mock config's prepare answers are the real build_plan output, so path tests use real requests."""
    config = json.loads(support.MOCK_CONFIG.read_text())
    mocked = config["MockedResponses"]["PlanFirstRun"]["0"]["Return"]["Payload"]
    settings = PrepareSettings.from_env(support.PREPARE_ENV)
    event = PrepareEvent(run_id=support.RUN_ID, dataset=support.DATASET, manifest={"task": "detection"},
                         validation=support.load_event("prepare_training", "defaults")["validation"])
    assert mocked == build_plan(settings, event, None).model_dump(mode="json")
    with_champion = Plan.model_validate(config["MockedResponses"]["PlanWithChampion"]["0"]["Return"]["Payload"])
    assert with_champion.champion is not None
    inputs = {i["InputName"] for i in with_champion.evaluation_job["ProcessingInputs"]}
    assert inputs == {"challenger", "champion", "dataset"}


def test_every_mocked_lambda_answer_is_a_valid_lambda_output() -> None:
    support.function_path("summarize_evaluation")
    support.function_path("smoke_test_endpoint")
    support.function_path("validate_dataset")
    from smoke_test_endpoint.models import SmokeTestResult
    from summarize_evaluation.models import EvaluationSummary
    from validate_dataset.models import ValidationSummary

    from d2ops_core.validation.inventory import ImageBatchResult

    models = {"Validate dataset": ValidationSummary, "Prepare training job": Plan,
              "Read evaluation report": EvaluationSummary, "Smoke test endpoint": SmokeTestResult,
              "Check image batch": ImageBatchResult, "Summarize image checks": ValidationSummary}
    config = json.loads(support.MOCK_CONFIG.read_text())
    checked = 0
    for case in config["StateMachines"]["training_pipeline"]["TestCases"].values():
        for state, response in case.items():
            if state not in models:
                continue
            for entry in config["MockedResponses"][response].values():
                if "Return" in entry:
                    models[state].model_validate(entry["Return"]["Payload"])
                    checked += 1
    assert checked > 20


def test_the_lease_is_taken_before_the_champion_is_read_and_released_after_promotion() -> None:
    ex = run_case("FirstDeployment")
    states = entered_states(ex)
    assert states.index("Acquire endpoint lease") < states.index("Prepare training job")  # reads champion.json
    assert states.index("Promote to champion") < states.index("Release endpoint lease")
    (acquire,) = task_parameters(ex, "Acquire endpoint lease")
    assert acquire["TableName"] == support.LEASE_TABLE
    assert acquire["Key"] == {"endpoint_name": {"S": support.ENDPOINT_NAME}}
    # Free, or already ours (a retried write whose response was lost); never another run's.
    assert acquire["ConditionExpression"] == "attribute_not_exists(#holder) OR #holder = :holder"
    assert acquire["ExpressionAttributeValues"][":holder"] == {"S": ex.arn}
    (release,) = task_parameters(ex, "Release endpoint lease")
    assert release["ConditionExpression"] == "#holder = :holder"
    assert release["ExpressionAttributeValues"] == {":holder": {"S": ex.arn}}


def test_a_lease_left_by_an_ended_run_is_cleared_and_taken() -> None:
    ex = run_case("StaleLeaseCleared")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    assert states[2:10] == ["Dataset accepted", "Prepare endpoint lease wait", "Acquire endpoint lease",
                            "Read endpoint lease", "Endpoint lease still held?", "Check lease holder",
                            "Lease holder running?", "Clear stale endpoint lease"]
    assert states[10:12] == ["Acquire endpoint lease", "Prepare training job"]  # no waiting
    (clear,) = task_parameters(ex, "Clear stale endpoint lease")
    (check,) = task_parameters(ex, "Check lease holder")
    # Only the ended holder's lease, whoever else may have taken it since.
    assert clear["ExpressionAttributeValues"] == {":holder": {"S": check["ExecutionArn"]}} != {":holder": {"S": ex.arn}}


def test_a_run_that_finds_the_endpoint_busy_waits_with_backoff_then_fails_endpoint_busy() -> None:
    ex = run_case("EndpointBusy")
    message = assert_failed(ex, "EndpointBusy", "Endpoint busy")
    waits = [e for e in ex.history if e["type"] == "WaitStateEntered"]
    seconds = [json.loads(e["stateEnteredEventDetails"]["input"])["lease_wait"]["seconds"] for e in waits]
    # template.yaml's defaults: 60 s doubling up to 900 s, 60 waits; then the run gives up.
    assert seconds[:6] == [60, 120, 240, 480, 900, 900] and len(seconds) == 60 and max(seconds) == 900
    assert "Prepare training job" not in entered_states(ex)  # nothing trained, nothing to release
    assert "Release endpoint lease after failure" not in entered_states(ex)
    assert message["cause"] == ex.cause and "stayed leased to arn:aws:states:" in ex.cause
    assert ex.cause.endswith("through 60 waits for the lease")


def test_creates_retried_after_lost_responses_find_what_they_created_and_deploy() -> None:
    ex = run_case("CreatesRetriedAfterLostResponses")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    # Each create was sent until its Retry gave up (the first answer lost, every retry told the name is taken) ...
    assert len(task_parameters(ex, "Create model")) == len(task_parameters(ex, "Create endpoint config")) == 5
    # ... and the run looked at what the first attempt made, found it is its own, and went on.
    i = states.index("Model already created?")
    assert states[i:i + 4] == ["Model already created?", "Find created model", "Created model is ours?",
                               "Create endpoint config"]
    assert states.count("Find created endpoint config") == 1 and "Create endpoint" in states
    (find,) = task_parameters(ex, "Find created endpoint config")
    assert find == {"EndpointConfigName": "shapes-v1-bf3cc289798108cc-config"}


def test_a_version_with_pending_images_goes_through_the_distributed_map_and_back() -> None:
    """images_pending: Check images (ItemReader over the items file, 50 a batch) then Summarize image checks,
    whose final summary Dataset valid? judges; training starts only after it, on the snapshot it names."""
    ex = run_case("ImagesCheckedByTheMap")
    assert ex.status == "SUCCEEDED", ex.cause
    states = entered_states(ex)
    assert states[:4] == ["Validate dataset", "Dataset valid?", "Check images", "Summarize image checks"]
    assert states[4] == "Dataset valid?" and states.count("Check images") == 1
    assert states.index("Summarize image checks") < states.index("Prepare training job")
    batches = task_parameters(ex, "Check image batch")
    assert [len(b["Payload"]["Items"]) for b in batches] == [50, 10]  # 60 items, MaxItemsPerBatch 50
    assert {json.dumps(b["Payload"]["BatchInput"], sort_keys=True) for b in batches} == {json.dumps(
        {"bucket": support.DATA_BUCKET, "prefix": support.DATASET.prefix, "run_id": support.RUN_ID}, sort_keys=True)}
    (summarize,) = task_parameters(ex, "Summarize image checks")
    details = summarize["Payload"]["result_writer"]
    assert details["Bucket"] == support.ARTIFACTS_BUCKET
    assert details["Key"].startswith(f"runs/{support.RUN_ID}/validation/image-results/")
    assert details["Key"].endswith("/manifest.json")
    (prepare,) = task_parameters(ex, "Prepare training job")
    assert prepare["Payload"]["validation"]["images_pending"] is False  # the final summary, not the pending one
    assert prepare["Payload"]["validation"]["snapshot_uri"].endswith(f"runs/{support.RUN_ID}/dataset/")
    (register,) = task_parameters(ex, "Register model version")
    assert register["CustomerMetadataProperties"]["inventory_digest"].startswith("sha256:")


def test_a_failed_image_batch_fails_the_run_with_the_batch_s_own_error() -> None:
    """ToleratedFailureCount 0: one child failing (after its retries) fails the Map with
    States.ExceedToleratedFailureThreshold, which says nothing about images; Explain failed image checks
    is handed that error and raises the first failed batch's own, which the run's failure names."""
    ex = run_case("ImageBatchFails")
    assert ex.status == "FAILED" and ex.error == "ValidationFailed", (ex.error, ex.cause)
    states = entered_states(ex)
    assert "Summarize image checks" not in states and "Prepare training job" not in states
    assert states.index("Check images") < states.index("Explain failed image checks") < states.index(
        "Record validation error")
    (explain,) = task_parameters(ex, "Explain failed image checks")
    assert explain["Payload"]["map_error"]["Error"] == "States.ExceedToleratedFailureThreshold"
    assert explain["Payload"]["run_id"] == support.RUN_ID
    assert "ImageChecksFailed" in ex.cause and "the batch Lambda crashed" in ex.cause, ex.cause


# ----- a person decides what the gate could not (decision "review") ---------------------------------------
ALICE = "arn:aws:sts::123456789012:assumed-role/d2ops-ReviewerRole-1A2B3C/alice"
BOB = "arn:aws:sts::123456789012:assumed-role/d2ops-ReviewerRole-1A2B3C/bob"
TO_THE_REVIEW = [*TO_THE_GATE, "Needs review", "Register model version", "Model approved?", "Prepare review wait",
                 "Wait for review", "Read review decision", "Record review in registry", "Review approved?"]
PACKAGE = "arn:aws:sagemaker:us-east-1:123456789012:model-package/d2ops-models/2"


def _mocked(name: str) -> dict:
    return dict(json.loads(support.MOCK_CONFIG.read_text())["MockedResponses"][name]["0"]["Return"])


def _registry_update(ex: Execution) -> dict:
    (update,) = task_parameters(ex, "Record review in registry")
    return dict(update)


def test_the_gate_s_review_waits_for_a_person_with_the_token_and_what_is_to_be_decided() -> None:
    """What "Wait for review" sends the request Lambda is its input model whole (a payload drifting from
    RequestReviewEvent would fail the real invocation), with this attempt's token, and it waits for
    ReviewTimeoutSeconds (604800, the stack's default) from the definition's TimeoutSecondsPath."""
    support.function_path("request_review")
    from request_review.models import RequestReviewEvent

    ex = run_case("ReviewApproved")
    (register,) = task_parameters(ex, "Register model version")
    assert register["ModelApprovalStatus"] == "PendingManualApproval"
    (wait,) = task_parameters(ex, "Wait for review")
    assert wait["FunctionName"] == support.substitutions()["RequestReviewFunctionArn"]
    event = RequestReviewEvent.model_validate(wait["Payload"])
    gate = _mocked("GateNeedsReview")["Payload"]
    assert (event.run_id, event.execution_arn, event.model_package_arn) == (support.RUN_ID, ex.arn, PACKAGE)
    assert (event.gate_reason, event.review_because) == (gate["gate_reason"], ["uncertain", "too_few_images"])
    assert event.timeout_seconds == 604800 and event.images_compared == 40
    assert event.task_token and event.dataset.name == "shapes"
    scheduled = [e for e in ex.history if e["type"] == "TaskScheduled"
                 and json.loads(e["taskScheduledEventDetails"]["parameters"]).get("Payload", {}).get("task_token")]
    assert [e["taskScheduledEventDetails"]["timeoutInSeconds"] for e in scheduled] == [604800]


def test_a_review_approved_by_a_person_deploys_and_records_who_approved_and_why() -> None:
    """Mutation: the person's approval not reaching the registry (still PendingManualApproval, which SageMaker
    will not deploy) or the champion record / endpoint history naming the gate's numbers instead of the
    reviewer."""
    ex = run_case("ReviewApproved")
    assert ex.status == "SUCCEEDED", (ex.error, ex.cause)
    states = entered_states(ex)
    assert states[:len(TO_THE_REVIEW) + 2] == [*TO_THE_REVIEW, "Ready to deploy", "Create model"]
    assert "Update endpoint (blue/green)" in states and states[-1] == "Run succeeded"
    decision = _mocked("ReviewApprovedByAlice")
    assert ex.output["review"] == decision  # the callback's output, whole, where the status API reads it
    said = f"approved by {ALICE}: {decision['reason']}"
    assert _registry_update(ex) == {"ModelPackageArn": PACKAGE, "ModelApprovalStatus": "Approved",
                                    "ApprovalDescription": said}
    (promote,) = task_parameters(ex, "Promote to champion")
    champion = ChampionRecord.model_validate_json(promote["Body"])
    assert champion.gate.decision == "approved" and champion.gate.approval_status == "Approved"
    assert (champion.gate.decided_by, champion.gate.review_reason) == (ALICE, decision["reason"])
    assert champion.gate.decided_at == decision["decided_at"]
    assert champion.gate.reason.startswith(said + "; the gate asked for a review: needs a person's review")
    (history,) = task_parameters(ex, "Record endpoint history")
    served = build_history(support.ENDPOINT_NAME, [ChampionRecord.model_validate_json(history["Body"])], []).served
    assert served[0].approved_by == ALICE and served[0].promoted_because == champion.gate.reason
    (notify,) = task_parameters(ex, "Notify success")
    message = json.loads(notify["Message"])
    assert message["review"] == f"approved by {ALICE} at {decision['decided_at']}: {decision['reason']}"


def test_a_review_rejected_by_a_person_fails_the_gate_naming_who_rejected_it_and_why() -> None:
    ex = run_case("ReviewRejected")
    message = assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    decision = _mocked("ReviewRejectedByBob")
    said = f"rejected by {BOB}: {decision['reason']}"
    assert ex.cause.startswith(said + "; the gate asked for a review: ")
    assert _registry_update(ex) == {"ModelPackageArn": PACKAGE, "ModelApprovalStatus": "Rejected",
                                    "ApprovalDescription": said}
    assert entered_states(ex) == [*TO_THE_REVIEW, "Record quality gate failure", *EXPLAINED, *NOTIFIED_RELEASED,
                                  "Quality gate failed"]
    assert message["gate"]["decided_by"] == BOB and message["model_package_arn"] == PACKAGE
    assert message["review"] == f"rejected by {BOB} at {decision['decided_at']}: {decision['reason']}"
    # The notification still quotes the interval the gate could not settle, and how many images would.
    assert message["gate_comparison"] == ("bbox_AP challenger - champion: difference 0.020, 95% interval "
                                          "[-0.025, 0.065] on 40 val images; wider than the tolerance \u00b10.01: "
                                          "about 770 more val images would narrow it")


def test_a_review_nobody_decides_in_time_is_refused_saying_so() -> None:
    """The wait's time-out (States.Timeout, as a callback task reports either of its limits) is the run's
    answer: registered Rejected, QualityGateFailed, the lease given back; never a deployment."""
    ex = run_case("ReviewTimedOut")
    message = assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    assert ex.cause.startswith("no decision within 7 days: refused; the gate asked for a review: ")
    assert _registry_update(ex)["ModelApprovalStatus"] == "Rejected"
    assert _registry_update(ex)["ApprovalDescription"] == "rejected: no decision within 7 days"
    assert "Create model" not in entered_states(ex)
    assert message["gate"]["decided_by"] is None and message["review"] == ex.cause


def test_a_review_ended_by_send_task_failure_is_refused_with_its_error() -> None:
    ex = run_case("ReviewWithdrawn")
    assert_failed(ex, "QualityGateFailed", "Quality gate failed")
    assert ex.cause.startswith("the review ended without a decision (ReviewWithdrawn: the dataset was uploaded by "
                               "mistake): refused")
    assert _registry_update(ex)["ApprovalDescription"] == (
        "rejected: the review ended without a decision (ReviewWithdrawn: the dataset was uploaded by mistake)")


def test_an_approval_the_registry_will_not_record_is_not_deployed() -> None:
    """SageMaker deploys only an Approved package: a refused UpdateModelPackage ends RegistrationFailed after its
    retries, described from the caught error, never a deployment of a package still pending."""
    ex = run_case("ReviewApprovedRegistryRefuses")
    assert_failed(ex, "RegistrationFailed", "Registration failed")
    assert len(task_parameters(ex, "Record review in registry")) == 5  # the first try and 4 retries
    states = entered_states(ex)
    assert "Create model" not in states and states[states.index("Record review failure") + 1:][:2] == DESCRIBED
    assert ex.cause.startswith("recording the review decision failed (SageMaker.SageMakerException)")


def test_every_mocked_review_answer_is_a_decision_the_status_api_sends() -> None:
    from d2ops_core.documents.review import ReviewDecision

    for name in ("ReviewApprovedByAlice", "ReviewRejectedByBob"):
        ReviewDecision.model_validate(_mocked(name))


def test_a_task_nobody_mocked_fails_saying_where_its_answer_goes() -> None:
    with pytest.raises(AssertionError, match=r"mock its state in tests/fixtures/pipeline/training_pipeline\.mock"):
        support._unexpected("arn:aws:states:::lambda:invoke", {"FunctionName": "EchoCheckFunction"}, None)
