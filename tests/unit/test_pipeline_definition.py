"""Static contract tests of statemachine/training_pipeline.asl.json (no execution)."""

from __future__ import annotations

import json
import re
import subprocess
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops import template as sam
from d2ops.asl.choice import evaluate_rule
from d2ops.asl.substitution import placeholders, substitute
from d2ops_core import run_ids
from d2ops_core.pipeline_stages import FAILURE_RECORDS, STAGES, all_states, stage_of
from tests.fixtures.pipeline import support

support.function_path("prepare_training")
support.function_path("summarize_evaluation")
support.function_path("smoke_test_endpoint")
support.function_path("validate_dataset")
from prepare_training.models import Plan, PrepareEvent  # noqa: E402
from smoke_test_endpoint.models import SmokeTestEvent, SmokeTestResult  # noqa: E402
from summarize_evaluation.models import EvaluationSummary, SummarizeEvent  # noqa: E402
from validate_dataset.models import SummarizeImagesEvent, ValidateDatasetEvent  # noqa: E402

support.function_path("check_images")
from check_images.models import BatchInput  # noqa: E402

support.function_path("request_review")
from request_review.models import ReadDecisionEvent, RequestReviewEvent, ReviewedGate  # noqa: E402

TEXT = support.DEFINITION.read_text()
DEFINITION = json.loads(TEXT)
STATES: dict[str, dict[str, Any]] = all_states(DEFINITION)
ASL_VALIDATOR = support.REPO / "tools" / "node_modules" / ".bin" / "asl-validator"
# The errors a failed run ends with, as people, alarms and docs/pipeline.md name them: pinned here on purpose, not
# read from training_pipeline.FAILURE_KINDS (which generates them), so renaming or dropping one is a reviewed edit.
FAILURE_ERRORS = {"DatasetRejected", "ValidationFailed", "PreparationFailed", "TrainingFailed", "EvaluationFailed",
                  "QualityGateFailed", "RegistrationFailed", "DeploymentFailed", "PromotionFailed", "PipelineFailed",
                  "NotificationFailed", "EndpointBusy", "EndpointLeaseFailed"}


def _scopes(machine: dict[str, Any], owner: str | None = None) -> Iterator[tuple[dict[str, Any], str | None]]:
    """Each states machine of the definition (the top level, every Parallel branch, every Map item processor)
    with the state that holds it (None for the top level)."""
    yield machine, owner
    for name, state in machine["States"].items():
        for inner in (*state.get("Branches", []), *([state["ItemProcessor"]] if "ItemProcessor" in state else [])):
            yield from _scopes(inner, name)


SCOPES = list(_scopes(DEFINITION))
OWNER: dict[str, str | None] = {name: owner for machine, owner in SCOPES for name in machine["States"]}


def targets(state: dict[str, Any]) -> list[str]:
    """The states a state names as its next ones: Next, its Choices and Default, its catchers'. In ASL
    these are names of its own states machine (a branch cannot name a state outside the branch)."""
    nxt = [state["Next"]] if "Next" in state else []
    nxt += [c["Next"] for c in state.get("Choices", [])]
    nxt += [state["Default"]] if "Default" in state else []
    nxt += [c["Next"] for c in state.get("Catch", [])]
    return nxt


def successors(name: str) -> list[str]:
    """Where a run can go after ``name`` at any depth: its targets; a Parallel or Map into its branches'
    first states; the end of a Parallel's branch (End, or a Succeed state) on to the Parallel's Next. A
    Fail state in a branch fails its Parallel, which no stage catches: the run ends there."""
    state = STATES[name]
    nxt = targets(state)
    nxt += [branch["StartAt"] for branch in state.get("Branches", [])]
    nxt += [state["ItemProcessor"]["StartAt"]] if "ItemProcessor" in state else []
    owner = OWNER[name]
    if owner is not None and STATES[owner]["Type"] == "Parallel" and (state.get("End") or state["Type"] == "Succeed"):
        nxt += [STATES[owner]["Next"]] if "Next" in STATES[owner] else []
    return nxt


def predecessors(name: str) -> set[str]:
    return {src for src in STATES if name in successors(src)}


def tasks() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in STATES.items() if s["Type"] == "Task"}


