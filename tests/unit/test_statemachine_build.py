"""The committed state machine is what src/d2ops/statemachine generates, and the builders keep their shapes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from d2ops.functions import (
    COMPOSE_NOTIFICATION,
    PREPARE_TRAINING,
    SMOKE_TEST_ENDPOINT,
    SUMMARIZE_EVALUATION,
    PipelineLambda,
)
from d2ops.statemachine import stage_table
from d2ops.statemachine import training_pipeline as tp
from d2ops.statemachine.__main__ import first_difference, main
from d2ops.statemachine.asl import (
    Catch,
    Choice,
    Fail,
    Machine,
    Pass,
    RetryPolicy,
    SingleBranchParallel,
    Task,
    Var,
    render,
    resource,
    when,
)
from d2ops.statemachine.patterns import (
    RETRY_POLICIES,
    SAGEMAKER_READ,
    FailureKind,
    Lookup,
    LoopReading,
    StageParallel,
    create_or_find,
    fail_states,
    lambda_task,
    payload_fields,
    record_failure,
    route_failures,
    sync_job_create_or_find,
)
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

REPO = support.REPO
COMMITTED = support.DEFINITION


def generated() -> str:
    return render(tp.definition())


def states_of(named: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: state.asl() for name, state in named}


def targets(state: dict[str, Any]) -> set[str]:
    out = {state[k] for k in ("Next", "Default") if k in state}
    out |= {c["Next"] for c in state.get("Choices", []) + state.get("Catch", [])}
    return out


# --- the committed file is the generated one -------------------------------------------------------


def test_the_committed_definition_is_the_generated_one() -> None:
    text = generated()
    assert first_difference(COMMITTED.read_text(), text) is None, "stale: run `make asl`"
    assert COMMITTED.read_text() == text


def test_check_passes_on_the_committed_file_through_the_module_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "d2ops.statemachine", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


def test_a_stale_committed_file_fails_the_check_naming_the_state(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # A hand edit of the JSON (here one Retry's MaxAttempts) is what --check exists to catch.
    stale = tmp_path / "training_pipeline.asl.json"
    document = json.loads(generated())
    document["States"]["Prepare"]["Branches"][0]["States"]["Acquire endpoint lease"]["Retry"][0]["MaxAttempts"] = 9
    stale.write_text(json.dumps(document, indent=2) + "\n")
    assert main(["--check", "--output", str(stale)]) == 1
    err = capsys.readouterr().err
    assert ('["States"]["Prepare"]["Branches"][0]["States"]["Acquire endpoint lease"]["Retry"][0]["MaxAttempts"]: '
            'committed 9, generated 5') in err
    assert "make asl" in err
    # The writer fixes it; the check then passes.
    assert main(["--output", str(stale)]) == 0
    assert stale.read_text() == generated()
    assert main(["--check", "--output", str(stale)]) == 0


def test_a_missing_file_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", "--output", str(tmp_path / "absent.json")]) == 1
    assert "the file is missing" in capsys.readouterr().err


def test_a_stale_stage_table_fails_the_check_like_a_stale_definition(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # The stage table (d2ops_core/pipeline_stage_table.py) is written with the definition: a state renamed in
    # the generator but not in the table is stale the same way.
    table = stage_table.render(tp.definition())
    assert (REPO / "src" / "d2ops_core" / "pipeline_stage_table.py").read_text() == table
    stale = tmp_path / "pipeline_stage_table.py"
    stale.write_text(table.replace('"Find current endpoint"', '"Find the endpoint"'))
    assert main(["--check", "--stage-table", str(stale)]) == 1
    err = capsys.readouterr().err
    assert f"{stale}: stale (PipelineStateMachine stage table): line " in err and "make asl" in err
    assert main(["--stage-table", str(stale)]) == 0
    assert stale.read_text() == table
    assert main(["--check", "--stage-table", str(stale)]) == 0


def test_the_stage_table_refuses_a_name_that_is_no_state_of_its_stage() -> None:
    machine = tp.definition()
    deploy = dict(machine.states)["Deploy"]
    assert isinstance(deploy, StageParallel)
    for changed in (dataclasses.replace(deploy, reading_order=(("Train model", ("Create model",)),)),
                    dataclasses.replace(deploy, loops=(LoopReading("Wait for rollbak"),)),
                    dataclasses.replace(deploy, loops=(LoopReading("Create model"),))):
        mutated = Machine(tuple((n, changed if n == "Deploy" else s) for n, s in machine.states),
                          comment=machine.comment, timeout=machine.timeout)
        with pytest.raises(ValueError, match="stage 'Deploy'"):
            stage_table.stage_table(mutated)


def test_the_stage_table_refuses_a_stage_without_its_check() -> None:
    """A stage whose Next is the following stage (its check Choice forgotten) is refused by name, instead of the
    next stage being read as its frame. Mutation caught: dropping the check in stage_table."""
    machine = tp.definition()
    states = dict(machine.states)
    train = states["Train"]
    assert isinstance(train, StageParallel)
    mutated = Machine(tuple((n, dataclasses.replace(train, next="Evaluate") if n == "Train" else s)
                            for n, s in machine.states if n != "Trained?"),
                      comment=machine.comment, timeout=machine.timeout)
    with pytest.raises(ValueError, match="stage 'Train' goes straight on to stage 'Evaluate'"):
        stage_table.stage_table(mutated)


def test_a_change_to_the_definition_is_seen_as_stale() -> None:
    machine = tp.definition()
    train = dict(machine.states)["Train"]
    assert isinstance(train, StageParallel)
    branch = tuple((n, dataclasses.replace(s, timeout=60) if n == "Train model" else s) for n, s in train.branch.states)
    mutated = Machine(tuple((n, dataclasses.replace(train, branch=Machine(branch)) if n == "Train" else s)
                            for n, s in machine.states), comment=machine.comment, timeout=machine.timeout)
    difference = first_difference(COMMITTED.read_text(), render(mutated))
    assert difference == ('["States"]["Train"]["Branches"][0]["States"]["Train model"]["TimeoutSeconds"]: '
                          'generated, not in the committed file')


def test_a_reordering_alone_is_seen_as_stale_by_line() -> None:
    # Same JSON value, keys in another order: the file would no longer be what `make asl` writes.
    document = json.loads(generated())
    first = next(iter(document["States"]))
    document["States"][first] = dict(reversed(list(document["States"][first].items())))
    difference = first_difference(json.dumps(document, indent=2) + "\n", generated())
    assert difference is not None and difference.startswith("line ")


# --- retry policies -------------------------------------------------------------------------------


def test_every_retry_is_one_named_policy_and_each_policy_is_used() -> None:
    shapes = {json.dumps(p.asl()): p.name for p in RETRY_POLICIES}
    assert len(shapes) == len(RETRY_POLICIES), "two policies of one shape"
    assert len({p.name for p in RETRY_POLICIES}) == len(RETRY_POLICIES), "two policies of one name"
    used = set()
    for name, state in all_states(json.loads(generated())).items():
        for retrier in state.get("Retry", []):
            assert json.dumps(retrier) in shapes, f"{name}: a Retry that is no named policy"
            used.add(shapes[json.dumps(retrier)])
    assert used == {p.name for p in RETRY_POLICIES}


def test_a_retry_policy_is_capped_full_jitter_backoff() -> None:
    assert RetryPolicy("x", ("A.B",), interval=2, max_attempts=3, max_delay=30).asl() == {
        "ErrorEquals": ["A.B"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2, "MaxDelaySeconds": 30,
        "JitterStrategy": "FULL"}


# --- lambda tasks -----------------------------------------------------------------------------------


def test_result_selectors_are_the_handlers_output_models() -> None:
    states = all_states(json.loads(generated()))
    evaluation = SUMMARIZE_EVALUATION.output_model()
    notification = COMPOSE_NOTIFICATION.output_model()
    smoke = SMOKE_TEST_ENDPOINT.output_model()
    for name, model, left_out in (("Prepare training job", PREPARE_TRAINING.output_model(), set()),
                                  ("Read evaluation report", evaluation, set()),
                                  ("Compose success notification", notification, set()),
                                  ("Compose failure notification", notification, set()),
                                  ("Smoke test endpoint", smoke, {"endpoint_name"})):
        selector = states[name]["ResultSelector"]
        assert list(selector) == [f"{f}.$" for f in model.model_fields if f not in left_out], name
        assert all(v == f"$.Payload.{k[:-2]}" for k, v in selector.items()), name


def test_payload_fields_follow_the_model_and_refuse_an_unknown_exclusion() -> None:
    from pydantic import BaseModel

    class Out(BaseModel):
        b: int
        a: str

    assert payload_fields(Out) == {"b.$": "$.Payload.b", "a.$": "$.Payload.a"}
    assert payload_fields(Out, exclude=("b",)) == {"a.$": "$.Payload.a"}
    with pytest.raises(ValueError, match="Out has no field 'c'"):
        payload_fields(Out, exclude=("c",))


def test_lambda_task_shape() -> None:
    retry = RetryPolicy("r", ("Lambda.ServiceException",), interval=1, max_attempts=2, max_delay=5)
    do_it = PipelineLambda("DoItFunction", "do_it.handler", "do_it.models:In", "do_it.models:Out")
    name, task = lambda_task("Do it", do_it, {"a.$": "$.a"}, next="After", retry=retry,
                             comment="why", result_selector={"x.$": "$.Payload.x"}, result_path="$.did",
                             timeout=60, catch=(Catch("Failed"),))
    assert name == "Do it"
    assert task.asl() == {
        "Type": "Task", "Comment": "why", "Resource": "arn:${Partition}:states:::lambda:invoke",
        "Parameters": {"FunctionName": "${DoItFunctionArn}", "Payload": {"a.$": "$.a"}},
        "ResultSelector": {"x.$": "$.Payload.x"}, "ResultPath": "$.did", "TimeoutSeconds": 60,
        "Retry": [retry.asl()],
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Failed"}], "Next": "After"}
    # A path payload is passed whole; no Next is End; ResultPath None discards (JSON null), absent keeps input.
    batch = PipelineLambda("F", "batch.handler", "batch.models:In", "batch.models:Out")
    _, whole = lambda_task("Batch", batch, "$", next=None, retry=retry, output_path="$.Payload", result_path=None)
    state = whole.asl()
    assert state["Parameters"] == {"FunctionName": "${FArn}", "Payload.$": "$"}
    assert state["End"] is True and "Next" not in state
    assert state["ResultPath"] is None and list(state).index("ResultPath") < list(state).index("OutputPath")
    _, kept = lambda_task("Batch", batch, "$", next="N", retry=retry)
    assert "ResultPath" not in kept.asl()


# --- create-or-find -----------------------------------------------------------------------------------


def test_create_or_find_shape() -> None:
    create = ("Create thing", Task(resource("sagemaker:createThing"), "After",
                                   catch=(Catch("Thing already created?", ("SageMaker.AmazonSageMakerException",)),
                                          Catch("Failed"))))
    retry = RetryPolicy("r", ("SageMaker.SdkClientException",), interval=5, max_attempts=4, max_delay=60)
    states = states_of(create_or_find(
        create, thing="thing", exists_cause="Cannot create already existing thing*",
        lookup=Lookup("Find created thing", "aws-sdk:sagemaker:describeThing", {"ThingName.$": "$.name"},
                      {"owner.$": "$.Owner"}, "$.created_thing"),
        ours=Var("$.created_thing.owner").test("StringEqualsPath", "$.me"), next="After", failed="Failed", retry=retry))
    assert list(states) == ["Create thing", "Thing already created?", "Find created thing", "Created thing is ours?"]
    exists = states["Thing already created?"]
    assert exists["Choices"] == [{"Variable": "$.error.Cause", "StringMatches": "Cannot create already existing thing*",
                                  "Next": "Find created thing"}]
    assert exists["Default"] == "Failed"
    find = states["Find created thing"]
    assert find["Resource"] == "arn:${Partition}:states:::aws-sdk:sagemaker:describeThing"
    assert find["Next"] == "Created thing is ours?" and find["Retry"] == [retry.asl()]
    # The lookup's own error goes elsewhere than $.error: the create's error stays what is reported.
    assert find["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.find_error", "Next": "Failed"}]
    ours = states["Created thing is ours?"]
    assert ours["Choices"] == [{"Variable": "$.created_thing.owner", "StringEqualsPath": "$.me", "Next": "After"}]
    assert ours["Default"] == "Failed"


def test_sync_job_create_or_find_is_a_closed_bounded_loop() -> None:
    named = sync_job_create_or_find(tp.TRAINING, next="Evaluate", failed="Record training failure",
                                    retry=SAGEMAKER_READ)
    states = states_of(named)
    assert len(states) == 14 and all("training" in n.lower() or n == "Train model" for n in states)
    # Every transition stays in the loop, or leaves to the next step or the failure record.
    for name, state in states.items():
        assert targets(state) <= set(states) | {"Evaluate", "Record training failure"}, name
    create = states["Train model"]
    assert create["Resource"].endswith(":states:::sagemaker:createTrainingJob.sync") and "Retry" not in create
    assert [c["Next"] for c in create["Catch"]] == ["Training job already created?", "Record training failure"]
    # Reading back a job a lost response started lands where the .sync state would have put it.
    read = states["Read created training job"]
    assert read["ResultSelector"] == create["ResultSelector"] and read["ResultPath"] == create["ResultPath"]
    assert read["Next"] == create["Next"] == "Evaluate"
    assert states["Read created training job failure"]["ResultPath"] == "$.error"
    # Bounded: at most five create retries, doubling from 15 s; at most max_checks checks of a found job.
    left = states["Training job creation retries left?"]["Choices"][1]
    assert left["NumericLessThan"] == 5
    assert states["Start retrying training job creation"]["Result"] == {"attempts": 0, "seconds": 15}
    assert "465 s of waits" in states["Training job creation retries left?"]["Comment"]
    ours = states["Created training job is ours?"]["Choices"]
    assert ours[-1]["And"][-1] == {"Variable": "$.created_training_wait.checks", "NumericLessThan": 490}
    assert states["Wait for created training job"]["Seconds"] == 1800
    # Only a name taken by our own earlier attempt is waited for: its output path must be this run's.
    assert ours[0] == {"Not": {"Variable": "$.created_training.output",
                               "StringEqualsPath": "$.plan.training_job.OutputDataConfig.S3OutputPath"},
                       "Next": "Record training failure"}


# --- the failure triple --------------------------------------------------------------------------------


def test_failure_triple_shape() -> None:
    broke = FailureKind("ThingBroke", "Thing broke")
    other = FailureKind("Other", "Run failed")
    _, record = record_failure("Record broken thing", broke, "$.why", next="Notify", comment="c",
                                  **{"extra.$": "$.x"})
    assert isinstance(record, Pass)
    assert record.asl() == {"Type": "Pass", "Comment": "c", "Parameters": {
        "error": "ThingBroke", "cause.$": "$.why", "run_id.$": "$$.Execution.Name", "dataset.$": "$.dataset",
        "extra.$": "$.x"}, "ResultPath": "$.failure", "Next": "Notify"}
    _, route = route_failures("Route failure", [broke], default=other)
    assert isinstance(route, Choice)
    assert route.asl()["Choices"] == [{"Variable": "$.failure.error", "StringEquals": "ThingBroke",
                                       "Next": "Thing broke"}]
    assert route.asl()["Default"] == "Run failed"
    assert fail_states([broke]) == [("Thing broke", Fail("ThingBroke", "$.failure.cause"))]


def test_every_recorded_failure_is_routed_to_its_fail_state() -> None:
    states = all_states(json.loads(generated()))
    routes = {c["StringEquals"]: c["Next"] for c in states["Route failure"]["Choices"]}
    for kind in tp.FAILURE_KINDS:
        assert states[kind.fail_state] == {"Type": "Fail", "Error": kind.error, "CausePath": "$.failure.cause"}
        assert routes.get(kind.error, states["Route failure"]["Default"]) == kind.fail_state
    recorded = {s["Parameters"]["error"] for s in states.values()
                if s["Type"] == "Pass" and s.get("ResultPath") == "$.failure"}
    assert recorded <= set(routes), "a recorded error no route names would end as PipelineFailed"


# --- the machine ----------------------------------------------------------------------------------------


def test_a_machine_refuses_a_state_defined_twice_and_a_missing_start() -> None:
    state = Pass("Elsewhere")
    with pytest.raises(ValueError, match="'A' is defined twice"):
        Machine((("A", state), ("A", state)))
    with pytest.raises(ValueError, match="StartAt names the missing state 'B'"):
        Machine((("A", state),), start_at="B")


def test_a_stage_is_a_single_branch_parallel_passing_its_branch_output_on() -> None:
    branch = Machine((("Work", Pass(None)),))
    assert SingleBranchParallel(branch, "After", comment="c").asl() == {
        "Type": "Parallel", "Comment": "c", "Branches": [{"StartAt": "Work", "States": {"Work": {"Type": "Pass",
                                                                                                  "End": True}}}],
        "OutputPath": "$[0]", "Next": "After"}
    assert SingleBranchParallel(branch, None).asl()["End"] is True


def test_state_names_are_unique_across_stages_and_a_branch_cannot_leave_its_stage() -> None:
    inner = Machine((("Work", Pass(None)),))
    with pytest.raises(ValueError, match="'Work' is defined twice"):
        Machine((("Stage", SingleBranchParallel(inner, "Work")), ("Work", Pass(None))))
    with pytest.raises(ValueError, match="'Work' is defined twice"):
        Machine((("A", SingleBranchParallel(inner, "B")), ("B", SingleBranchParallel(inner, None))))
    with pytest.raises(ValueError, match="state 'Work' goes to 'After', which is no state"):
        SingleBranchParallel(Machine((("Work", Pass("After")),)), "After")
    assert Machine((("Stage", SingleBranchParallel(inner, None)),)).names() == ["Stage", "Work"]


def test_a_machine_refuses_a_transition_to_a_missing_state() -> None:
    end = ("End", Pass("A"))
    for state in (Pass("Nowhere"), Choice((when(Var("$.x").is_present(), "Nowhere"),), "End"),
                  Choice((), "Nowhere"), Task(resource("x:y"), "End", catch=(Catch("Nowhere"),))):
        with pytest.raises(ValueError, match="state 'A' goes to 'Nowhere', which is no state"):
            Machine((("A", state), end))


def test_a_comment_is_written_where_the_state_asks() -> None:
    task = Task(resource("x:y"), "N", comment="c", parameters={"a": 1}, comment_after="Parameters")
    assert list(task.asl()) == ["Type", "Resource", "Parameters", "Comment", "Next"]
    assert list(dataclasses.replace(task, comment_after="Type").asl()) == [
        "Type", "Comment", "Resource", "Parameters", "Next"]


def test_choice_rules() -> None:
    status = Var("$.s")
    assert when(status.one_of("A", "B"), "N") == {
        "Or": [{"Variable": "$.s", "StringEquals": "A"}, {"Variable": "$.s", "StringEquals": "B"}], "Next": "N"}
    assert status.is_present(False) == {"Variable": "$.s", "IsPresent": False}


# --- stages -----------------------------------------------------------------------------------------------


def test_every_generated_state_is_in_exactly_one_stage() -> None:
    from collections import Counter

    from d2ops_core.pipeline_stages import STAGES

    placed = Counter(state for stage in STAGES for state in (*stage.frame, *stage.states))
    names = tp.definition().names()
    assert len(names) == len(set(names))
    assert sorted(set(names) - set(placed)) == [], "states in no stage"
    assert sorted(set(placed) - set(names)) == [], "stage states the definition does not have"
    assert [s for s, n in placed.items() if n > 1] == [], "states in several stages"
