"""The stages a user thinks of a run in, and which of the pipeline's states belong to each.

People read a run as validate -> prepare -> train -> evaluate -> gate -> deploy -> notify (or: its
failure reported), and the definition is written that way: its top level is one Parallel state per
stage, named by the stage's title, each followed by the Choice that goes on or to Report failure,
with the stage's own states (recovery, retry and wait machinery included) inside the branch.
``STAGES`` lists each stage's states (its branch's, a Map's item processor's included) and the
frame around them, the Parallel and the Choice after it (tests/unit/test_pipeline_stages.py checks
it against the committed definition), so ``d2ops status``, ``d2ops graph`` and the console group a
run the same way without reading the definition. ``FAILURE_RECORDS`` are the states that record
``$.failure``: a stage that enters one has failed, and goes on to Report failure.

``EXPECTED_MISSES`` are task errors the definition catches as a normal outcome (the first run's
"Find current endpoint" finds no endpoint, a create that finds its resource already created on a
redelivered run): a reader sees them as misses, not failures. ``LOOPS`` are the wait / count /
check cycles a reader wants as one line (the Wait state, its rounds and their total time).

Standard library only: the status API (through the CoreLayer) and the CLI both read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    states: tuple[str, ...]  # the stage's own states: its Parallel's branch
    # The states that only frame the stage: its Parallel (named by the title) and the Choice after it. A run's
    # timeline leaves them out (the Parallel's visit spans the stage's, the Choice decides in no time).
    frame: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExpectedMiss:
    """A task error that is a normal outcome of ``state`` when the run goes on to one of ``recovered_by``.

    The same error routed to the failure path (a lookup that failed for another reason) stays a failure:
    the error alone does not say which it was, where the run went next does.
    """

    state: str
    errors: frozenset[str]
    recovered_by: frozenset[str]
    meaning: str


@dataclass(frozen=True)
class Loop:
    """A wait/count/check cycle: consecutive visits of ``states`` read as one line titled ``title``,
    counted by the visits of ``head`` (the Wait state: one per round)."""

    title: str
    head: str
    states: frozenset[str]
    retries: str | None = None  # the task a retry loop starts again (a line of its own: it does the work)


STAGES: tuple[Stage, ...] = (
    Stage("validate", "Validate", (
        "Validate dataset", "Dataset valid?", "Check images", "Check image batch", "Explain failed image checks",
        "Summarize image checks", "Dataset accepted", "Record dataset rejection", "Record unreadable dataset",
        "Record validation error",
    ), frame=("Validate", "Validated?")),
    # The endpoint lease is taken before training (one run at a time deploys to the endpoint) and the
    # training job's names are fixed: what a run does before it spends money.
    Stage("prepare", "Prepare", (
        "Prepare endpoint lease wait", "Acquire endpoint lease", "Read endpoint lease", "Endpoint lease still held?",
        "Check lease holder", "Lease holder running?", "Clear stale endpoint lease", "Lease waits left?",
        "Wait for endpoint lease", "Count endpoint lease wait", "Longest lease wait reached?",
        "Keep longest lease wait", "Prepare training job", "Record preparation failure", "Record endpoint busy",
        "Record lease failure",
    ), frame=("Prepare", "Prepared?")),
    Stage("train", "Train", (
        "Train model", "Training job already created?", "Retry creating training job?",
        "Training job creation retries left?", "Start retrying training job creation",
        "Wait to retry creating training job", "Count training job creation retry",
        "Start waiting for created training job", "Check created training job", "Created training job is ours?",
        "Wait for created training job", "Count created training job check", "Read created training job",
        "Read created training job failure", "Record training failure",
    ), frame=("Train", "Trained?")),
    Stage("evaluate", "Evaluate", (
        "Evaluate challenger and champion", "Evaluation job already created?", "Retry creating evaluation job?",
        "Evaluation job creation retries left?", "Start retrying evaluation job creation",
        "Wait to retry creating evaluation job", "Count evaluation job creation retry",
        "Start waiting for created evaluation job", "Check created evaluation job", "Created evaluation job is ours?",
        "Wait for created evaluation job", "Count created evaluation job check", "Read created evaluation job",
        "Read created evaluation job failure", "Read evaluation report", "Record evaluation failure",
    ), frame=("Evaluate", "Evaluated?")),
    Stage("gate", "Gate", (
        "Quality gate", "Quality gate passed", "Below quality threshold", "Worse than champion",
        "Worse than champion on a class", "Needs review", "Register model version", "Model approved?",
        # a person decides what the numbers could not
        "Prepare review wait", "Wait for review", "Read review decision", "Record review in registry",
        "Review approved?", "Ready to deploy", "Record quality gate failure", "Record registration failure",
        "Record review failure",
    ), frame=("Gate", "Approved?")),
    Stage("deploy", "Deploy", (
        "Create model", "Model already created?", "Find created model", "Created model is ours?",
        "Create endpoint config", "Endpoint config already created?", "Find created endpoint config",
        "Created endpoint config is ours?", "Find current endpoint", "Endpoint missing?", "Endpoint lookup failed",
        "Create endpoint", "Update endpoint (blue/green)", "Start waiting for endpoint", "Wait for endpoint",
        "Check endpoint status", "Count endpoint check", "Endpoint in service?", "Canary baking?",
        "Smoke test endpoint", "Deployment complete?", "Record deployment failure",
        # rolling back a deployment that did not come up healthy
        "Endpoint rolled back by alarms", "Find rollback alarms", "Rollback alarms unreadable",
        "Record alarm rollback", "Endpoint not in service", "Undo deployment", "Roll back endpoint",
        "Report smoke test failure", "Trip smoke test alarm", "Start waiting for rollback", "Wait for rollback",
        "Check rollback", "Count rollback check", "Rolled back?", "Rollback not verified", "Delete new endpoint",
        "Record rolled-back deployment", "Record rollback in endpoint history", "Endpoint history not written",
        # promotion: the new model becomes the champion
        "Record champion", "Record endpoint history", "Promote to champion", "Record promotion failure",
    ), frame=("Deploy", "Deployed?")),
    # The endpoint is free for the next run, then people are told.
    Stage("notify", "Notify", (
        "Release endpoint lease", "Compose success notification", "Success notification without cost",
        "Notify success", "Run succeeded", "Notification failed",
    ), frame=("Notify",)),
    # Every failure, once its stage recorded it: described, notified, the lease given back, and the Fail state
    # whose error name says what happened.
    Stage("failure", "Report failure", (
        "Failure explained?", "Describe failure", "Compose failure notification",
        "Failure notification without cost", "Notify failure", "Holding endpoint lease?",
        "Release endpoint lease after failure", "Route failure",
        "Dataset rejected", "Validation failed", "Preparation failed", "Training failed", "Evaluation failed",
        "Quality gate failed", "Registration failed", "Deployment failed", "Promotion failed", "Endpoint busy",
        "Endpoint lease failed", "Run failed",
    ), frame=("Report failure",)),
)

_BY_STATE: dict[str, Stage] = {name: stage for stage in STAGES for name in (*stage.frame, *stage.states)}
FRAMES = frozenset(name for stage in STAGES for name in stage.frame)

FAILURE_RECORDS = frozenset({
    "Record dataset rejection", "Record unreadable dataset", "Record validation error", "Record preparation failure",
    "Record endpoint busy", "Record lease failure", "Record training failure", "Record evaluation failure",
    "Record quality gate failure", "Record registration failure", "Record review failure", "Record deployment failure",
    "Record alarm rollback", "Record rolled-back deployment", "Record promotion failure",
})
_BY_KEY: dict[str, Stage] = {stage.key: stage for stage in STAGES}


def stage_of(state_name: str) -> Stage:
    """The stage ``state_name`` belongs to (KeyError naming it when the definition has a state no stage holds)."""
    try:
        return _BY_STATE[state_name]
    except KeyError:
        raise KeyError(f"state {state_name!r} is in no stage of d2ops_core.pipeline_stages.STAGES") from None


def stage(key: str) -> Stage:
    return _BY_KEY[key]


# What a .sync job create reports on its way to "already created?" (the name in use: the job a lost answer's first
# attempt started) or to its retry loop (a lost answer, throttling, 5xx): the create's first Catch
# (tests/unit/test_pipeline_stages.py holds each expected miss to the definition's Catch).
SYNC_CREATE_ERRORS = frozenset({"SageMaker.ResourceInUseException", "SageMaker.AmazonSageMakerException",
                                "SageMaker.SdkClientException"})
# CreateModel's name in use is an unmodelled ValidationException: the optimised integration's catch-all name.
_CREATE_MODEL_ERRORS = frozenset({"SageMaker.AmazonSageMakerException"})

EXPECTED_MISSES: Mapping[str, ExpectedMiss] = {m.state: m for m in (
    ExpectedMiss("Find current endpoint", frozenset({"SageMaker.SageMakerException"}),
                 frozenset({"Create endpoint"}), "no endpoint yet: it is created"),
    ExpectedMiss("Acquire endpoint lease", frozenset({"DynamoDB.ConditionalCheckFailedException"}),
                 frozenset({"Read endpoint lease"}), "another run holds the endpoint lease"),
    ExpectedMiss("Check lease holder", frozenset({"Sfn.ExecutionDoesNotExistException"}),
                 frozenset({"Clear stale endpoint lease"}), "the lease holder is gone: its lease is cleared"),
    ExpectedMiss("Clear stale endpoint lease", frozenset({"DynamoDB.ConditionalCheckFailedException"}),
                 frozenset({"Acquire endpoint lease"}), "the lease changed meanwhile: asked again"),
    ExpectedMiss("Train model", SYNC_CREATE_ERRORS,
                 frozenset({"Start waiting for created training job", "Start retrying training job creation",
                            "Wait to retry creating training job"}),
                 "the training job exists already (or its creation is retried)"),
    ExpectedMiss("Evaluate challenger and champion", SYNC_CREATE_ERRORS,
                 frozenset({"Start waiting for created evaluation job", "Start retrying evaluation job creation",
                            "Wait to retry creating evaluation job"}),
                 "the evaluation job exists already (or its creation is retried)"),
    ExpectedMiss("Create model", _CREATE_MODEL_ERRORS, frozenset({"Find created model"}),
                 "the model exists already"),
    ExpectedMiss("Create endpoint config", frozenset({"SageMaker.SageMakerException"}),
                 frozenset({"Find created endpoint config"}), "the endpoint config exists already"),
    # Nobody deciding in time is an outcome of the review, not a failure of the step: the model is refused.
    ExpectedMiss("Wait for review", frozenset({"States.Timeout", "States.HeartbeatTimeout"}),
                 frozenset({"Read review decision"}), "nobody decided in time: the model is refused"),
)}


def expected_miss(state_name: str, error: str | None, later_states: Iterable[str]) -> ExpectedMiss | None:
    """The expected miss a failed visit of ``state_name`` with ``error`` was, given the states the run
    entered after it (in order), or None when it was a failure. The run must reach a recovering state
    before it records a failure or leaves the stage (or ends)."""
    miss = EXPECTED_MISSES.get(state_name)
    if miss is None or error not in miss.errors:
        return None
    return miss if _recovered(miss, later_states) else None


def miss_settled(state_name: str, later_states: Iterable[str]) -> bool:
    """Whether the states entered after ``state_name`` (one of EXPECTED_MISSES) already tell what its error
    was: the run recovered, recorded a failure or left the stage (a live reader waits until then)."""
    return _recovered(EXPECTED_MISSES[state_name], later_states) is not None


def _recovered(miss: ExpectedMiss, later_states: Iterable[str]) -> bool | None:
    """True: the run reached a recovering state; False: it recorded a failure or left the stage first;
    None: neither yet."""
    home = stage_of(miss.state)
    for name in later_states:
        if name in miss.recovered_by:
            return True
        if name in FAILURE_RECORDS or _BY_STATE.get(name) is not home:
            return False
    return None


LOOPS: tuple[Loop, ...] = (
    Loop("Wait for endpoint lease", "Wait for endpoint lease", frozenset({
        "Acquire endpoint lease", "Read endpoint lease", "Endpoint lease still held?", "Check lease holder",
        "Lease holder running?", "Clear stale endpoint lease", "Lease waits left?", "Wait for endpoint lease",
        "Count endpoint lease wait", "Longest lease wait reached?", "Keep longest lease wait"})),
    Loop("Retry creating training job", "Wait to retry creating training job", frozenset({
        "Training job already created?", "Retry creating training job?", "Training job creation retries left?",
        "Start retrying training job creation", "Wait to retry creating training job",
        "Count training job creation retry"}), retries="Train model"),
    Loop("Wait for created training job", "Wait for created training job", frozenset({
        "Start waiting for created training job", "Check created training job", "Created training job is ours?",
        "Wait for created training job", "Count created training job check"})),
    Loop("Retry creating evaluation job", "Wait to retry creating evaluation job", frozenset({
        "Evaluation job already created?", "Retry creating evaluation job?", "Evaluation job creation retries left?",
        "Start retrying evaluation job creation", "Wait to retry creating evaluation job",
        "Count evaluation job creation retry"}), retries="Evaluate challenger and champion"),
    Loop("Wait for created evaluation job", "Wait for created evaluation job", frozenset({
        "Start waiting for created evaluation job", "Check created evaluation job",
        "Created evaluation job is ours?", "Wait for created evaluation job", "Count created evaluation job check"})),
    Loop("Wait for endpoint", "Wait for endpoint", frozenset({
        "Start waiting for endpoint", "Wait for endpoint", "Check endpoint status", "Count endpoint check",
        "Endpoint in service?", "Canary baking?", "Deployment complete?"})),
    Loop("Wait for rollback", "Wait for rollback", frozenset({
        "Start waiting for rollback", "Wait for rollback", "Check rollback", "Count rollback check", "Rolled back?"})),
)


def loop_of(state_name: str) -> Loop | None:
    return next((loop for loop in LOOPS if state_name in loop.states), None)


def all_states(definition: Mapping[str, Any]) -> dict[str, Any]:
    """Every state of an ASL definition by name, those of Map item processors and Parallel branches (the
    stages) included: a state's name is unique in the whole machine."""
    found: dict[str, Any] = {}
    for name, state in definition.get("States", {}).items():
        found[name] = state
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])):
            if isinstance(inner, Mapping):
                found.update(all_states(inner))
    return found


def definition_states(definition: Mapping[str, Any]) -> list[str]:
    """Every state name of an ASL definition, those of Map item processors and Parallel branches included."""
    return list(all_states(definition))