def test_placeholders_equal_the_template_substitution_keys() -> None:
    spec = sam.load_template().state_machine("PipelineStateMachine")
    assert spec.definition_path == support.DEFINITION
    assert set(placeholders(TEXT)) == set(spec.definition_substitutions)


def test_substitution_leaves_no_placeholder_and_keeps_valid_json() -> None:
    text = substitute(TEXT, support.substitutions())
    assert "${" not in text
    json.loads(text)


def test_every_arn_is_partition_aware() -> None:
    assert "arn:aws:" not in TEXT
    for name, state in tasks().items():
        assert state["Resource"].startswith("arn:${Partition}:states:::"), name


def test_every_state_is_reachable_and_every_target_exists() -> None:
    # One name, one state, at every depth (STATES, the run's history and the stages all go by name).
    assert sum(len(machine["States"]) for machine, _ in SCOPES) == len(STATES)
    for machine, owner in SCOPES:
        here = machine["States"]
        assert machine["StartAt"] in here, owner
        for name, state in here.items():
            for nxt in targets(state):
                # A branch's targets are its own states: the stages are joined by their Parallels' Next only.
                assert nxt in here, f"{name!r} (in {owner or 'the top level'}) targets {nxt!r}, not a state there"
        # Each branch, each item processor and the top level reach all of their states from their StartAt.
        seen = {machine["StartAt"]}
        queue = deque(seen)
        while queue:
            for nxt in targets(here[queue.popleft()]):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert seen == set(here), f"unreachable in {owner or 'the top level'}: {sorted(set(here) - seen)}"
    # ... and a run reaches every state of the machine, entering the stages and going on after them.
    seen = {DEFINITION["StartAt"]}
    queue = deque(seen)
    while queue:
        for nxt in successors(queue.popleft()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    assert seen == set(STATES), f"unreachable: {sorted(set(STATES) - seen)}"


# The .sync creates retry through states of their own (a Retry cannot tell throttling from a quota refusal:
# tests/unit/test_pipeline_fail_fast.py holds that loop to its budget).
SYNC_CREATES = {"Train model", "Evaluate challenger and champion"}


def _catches_all(state: dict[str, Any]) -> bool:
    return bool(state.get("Catch")) and state["Catch"][-1]["ErrorEquals"] == ["States.ALL"]


def test_every_task_has_retry_and_a_catch_all() -> None:
    assert "Check image batch" in tasks()  # the walk below sees the Tasks of branches and item processors
    for name, state in tasks().items():
        assert state.get("Retry") or name in SYNC_CREATES, f"{name} has no Retry"
        owner = OWNER[name]
        if owner is not None and STATES[owner]["Type"] == "Map":
            # A Map child's error fails its child execution; the Map's own catch-all takes it (the
            # distributed Map reports it as States.ExceedToleratedFailureThreshold, whatever it was).
            assert _catches_all(STATES[owner]), f"{owner}, which runs {name}, has no States.ALL catcher"
            continue
        assert state.get("Catch"), f"{name} has no Catch"
        assert _catches_all(state), f"{name}: the last catcher must be States.ALL"
        for retrier in state.get("Retry", []):
            assert retrier["MaxAttempts"] <= 12 and retrier.get("BackoffRate", 1) >= 1, name
            # Capped, jittered backoff: retries of many runs neither grow unbounded nor stampede.
            assert retrier["JitterStrategy"] == "FULL", name
            assert retrier["IntervalSeconds"] <= retrier["MaxDelaySeconds"] <= 1800, name


def test_the_stages_leave_their_errors_to_their_branches() -> None:
    # A stage's Parallel neither retries (it would run the whole stage again) nor catches: its branch
    # catches every Task error and records it, so an error that fails a Parallel is a Fail state's (Report
    # failure's error names, NotificationFailed) and ends the run with that name.
    parallels = {n: s for n, s in STATES.items() if s["Type"] == "Parallel"}
    assert set(parallels) == {stage.frame[0] for stage in STAGES}
    for name, state in parallels.items():
        assert "Catch" not in state and "Retry" not in state, name
        assert len(state["Branches"]) == 1 and state["OutputPath"] == "$[0]", name


def test_the_sync_creates_have_no_blanket_retry() -> None:
    # The optimised SageMaker integration reports throttling and ValidationException alike as
    # SageMaker.AmazonSageMakerException (the code is in the Cause; see d2ops.aws_contract): a Retry on it would
    # keep an invalid request for as long as it keeps throttling. A failed job is never retried either.
    for name in SYNC_CREATES:
        assert "Retry" not in STATES[name], name
        assert "SageMaker.AmazonSageMakerException" in STATES[name]["Catch"][0]["ErrorEquals"], name


def _sample_failure(record: str) -> dict[str, Any]:
    """What a Record state writes to $.failure, each path's value stood in for by a string."""
    return {key.removesuffix(".$"): value if not key.endswith(".$") else f"<{value}>"
            for key, value in STATES[record]["Parameters"].items()}


def failure_paths(record: str) -> list[list[str]]:
    """Every way a run goes from ``record`` to its end. A Choice that reads only $.failure is decided on the
    record's $.failure (the routing after each stage, Failure explained?, Route failure); every other state
    may go to any of its successors (a catcher, the lease held or not)."""
    document = {"failure": _sample_failure(record)}
    paths: list[list[str]] = []

    def walk(path: list[str]) -> None:
        state = STATES[path[-1]]
        nxt = successors(path[-1])
        tested = [c["Variable"] for rule in state.get("Choices", []) for c in _conditions(rule)]
        if tested and all(v == "$.failure" or v.startswith("$.failure.") for v in tested):
            chosen = [r["Next"] for r in state["Choices"] if evaluate_rule(r, document, {})]
            nxt = [(chosen or [state["Default"]])[0]]
        if not nxt:
            paths.append(path)
        for name in dict.fromkeys(nxt):  # a Next and a catcher may name the same state
            assert name not in path, f"{record} loops back to {name}"
            walk([*path, name])

    walk([record])
    return paths


def _conditions(rule: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for sub in (*rule.get("And", []), *rule.get("Or", []), *([rule["Not"]] if "Not" in rule else [])):
        yield from _conditions(sub)
    if "Variable" in rule:
        yield rule


def test_every_failure_notifies_before_its_fail_state() -> None:
    fails = {n for n, s in STATES.items() if s["Type"] == "Fail"}
    assert {STATES[n]["Error"] for n in fails} == FAILURE_ERRORS
    for name in fails - {"Notification failed"}:
        assert predecessors(name) == {"Route failure"}, name
    assert predecessors("Notification failed") == {"Notify success"}
    # Each notification is composed first (subject, cost); if that fails it goes out without the cost.
    for outcome, notify in (("success", "Notify success"), ("failure", "Notify failure")):
        compose, fallback = f"Compose {outcome} notification", f"{outcome.capitalize()} notification without cost"
        assert predecessors(notify) == {compose, fallback}, notify
        assert predecessors(fallback) == {compose} and STATES[fallback]["ResultPath"] == "$.notification"
        assert [c["Next"] for c in STATES[compose]["Catch"]] == [fallback]
        assert STATES[notify]["Parameters"]["Subject.$"] == "$.notification.subject"
    assert predecessors("Compose success notification") == {"Release endpoint lease"}
    # ... after the endpoint lease is released (when the run got as far as taking it).
    assert predecessors("Route failure") == {"Holding endpoint lease?", "Release endpoint lease after failure"}
    assert predecessors("Holding endpoint lease?") == {"Notify failure"}
    # The failure notification is composed at once or after "Describe failure" (which only rewrites
    # failure.cause as one line), as "Failure explained?" decides on $.failure, first thing Report failure does.
    assert predecessors("Compose failure notification") == {"Failure explained?", "Describe failure"}
    assert predecessors("Describe failure") == {"Failure explained?"}
    assert predecessors("Failure explained?") == {"Report failure"}
    # Only what a stage recorded reaches Report failure: the Choice after each stage, on $.failure.
    assert predecessors("Report failure") == {stage.frame[1] for stage in STAGES if len(stage.frame) == 2}
    # The records: Pass states writing $.failure, the failure error named, no raw Cause.
    recorders = {n for n, s in STATES.items() if s.get("ResultPath") == "$.failure"}
    assert recorders == FAILURE_RECORDS
    for name in recorders:
        state = STATES[name]
        assert state["Type"] == "Pass", name
        assert state["Parameters"]["error"] in FAILURE_ERRORS
        # Raw Causes (Lambda stack traces, whole job descriptions) never go into the people-facing cause.
        assert "$.error.Cause" not in json.dumps(state["Parameters"]), name
    # A rolled-back deployment is appended to the endpoint's history on its way: that Task only reads
    # $.failure (ResultPath null, its own error kept apart), after a Record state wrote it; if it fails
    # the stage still ends with the failure recorded.
    history = "Record rollback in endpoint history"
    assert STATES[history]["ResultPath"] is None
    assert [(c["ResultPath"], c["Next"]) for c in STATES[history]["Catch"]] == [("$.history_error",
                                                                                  "Endpoint history not written")]
    assert STATES["Endpoint history not written"]["Type"] == "Succeed"
    # Both rollbacks write the one record shape: the pipeline's own and SageMaker's alarm-driven one.
    assert predecessors(history) == {"Record rolled-back deployment", "Record alarm rollback"}
    # Every way on from every record: out of its stage, through the Choice after that stage into Report
    # failure, described when it recorded a caught error ($.error; the rest are explained by their record:
    # the dataset's report, the gate's reason, the lease holder), notified, and failed with its error.
    route = {c["StringEquals"]: c["Next"] for c in STATES["Route failure"]["Choices"]}
    undescribed = set()
    for record in recorders:
        stage = stage_of(record)
        paths = failure_paths(record)
        assert paths, record
        for path in paths:
            leaving = path.index(stage.frame[1])  # the Choice after the record's stage
            assert set(path[1:leaving]) <= {history, "Endpoint history not written"}, path
            assert path[leaving + 1:leaving + 3] == ["Report failure", "Failure explained?"], path
            rest = path[leaving + 3:]
            assert "Notify failure" in rest and rest[-2] == "Route failure", path
            error = STATES[record]["Parameters"]["error"]
            assert rest[-1] == route[error] and STATES[rest[-1]]["Error"] == error, path
            described = "Describe failure" in rest
            assert described == ("$.error." in json.dumps(STATES[record]["Parameters"])), path
            if not described:
                undescribed.add(record)
    assert undescribed == {"Record dataset rejection", "Record quality gate failure", "Record endpoint busy"}
    describe = STATES["Describe failure"]
    assert describe["Next"] == "Compose failure notification"
    assert [c["Next"] for c in describe["Catch"]] == ["Compose failure notification"]


def test_the_whole_run_has_a_time_limit_that_covers_its_parts() -> None:
    """TimeoutSeconds (documented in docs/pipeline.md) covers the longest run the stack allows."""
    from prepare_training.models import PrepareSettings
    from prepare_training.service import EVALUATION_MAX_SECONDS

    tpl = sam.load_template()
    longest_training = 2 * int(tpl.document["Parameters"]["MaxTrainingSeconds"]["MaxValue"])  # spot: wait + run
    endpoint = PrepareSettings.model_fields
    endpoint_wait = int(endpoint["endpoint_poll_seconds"].default) * int(endpoint["endpoint_max_wait_attempts"].default)
    task_limits = sum(s.get("TimeoutSeconds", 0) for s in STATES.values())
    # A person's review waits at most ReviewTimeoutSeconds (its TimeoutSecondsPath reads the parameter).
    assert STATES["Wait for review"]["TimeoutSecondsPath"] == "$.review_wait.timeout_seconds"
    assert "${ReviewTimeoutSeconds}" in json.dumps(STATES["Prepare review wait"]["Parameters"])
    longest_review = int(tpl.document["Parameters"]["ReviewTimeoutSeconds"]["MaxValue"])
    # The endpoint is waited for twice at most: the deployment, then a verified rollback.
    worst = longest_training + EVALUATION_MAX_SECONDS + 2 * endpoint_wait + longest_review + task_limits
    assert worst < DEFINITION["TimeoutSeconds"] <= 1.05 * worst + 3600, (worst, DEFINITION["TimeoutSeconds"])
    alarm = tpl.resource("PipelineTimedOutAlarm")["Properties"]  # a timed-out run skips the notify states
    assert alarm["MetricName"] == "ExecutionsTimedOut" and alarm["AlarmActions"] == [{"Ref": "NotificationTopic"}]
    routes = {c["StringEquals"]: c["Next"] for c in STATES["Route failure"]["Choices"]}
    for error, target in routes.items():
        assert STATES[target]["Error"] == error


def test_the_quality_gate_compares_named_metrics_not_positions() -> None:
    gate = json.dumps(STATES["Quality gate"])
    assert not re.search(r"\[\d+\]", gate), "the gate must not index into lists"
    # The summarize Lambda decides once; the Choice branches on its decision, nothing else.
    rules = [rule.get("Not", rule) for rule in STATES["Quality gate"]["Choices"]]
    tested = {c["Variable"] for rule in rules for c in rule.get("And", [rule])}
    assert tested == {"$.evaluation.refused_by", "$.evaluation.decision"}


@pytest.mark.parametrize(("decision", "refused_by", "state"), [
    ("approve", None, "Quality gate passed"),
    ("refuse", "below_min_map", "Below quality threshold"),
    ("refuse", "regressed", "Worse than champion"),
    ("refuse", "class_regressed", "Worse than champion on a class"),
    ("review", None, "Needs review"),
    # Whatever else it may read: a refusal refuses, and any decision but approve goes to a person.
    ("approve", "regressed", "Worse than champion"),
    ("refuse", None, "Needs review"),
    ("maybe", None, "Needs review"),
])
def test_only_an_approval_passes_the_gate_by_itself(decision: str, refused_by: str | None, state: str) -> None:
    """Mutation: a Default that approves whatever the Choice does not name, or review routed as approved."""
    gate = STATES["Quality gate"]
    document = {"evaluation": {"decision": decision, "refused_by": refused_by}}
    taken = next((rule["Next"] for rule in gate["Choices"] if evaluate_rule(rule, document, {})), gate["Default"])
    assert taken == state
    assert STATES[taken]["Parameters"]["approval_status"] == {
        "Quality gate passed": "Approved", "Needs review": "PendingManualApproval"}.get(taken, "Rejected")


def test_a_review_waits_on_its_task_token_then_records_the_decision_in_the_registry() -> None:
    wait = STATES["Wait for review"]
    assert wait["Resource"] == "arn:${Partition}:states:::lambda:invoke.waitForTaskToken"
    assert wait["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert "HeartbeatSeconds" not in wait and "HeartbeatSecondsPath" not in wait  # nobody sends heartbeats
    # A time-out and any other error (SendTaskFailure, a failed request) are read, never left uncaught.
    assert [(c["ErrorEquals"], c["ResultPath"], c["Next"]) for c in wait["Catch"]] == [
        (["States.Timeout", "States.HeartbeatTimeout"], "$.review", "Read review decision"),
        (["States.ALL"], "$.review", "Read review decision")]
    assert STATES["Model approved?"]["Choices"][1] == {
        "Variable": "$.gate.approval_status", "StringEquals": "PendingManualApproval", "Next": "Prepare review wait"}
    update = STATES["Record review in registry"]
    assert update["Resource"] == "arn:${Partition}:states:::aws-sdk:sagemaker:updateModelPackage"
    assert update["Parameters"] == {"ModelPackageArn.$": "$.registration.model_package_arn",
                                    "ModelApprovalStatus.$": "$.gate.approval_status",
                                    "ApprovalDescription.$": "$.gate.approval_description"}
    # Only Approved deploys; the Choice after the registry does not loop back to the review.
    assert STATES["Review approved?"]["Choices"] == [
        {"Variable": "$.gate.approval_status", "StringEquals": "Approved", "Next": "Ready to deploy"}]
    assert STATES["Review approved?"]["Default"] == "Record quality gate failure"


def _payload_keys(state: str) -> set[str]:
    return {k.removesuffix(".$") for k in STATES[state]["Parameters"]["Payload"]}


def _selected_keys(state: str) -> set[str]:
    return {k.removesuffix(".$") for k in STATES[state]["ResultSelector"]}


def test_lambda_payloads_and_selectors_match_the_lambda_models() -> None:
    assert _payload_keys("Validate dataset") == set(ValidateDatasetEvent.model_fields)
    assert _payload_keys("Prepare training job") == set(PrepareEvent.model_fields)
    assert _selected_keys("Prepare training job") == set(Plan.model_fields)
    assert _payload_keys("Read evaluation report") == set(SummarizeEvent.model_fields)
    assert _selected_keys("Read evaluation report") == set(EvaluationSummary.model_fields)
    assert _payload_keys("Wait for review") == set(RequestReviewEvent.model_fields)
    assert _payload_keys("Read review decision") == set(ReadDecisionEvent.model_fields)
    assert _selected_keys("Read review decision") == set(ReviewedGate.model_fields)
    assert _payload_keys("Smoke test endpoint") == set(SmokeTestEvent.model_fields)
    assert _selected_keys("Smoke test endpoint") <= set(SmokeTestResult.model_fields)
    # One function, two calls: the Map's results to merge, or (the Map failed) its error to explain.
    assert _payload_keys("Summarize image checks") == set(SummarizeImagesEvent.model_fields) - {"map_error"}
    assert _payload_keys("Explain failed image checks") == set(SummarizeImagesEvent.model_fields) - {"result_writer"}
    assert (STATES["Explain failed image checks"]["Parameters"]["FunctionName"]
            == STATES["Summarize image checks"]["Parameters"]["FunctionName"])
    batch_input = STATES["Check images"]["ItemBatcher"]["BatchInput"]
    assert {k.removesuffix(".$") for k in batch_input} == set(BatchInput.model_fields)


def test_pending_images_go_through_the_distributed_map_and_back_to_the_same_choice() -> None:
    choice = STATES["Dataset valid?"]
    pending, valid = choice["Choices"]  # pending first: a provisional valid=true must not reach training
    assert pending["Next"] == "Check images" and valid["Next"] == "Dataset accepted"
    # A valid dataset ends the Validate stage, which goes on (no $.failure) to the Prepare stage.
    assert STATES["Dataset accepted"]["Type"] == "Succeed" and OWNER["Dataset accepted"] == "Validate"
    assert successors("Dataset accepted") == ["Validated?"] and STATES["Validated?"]["Default"] == "Prepare"
    assert STATES["Prepare"]["Branches"][0]["StartAt"] == "Prepare endpoint lease wait"
    assert {"Variable": "$.validation.summary.images_pending", "BooleanEquals": True} in pending["And"]
    assert choice["Default"] == "Record dataset rejection"
    check = STATES["Check images"]
    assert check["Type"] == "Map" and check["Next"] == "Summarize image checks"
    assert check["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"}
    reader = check["ItemReader"]
    assert reader["Resource"] == "arn:${Partition}:states:::s3:getObject"
    assert reader["ReaderConfig"] == {"InputType": "JSONL"}
    assert reader["Parameters"] == {"Bucket.$": "$.validation.summary.image_items_bucket",
                                    "Key.$": "$.validation.summary.image_items_key"}
    assert check["ItemBatcher"]["MaxItemsPerBatch"] == 50
    assert check["MaxConcurrencyPath"] == "$.validation.summary.image_check_concurrency"
    assert check["ToleratedFailureCount"] == 0 and "ToleratedFailurePercentage" not in check
    writer = check["ResultWriter"]
    assert writer["Resource"] == "arn:${Partition}:states:::s3:putObject"
    assert writer["Parameters"]["Bucket"] == "${ArtifactsBucketName}"
    # A path, not an intrinsic: ResultWriter's Parameters are documented with paths only; the validate
    # Lambda names the place (s3_layout.image_results_prefix), which Summarize image checks holds results to.
    assert writer["Parameters"]["Prefix.$"] == "$.validation.summary.image_results_prefix"
    assert check["ResultPath"] == "$.image_check"
    # A failed child reaches its Map only as States.ExceedToleratedFailureThreshold: a Catch naming the
    # child's own errors (DatasetUnreadable ...) would never fire, so there is one.
    assert [(c["ErrorEquals"], c["Next"]) for c in check["Catch"]] == [(["States.ALL"], "Explain failed image checks")]
    (child_name,) = check["ItemProcessor"]["States"]
    child = check["ItemProcessor"]["States"][child_name]
    assert child_name == "Check image batch" and child["End"] is True
    assert child["Parameters"] == {"FunctionName": "${CheckImagesFunctionArn}", "Payload.$": "$"}
    assert child["OutputPath"] == "$.Payload"
    assert {"Lambda.ServiceException", "Lambda.TooManyRequestsException"} <= set(child["Retry"][0]["ErrorEquals"])
    summarize = STATES["Summarize image checks"]
    assert summarize["Next"] == "Dataset valid?" and summarize["ResultPath"] == "$.validation"
    assert summarize["Parameters"]["Payload"]["result_writer.$"] == "$.image_check.ResultWriterDetails"
    assert [c["Next"] for c in summarize["Catch"]] == ["Record unreadable dataset", "Record validation error"]
    # The jobs and the registry read what validation's final summary says.
    prepare = STATES["Prepare training job"]["Parameters"]["Payload"]
    assert prepare["validation.$"] == "$.validation.summary"
    metadata = STATES["Register model version"]["Parameters"]["CustomerMetadataProperties"]
    assert metadata["inventory_digest.$"] == "$.plan.inventory_digest"


def test_the_map_s_lambda_is_the_check_images_function() -> None:
    tpl = sam.load_template()
    subs = tpl.state_machine("PipelineStateMachine").definition_substitutions
    check = tpl.function(subs["CheckImagesFunctionArn"]["Fn::GetAtt"][0])
    assert check.code_uri == "functions/check_images/"
    # An Express child ends at 5 minutes whatever its states say: the batch Lambda's timeout fits under
    # its Task's TimeoutSeconds, which fits under the child's limit with room for the Task's retries.
    child = STATES["Check images"]["ItemProcessor"]["States"]["Check image batch"]
    assert check.timeout is not None and check.timeout < child["TimeoutSeconds"] < 300
    summarize = tpl.function(subs["SummarizeImagesFunctionArn"]["Fn::GetAtt"][0])
    assert summarize.handler == "validate_dataset.summarize_images.handler"


@pytest.mark.parametrize(("state", "function_dir"), [
    ("Validate dataset", "validate_dataset"), ("Prepare training job", "prepare_training"),
    ("Read evaluation report", "summarize_evaluation"), ("Smoke test endpoint", "smoke_test_endpoint")])
def test_lambda_tasks_invoke_the_function_built_from_their_directory(state: str, function_dir: str) -> None:
    placeholder = placeholders(STATES[state]["Parameters"]["FunctionName"])[0]
    tpl = sam.load_template()
    value = tpl.state_machine("PipelineStateMachine").definition_substitutions[placeholder]
    logical_id = value["Fn::GetAtt"][0] if isinstance(value["Fn::GetAtt"], list) else value["Fn::GetAtt"].split(".")[0]
    assert tpl.function(logical_id).code_uri.rstrip("/") == f"functions/{function_dir}"


def test_job_names_fit_sagemaker_for_the_longest_run_ids() -> None:
    name_pattern = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
    longest = "N" * 64  # d2ops_core.validation.manifest.SEGMENT_PATTERN allows 64 characters
    cases = [(longest, longest, "v" * 1024), ("a_b.c-d", "1.0_rc-1", "null-etag"), ("x", "y", "z")]
    for name, version, token in cases:
        run_id = run_ids.run_id_for(name, version, token)
        assert len(run_id) <= 80 and re.fullmatch(r"[A-Za-z0-9_-]+", run_id)
        for suffix in ("train", "eval", "model", "config"):
            job = run_ids.sagemaker_name(run_id, suffix)
            assert len(job) <= 63 and name_pattern.match(job), job
    # Truncation keeps names distinct: two uploads of the same long version differ.
    a, b = (run_ids.run_id_for(longest, longest, t) for t in ("v1", "v2"))
    assert run_ids.sagemaker_name(a, "train") != run_ids.sagemaker_name(b, "train")


def _asl_validate(path: Path) -> subprocess.CompletedProcess[str]:
    assert ASL_VALIDATOR.exists(), "asl-validator is missing: run `make setup` (npm ci in tools/)"
    return subprocess.run([str(ASL_VALIDATOR), "--json-path", str(path)], capture_output=True, text=True, timeout=60)


def test_asl_validator_accepts_the_substituted_definition(tmp_path: Path) -> None:
    path = tmp_path / "training_pipeline.json"
    path.write_text(substitute(TEXT, support.substitutions()))
    result = _asl_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_asl_validator_rejects_a_broken_definition(tmp_path: Path) -> None:
    for target in ("No such state", "Trained?"):  # a missing state; a state outside the branch
        broken = json.loads(substitute(TEXT, support.substitutions()))
        branch = broken["States"]["Train"]["Branches"][0]
        branch["States"]["Count training job creation retry"]["Next"] = target
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(broken))
        result = _asl_validate(path)
        assert result.returncode != 0 and target in result.stdout + result.stderr, target
