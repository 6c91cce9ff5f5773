"""Typed builders for an Amazon States Language definition, and the shapes the pipeline repeats.

Each state is a small frozen dataclass whose ``asl()`` is its JSON object, keys in the order the
committed ``statemachine/*.asl.json`` writes them (Type, Comment, inputs, outputs, error handling,
transition), so the generated file reads like a hand-written one and diffs stay small.

The repeated shapes are functions returning ``(name, state)`` pairs:

- ``lambda_task``: a ``lambda:invoke`` Task whose ResultSelector is the handler's pydantic output
  model's fields (``payload_fields``), so a field added to the model reaches ``$`` without an edit here;
- ``sync_job_create_or_find``: the ``.sync`` SageMaker job create whose lost response is recovered by
  finding the job the first attempt started (and whose transient refusals are retried by states,
  since a Retry cannot tell throttling from a validation or access refusal: one name for all three);
- ``create_or_find``: the same idea for a create call that returns at once (model, endpoint config);
- ``FailureKind`` with ``record_failure``, ``route_failures`` and ``fail_states``: the failure triple
  (a Pass recording ``$.failure``, the Choice routing on its error, the Fail state named after it);
- ``RetryPolicy``: one named Retry shape per kind of call (``RETRY_POLICIES`` lists them);
- ``Stage``: a stage of the run as a single-branch Parallel, which the Step Functions console draws as
  one box holding the stage's states (names stay unique across the whole machine).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from d2ops.functions import PipelineLambda

Json = dict[str, Any]
Named = tuple[str, "State"]

RUN_ID = "$$.Execution.Name"
EXECUTION_ARN = "$$.Execution.Id"
ENTERED_TIME = "$$.State.EnteredTime"


class _Absent:
    """A field left out of the state (JSON has no way to say "absent" with None: ``ResultPath: null`` discards)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def sub(name: str) -> str:
    """A DefinitionSubstitutions placeholder (template.yaml's PipelineStateMachine supplies the value)."""
    return "${" + name + "}"


def resource(integration: str) -> str:
    """A Step Functions service integration ARN, partition-aware (``lambda:invoke``, ``aws-sdk:s3:putObject``)."""
    return f"arn:{sub('Partition')}:states:::{integration}"


def fmt(template: str, *paths: str) -> str:
    """``States.Format('template', path, ...)``."""
    return f"States.Format('{template}', {', '.join(paths)})"


def _state(kind: str, comment: str | None, *fields: tuple[str, Any]) -> Json:
    """A state's object: Type, Comment (when there is one), then ``fields`` in order, leaving ABSENT ones out."""
    out: Json = {"Type": kind}
    if comment is not None:
        out["Comment"] = comment
    out.update((key, value) for key, value in fields if value is not ABSENT)
    return out


# --- error handling --------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """One Retry shape: capped exponential backoff with full jitter."""

    name: str
    errors: tuple[str, ...]
    interval: int
    max_attempts: int
    max_delay: int
    backoff: int = 2

    def asl(self) -> Json:
        return {"ErrorEquals": list(self.errors), "IntervalSeconds": self.interval, "MaxAttempts": self.max_attempts,
                "BackoffRate": self.backoff, "MaxDelaySeconds": self.max_delay, "JitterStrategy": "FULL"}


# The named policies: one per kind of call (tests/unit/test_statemachine_build.py checks that every Retry of
# the generated definitions is one of them, each distinct).

LAMBDA_ERRORS = ("Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
                 "Lambda.TooManyRequestsException")
SAGEMAKER_ERRORS = ("SageMaker.SageMakerException", "SageMaker.SdkClientException")
CLOUDWATCH_ERRORS = ("CloudWatch.CloudWatchException", "CloudWatch.SdkClientException")

LAMBDA = RetryPolicy("lambda", LAMBDA_ERRORS, interval=2, max_attempts=6, max_delay=60)
# The failure path's and the notifications' Lambdas: each has a fallback, so fewer attempts.
LAMBDA_WITH_FALLBACK = RetryPolicy("lambda-with-fallback", LAMBDA_ERRORS, interval=2, max_attempts=3, max_delay=30)
DYNAMODB = RetryPolicy("dynamodb", ("DynamoDB.ProvisionedThroughputExceededException",
                                    "DynamoDB.RequestLimitExceededException", "DynamoDB.ThrottlingException",
                                    "DynamoDB.InternalServerErrorException"),
                       interval=2, max_attempts=5, max_delay=30)
SFN = RetryPolicy("sfn", ("Sfn.SfnException", "Sfn.SdkClientException"), interval=2, max_attempts=4, max_delay=30)
SAGEMAKER_READ = RetryPolicy("sagemaker-read", SAGEMAKER_ERRORS, interval=5, max_attempts=4, max_delay=60)
SAGEMAKER_WRITE = RetryPolicy("sagemaker-write", SAGEMAKER_ERRORS, interval=5, max_attempts=4, max_delay=15)
# The optimised integrations: AmazonSageMakerException is SageMaker's every unmodelled error (throttling, 5xx,
# validation, access), SdkClientException a lost answer. A quota keeps its own name
# (SageMaker.ResourceLimitExceededException) and is not retried: waiting does not raise a quota.
SAGEMAKER_OPTIMISED = RetryPolicy("sagemaker-optimised", ("SageMaker.AmazonSageMakerException",
                                                          "SageMaker.SdkClientException"),
                                  interval=5, max_attempts=4, max_delay=15)
# "Find current endpoint": a missing endpoint is a SageMakerException, caught (not retried).
SAGEMAKER_CLIENT = RetryPolicy("sagemaker-client", ("SageMaker.SdkClientException",),
                               interval=5, max_attempts=4, max_delay=60)
SAGEMAKER_SERVICE = RetryPolicy("sagemaker-service", ("SageMaker.SageMakerException",),
                                interval=5, max_attempts=4, max_delay=60)
CLOUDWATCH = RetryPolicy("cloudwatch", CLOUDWATCH_ERRORS, interval=2, max_attempts=4, max_delay=30)
# Tripping the smoke test alarm is what makes SageMaker roll back: a little more persistence.
CLOUDWATCH_ALARM = RetryPolicy("cloudwatch-alarm", CLOUDWATCH_ERRORS, interval=2, max_attempts=6, max_delay=30)
S3 = RetryPolicy("s3", ("S3.S3Exception", "S3.SdkClientException"), interval=2, max_attempts=4, max_delay=30)
SNS = RetryPolicy("sns", ("States.ALL",), interval=5, max_attempts=3, max_delay=60)

RETRY_POLICIES = (LAMBDA, LAMBDA_WITH_FALLBACK, DYNAMODB, SFN, SAGEMAKER_READ, SAGEMAKER_WRITE, SAGEMAKER_OPTIMISED,
                  SAGEMAKER_CLIENT, SAGEMAKER_SERVICE, CLOUDWATCH, CLOUDWATCH_ALARM, S3, SNS)


@dataclass(frozen=True)
class Catch:
    """A catcher: ``errors`` go to ``next``, the error written at ``result_path``."""

    next: str
    errors: tuple[str, ...] = ("States.ALL",)
    result_path: str | None = "$.error"

    def asl(self) -> Json:
        return {"ErrorEquals": list(self.errors), "ResultPath": self.result_path, "Next": self.next}


def catch_all(next: str, result_path: str | None = "$.error") -> tuple[Catch]:
    return (Catch(next, result_path=result_path),)


# --- states ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A Task state: ``resource`` is a service integration's ARN (``resource("lambda:invoke")``)."""

    resource: str
    next: str | None  # None: End
    comment: str | None = None
    input_path: str | _Absent = ABSENT
    parameters: Json | _Absent = ABSENT
    result_selector: Json | _Absent = ABSENT
    result_path: str | _Absent | None = ABSENT
    output_path: str | _Absent = ABSENT
    timeout: int | _Absent = ABSENT
    timeout_path: str | _Absent = ABSENT  # TimeoutSecondsPath: a limit the stack sets (numbers are not substituted)
    retry: tuple[RetryPolicy, ...] = ()
    catch: tuple[Catch, ...] = ()
    # The few states whose Comment the committed file writes after another key (JSON objects are
    # unordered; kept so the generated file equals the committed one byte for byte).
    comment_after: Literal["Type", "Resource", "Parameters"] = "Type"

    def asl(self) -> Json:
        fields: list[tuple[str, Any]] = [
            ("Resource", self.resource), ("InputPath", self.input_path), ("Parameters", self.parameters),
            ("ResultSelector", self.result_selector), ("ResultPath", self.result_path),
            ("OutputPath", self.output_path), ("TimeoutSeconds", self.timeout),
            ("TimeoutSecondsPath", self.timeout_path),
            ("Retry", [r.asl() for r in self.retry] if self.retry else ABSENT),
            ("Catch", [c.asl() for c in self.catch] if self.catch else ABSENT),
            ("End", True) if self.next is None else ("Next", self.next),
        ]
        if self.comment is None or self.comment_after == "Type":
            return _state("Task", self.comment, *fields)
        at = [key for key, _ in fields].index(self.comment_after) + 1
        return _state("Task", None, *fields[:at], ("Comment", self.comment), *fields[at:])


@dataclass(frozen=True)
class Pass:
    """A Pass state: ``parameters`` (or a fixed ``result``) written at ``result_path``."""

    next: str | None  # None: End
    comment: str | None = None
    input_path: str | _Absent = ABSENT
    parameters: Json | _Absent = ABSENT
    result: Json | _Absent = ABSENT
    # None discards (JSON null: the input passes on); ABSENT leaves it out (the result replaces the input).
    result_path: str | _Absent | None = ABSENT

    def asl(self) -> Json:
        return _state("Pass", self.comment, ("InputPath", self.input_path), ("Parameters", self.parameters),
                      ("Result", self.result), ("ResultPath", self.result_path),
                      ("End", True) if self.next is None else ("Next", self.next))


@dataclass(frozen=True)
class Choice:
    """A Choice state: the first rule that holds names the next state, else ``default``."""

    choices: tuple[Json, ...]  # rules built with `when`
    default: str
    comment: str | None = None

    def asl(self) -> Json:
        return _state("Choice", self.comment, ("Choices", list(self.choices)), ("Default", self.default))


@dataclass(frozen=True)
class Wait:
    """A Wait state: a fixed number of ``seconds``, or as many as ``seconds_path`` says."""

    next: str
    seconds: int | _Absent = ABSENT
    seconds_path: str | _Absent = ABSENT
    comment: str | None = None

    def asl(self) -> Json:
        return _state("Wait", self.comment, ("Seconds", self.seconds), ("SecondsPath", self.seconds_path),
                      ("Next", self.next))


@dataclass(frozen=True)
class Fail:
    error: str
    cause_path: str

    def asl(self) -> Json:
        return _state("Fail", None, ("Error", self.error), ("CausePath", self.cause_path))


@dataclass(frozen=True)
class Succeed:
    def asl(self) -> Json:
        return _state("Succeed", None)


@dataclass(frozen=True)
class DistributedMap:
    """A Distributed Map reading JSONL from S3, batched, its results written to S3 (``ResultWriter``)."""

    next: str
    comment: str
    label: str
    item_reader: Json
    item_batcher: Json
    max_concurrency_path: str
    processor: Machine
    result_writer: Json
    result_path: str
    catch: tuple[Catch, ...]
    tolerated_failure_count: int = 0

    def asl(self) -> Json:
        processor = {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"}, **self.processor.asl()}
        return _state("Map", self.comment, ("Label", self.label), ("ItemReader", self.item_reader),
                      ("ItemBatcher", self.item_batcher), ("MaxConcurrencyPath", self.max_concurrency_path),
                      ("ToleratedFailureCount", self.tolerated_failure_count), ("ItemProcessor", processor),
                      ("ResultWriter", self.result_writer), ("ResultPath", self.result_path),
                      ("Catch", [c.asl() for c in self.catch]), ("Next", self.next))


@dataclass(frozen=True)
class Stage:
    """One stage of the run (Validate, Train, ...) as a Parallel state with a single branch, so the Step
    Functions console draws the stage as a box holding its states. The branch's output passes on unchanged
    (``OutputPath: $[0]`` unwraps the Parallel's one-element result), and a branch's error fails the stage
    with the same error and cause, as if its states were written inline."""

    branch: Machine
    next: str | None  # None: End
    comment: str | None = None

    def asl(self) -> Json:
        return _state("Parallel", self.comment, ("Branches", [self.branch.asl()]), ("OutputPath", "$[0]"),
                      ("End", True) if self.next is None else ("Next", self.next))


State = Task | Pass | Choice | Wait | Fail | Succeed | DistributedMap | Stage


def _targets(state: Json) -> list[str]:
    out = [state[key] for key in ("Next", "Default") if key in state]
    return out + [rule["Next"] for rule in state.get("Choices", []) + state.get("Catch", [])]


@dataclass(frozen=True)
class Machine:
    """States in the order they are written, the first one the start (unless ``start_at`` says otherwise)."""

    states: tuple[Named, ...]
    start_at: str | None = None
    comment: str | None = None
    timeout: int | None = None

    def __post_init__(self) -> None:
        # Names are unique across the whole machine, branches included: the console, the execution
        # history and d2ops_core.pipeline_stages know a state by its name alone.
        seen: set[str] = set()
        for name in self.names():
            if name in seen:
                raise ValueError(f"state {name!r} is defined twice")
            seen.add(name)
        seen = {name for name, _ in self.states}
        if not self.states:
            raise ValueError("a state machine needs at least one state")
        if self.start_at is not None and self.start_at not in seen:
            raise ValueError(f"StartAt names the missing state {self.start_at!r}")
        # A mistyped name fails here, at generation, not when a run first takes that branch.
        for name, state in self.states:
            for target in _targets(state.asl()):
                if target not in seen:
                    raise ValueError(f"state {name!r} goes to {target!r}, which is no state")

    def names(self) -> list[str]:
        """Every state's name, a Map's item processor's (or a stage's branch's) states after it."""
        out: list[str] = []
        for name, state in self.states:
            out.append(name)
            if isinstance(state, DistributedMap):
                out += state.processor.names()
            elif isinstance(state, Stage):
                out += state.branch.names()
        return out

    def asl(self) -> Json:
        out: Json = {}
        if self.comment is not None:
            out["Comment"] = self.comment
        out["StartAt"] = self.start_at or self.states[0][0]
        if self.timeout is not None:
            out["TimeoutSeconds"] = self.timeout
        out["States"] = {name: state.asl() for name, state in self.states}
        return out


# --- Choice rules ------------------------------------------------------------------------------


# The comparisons a Choice rule may make (those this definition uses; any ASL comparison operator fits).
Comparison = Literal["StringEquals", "StringEqualsPath", "StringMatches", "BooleanEquals", "IsPresent",
                     "NumericLessThan", "NumericLessThanPath", "NumericGreaterThanPath",
                     "NumericGreaterThanEqualsPath"]


@dataclass(frozen=True)
class Var:
    """A Choice rule's ``Variable``: ``Var("$.x").test("StringEquals", "a")`` is one comparison, in ASL's words."""

    path: str

    def test(self, comparison: Comparison, value: str | int | bool) -> Json:
        return {"Variable": self.path, comparison: value}

    def is_present(self, present: bool = True) -> Json:
        """IsPresent (``False``: the path must be absent)."""
        return self.test("IsPresent", present)

    def is_true(self) -> Json:
        return self.test("BooleanEquals", True)

    def one_of(self, *values: str) -> Json:
        """StringEquals any of ``values``."""
        return any_of(*(self.test("StringEquals", v) for v in values))

    def matches_any(self, *patterns: str) -> Json:
        """StringMatches any of ``patterns``."""
        return any_of(*(self.test("StringMatches", p) for p in patterns))


def all_of(*rules: Json) -> Json:
    return {"And": list(rules)}


def any_of(*rules: Json) -> Json:
    return {"Or": list(rules)}


def not_(rule: Json) -> Json:
    return {"Not": rule}


def when(rule: Json, next: str) -> Json:
    """A Choice rule with its transition."""
    return {**rule, "Next": next}


# --- Lambda tasks --------------------------------------------------------------------------------

LAMBDA_INVOKE = resource("lambda:invoke")


def payload_fields(model: type[BaseModel], exclude: Sequence[str] = ()) -> Json:
    """The ResultSelector that keeps an output model's fields from a ``lambda:invoke`` result, in its order."""
    unknown = set(exclude) - set(model.model_fields)
    if unknown:
        raise ValueError(f"{model.__name__} has no field {sorted(unknown)[0]!r} to exclude")
    return {f"{name}.$": f"$.Payload.{name}" for name in model.model_fields if name not in exclude}


def function_name(function: PipelineLambda) -> str:
    """A Lambda task's ``FunctionName``: the placeholder template.yaml substitutes with the function's ARN
    (``d2ops.functions.template_problems`` checks the substitution and the invoke policy are there)."""
    return sub(function.substitution)


def lambda_task(name: str, function: PipelineLambda, payload: Json | str, *, next: str | None, retry: RetryPolicy,
                comment: str | None = None, result_selector: Json | _Absent = ABSENT,
                result_path: str | _Absent | None = ABSENT, output_path: str | _Absent = ABSENT,
                timeout: int | _Absent = ABSENT, catch: tuple[Catch, ...] = ()) -> Named:
    """Invoke ``function`` (an entry of ``d2ops.functions.PIPELINE_LAMBDAS``) with ``payload`` (an object, or a
    path to pass whole)."""
    parameters: Json = {"FunctionName": function_name(function)}
    if isinstance(payload, str):
        parameters["Payload.$"] = payload
    else:
        parameters["Payload"] = payload
    return name, Task(LAMBDA_INVOKE, next, comment=comment, parameters=parameters, result_selector=result_selector,
                      result_path=result_path, output_path=output_path, timeout=timeout, retry=(retry,), catch=catch)


# --- counters (the bounded loops' bookkeeping) ---------------------------------------------------


def start_counter(name: str, path: str, next: str, **initial: int) -> Named:
    """A Pass that sets ``path`` to ``initial`` (e.g. ``attempts=0``)."""
    return name, Pass(next, result=dict(initial), result_path=path)


def count(name: str, path: str, next: str, *, counter: str, doubling: str | None = None) -> Named:
    """A Pass adding one to ``path.counter`` (and doubling ``path.doubling``, a backoff)."""
    parameters = {f"{counter}.$": f"States.MathAdd({path}.{counter}, 1)"}
    if doubling is not None:
        parameters[f"{doubling}.$"] = f"States.MathAdd({path}.{doubling}, {path}.{doubling})"
    return name, Pass(next, parameters=parameters, result_path=path)


# --- the failure triple ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailureKind:
    """A way the run fails: the error name of ``$.failure`` and of the Fail state that ends the run."""

    error: str
    fail_state: str


FAILURE_PATH = "$.failure"
FAILURE_CAUSE = "$.failure.cause"


def record_failure(name: str, kind: FailureKind, cause: str, *, next: str | None, comment: str | None = None,
                   **extra: Any) -> Named:
    """The Pass that records ``$.failure`` (error, cause, run, dataset, then ``extra``) for the notification
    and the Fail state. ``cause`` is a path or intrinsic (``cause.$``); ``extra`` keys are written as given."""
    parameters: Json = {"error": kind.error, "cause.$": cause, "run_id.$": RUN_ID, "dataset.$": "$.dataset", **extra}
    return name, Pass(next, comment=comment, parameters=parameters, result_path=FAILURE_PATH)


def route_failures(name: str, kinds: Sequence[FailureKind], default: FailureKind) -> Named:
    """The Choice sending each recorded failure to its Fail state."""
    error = Var(f"{FAILURE_PATH}.error")
    routes = tuple(when(error.test("StringEquals", k.error), k.fail_state) for k in kinds)
    return name, Choice(routes, default.fail_state)


def fail_states(kinds: Sequence[FailureKind]) -> list[Named]:
    return [(k.fail_state, Fail(k.error, FAILURE_CAUSE)) for k in kinds]


# --- create-or-find -----------------------------------------------------------------------------------


def already_created(name: str, cause: str | tuple[str, ...], *, found: str, otherwise: str) -> Named:
    """The Choice telling "the name is taken" (what a retry after a lost create response sees) by the Cause."""
    comment = ("A retry after a lost response finds the name taken by what the first attempt created: "
               "look at it instead of failing.")
    rule = Var("$.error.Cause").test("StringMatches", cause) if isinstance(cause, str) else \
        Var("$.error.Cause").matches_any(*cause)
    return name, Choice((when(rule, found),), otherwise, comment=comment)


@dataclass(frozen=True)
class Lookup:
    """How a created resource is read back: the describe call, its parameters, what it keeps and where."""

    name: str
    integration: str
    parameters: Json
    result_selector: Json
    result_path: str


def create_or_find(create: Named, *, thing: str, exists_cause: str, lookup: Lookup, ours: Json, next: str,
                   failed: str, retry: RetryPolicy) -> list[Named]:
    """A create call whose "already exists" refusal (a retry after a lost response) is followed by a lookup:
    the resource is ours when ``ours`` holds, else the step fails."""
    exists = f"{thing[0].upper()}{thing[1:]} already created?"
    is_ours = f"Created {thing} is ours?"
    return [
        create,
        already_created(exists, exists_cause, found=lookup.name, otherwise=failed),
        (lookup.name, Task(resource(lookup.integration), is_ours, parameters=lookup.parameters,
                           result_selector=lookup.result_selector, result_path=lookup.result_path, retry=(retry,),
                           catch=catch_all(failed, "$.find_error"))),
        (is_ours, Choice((when(ours, next),), failed,
                         comment="Ours if it is what this run asked for; a name taken by something else fails the "
                                 "deployment.")),
    ]


@dataclass(frozen=True)
class SyncJob:
    """A SageMaker job the pipeline starts with ``.sync`` (``training`` or ``evaluation``)."""

    kind: str  # the word in the state names: "training", "evaluation"
    api: str  # "TrainingJob", "ProcessingJob"
    create_name: str  # the .sync state
    create_comment: str
    request_path: str  # the Create* request in $
    result_selector: Json  # what the .sync state keeps of the job's description
    result_path: str
    output_field: str  # where the job writes, in its description (and the request)
    check_every: int  # seconds between checks of a job a lost response started
    max_checks: int
    ours_comment_tail: str


# The .sync creates' errors that do not end the run by themselves: a name in use (the job a lost answer's first
# attempt started), a lost answer, and SageMaker's unmodelled errors (throttling and 5xx among them).
SYNC_CREATE_RECOVERABLE = ("SageMaker.ResourceInUseException", "SageMaker.AmazonSageMakerException",
                           "SageMaker.SdkClientException")


def sync_job_create_or_find(job: SyncJob, *, next: str | None, failed: str, create_retries: int = 5,
                            first_retry_seconds: int = 15, retry: RetryPolicy) -> list[Named]:
    """The ``.sync`` create, made safe to repeat.

    A retry after a lost Create* response (``SageMaker.SdkClientException``) finds the name taken
    (``SageMaker.ResourceInUseException``: SageMaker models it, so the optimised integration keeps its name) by
    the job the first attempt started: that job is checked (ours if it writes where this run reads) and waited
    for, bounded. A transient refusal (throttling, 5xx, no answer) is retried by states, at most
    ``create_retries`` times, doubling from ``first_retry_seconds``; anything else fails at once (a Retry cannot
    tell throttling from a validation or access refusal: SageMaker models neither, so both are
    AmazonSageMakerException, the code only in the Cause).
    """
    k = job.kind
    created = f"Start waiting for created {k} job"
    retry_decision = f"Retry creating {k} job?"
    retries_left = f"{k.capitalize()} job creation retries left?"
    start_retrying, wait_retry = f"Start retrying {k} job creation", f"Wait to retry creating {k} job"
    count_retry = f"Count {k} job creation retry"
    check, is_ours = f"Check created {k} job", f"Created {k} job is ours?"
    wait_created, count_check = f"Wait for created {k} job", f"Count created {k} job check"
    read, read_failure = f"Read created {k} job", f"Read created {k} job failure"
    retry_path, wait_path, created_path = f"$.{k}_create_retry", f"$.created_{k}_wait", f"$.created_{k}"
    api = job.api
    name_param = {f"{api}Name.$": f"{job.request_path}.{api}Name"}
    describe = resource(f"aws-sdk:sagemaker:describe{api}")
    status = Var(f"{created_path}.status")

    def describe_task(next_state: str | None, result_selector: Json, result_path: str,
                      comment: str | None = None) -> Task:
        return Task(describe, next_state, comment=comment, parameters=name_param, result_selector=result_selector,
                    result_path=result_path, retry=(retry,), catch=catch_all(failed),
                    comment_after="Parameters")

    return [
        (job.create_name, Task(resource(f"sagemaker:create{api}.sync"), next, comment=job.create_comment,
                               input_path=job.request_path, result_selector=job.result_selector,
                               result_path=job.result_path,
                               catch=(Catch(f"{k.capitalize()} job already created?", SYNC_CREATE_RECOVERABLE),
                                      *catch_all(failed)))),
        (f"{k.capitalize()} job already created?", Choice(
            (when(Var("$.error.Error").test("StringEquals", "SageMaker.ResourceInUseException"), created),),
            retry_decision,
            comment=f"A retry after a lost Create{api} response finds the name taken by the job the first attempt "
                    "started (SageMaker.ResourceInUseException: SageMaker models it, so the optimised integration "
                    "keeps its name). Wait for that job instead of failing.")),
        (retry_decision, Choice(
            (when(any_of(Var("$.error.Error").test("StringEquals", "SageMaker.SdkClientException"),
                         *(Var("$.error.Cause").test("StringMatches", pattern) for pattern in (
                             "*Error Code: Throttling*", "*Error Code: InternalFailure*",
                             "*Error Code: ServiceUnavailable*", "*Status Code: 5*"))), retries_left),),
            failed,
            comment=f"Create{api} was refused. Only a refusal that can pass is tried again: throttling, an internal "
                    "or 5xx error (AmazonSageMakerException, the code in the Cause), a request whose answer never "
                    "came (SdkClientException). A validation or access refusal (AmazonSageMakerException too) fails "
                    "the run at once, with its reason. So does a quota, SageMaker.ResourceLimitExceededException, "
                    "which the Catch sends straight to the failure record: AWS's createTrainingJob.sync example "
                    "retries it because there it counts concurrent jobs, which free up; this stack runs one job at "
                    "a time (the endpoint lease), so the quota it meets is an instance quota (a new account's 0 "
                    "spot GPUs) that no wait raises, and the failure names the quota and how to raise it.")),
        (retries_left, Choice(
            (when(not_(Var(retry_path).is_present()), start_retrying),
             when(Var(f"{retry_path}.attempts").test("NumericLessThan", create_retries), wait_retry)),
            failed,
            comment=f"At most {create_retries} retries, {first_retry_seconds} s doubling "
                    f"({first_retry_seconds * (2 ** create_retries - 1)} s of waits in all).")),
        start_counter(start_retrying, retry_path, wait_retry, attempts=0, seconds=first_retry_seconds),
        (wait_retry, Wait(count_retry, seconds_path=f"{retry_path}.seconds",
                          comment="No jitter: the endpoint lease lets only one run of the stack this far at a "
                                  "time.")),
        count(count_retry, retry_path, job.create_name, counter="attempts", doubling="seconds"),
        start_counter(created, wait_path, check, checks=0),
        (check, Task(describe, is_ours, parameters=name_param,
                     result_selector={"status.$": f"$.{api}Status", "output.$": f"$.{job.output_field}"},
                     result_path=created_path, retry=(retry,), catch=catch_all(failed))),
        (is_ours, Choice(
            (when(not_(Var(f"{created_path}.output").test("StringEqualsPath",
                                                           f"{job.request_path}.{job.output_field}")), failed),
             when(status.test("StringEquals", "Completed"), read),
             when(status.one_of("Failed", "Stopped"), read_failure),
             when(all_of(status.one_of("InProgress", "Stopping"),
                         Var(f"{wait_path}.checks").test("NumericLessThan", job.max_checks)), wait_created)),
            failed,
            comment="Ours if it writes where this run reads (the run id is in its name and its output path). "
                    f"Bounded: {job.max_checks} checks {job.check_every} s apart outlast the longest such job the "
                    "stack allows (SageMaker ends a job at its StoppingCondition)" + job.ours_comment_tail)),
        (wait_created, Wait(count_check, seconds=job.check_every)),
        count(count_check, wait_path, check, counter="checks"),
        (read, describe_task(next, job.result_selector, job.result_path,
                             "The fields the .sync state selects, in the same place.")),
        (read_failure, describe_task(failed, {"Error": "States.TaskFailed", "Cause.$": "States.JsonToString($)"},
                                     "$.error",
                                     "What the .sync state's Catch records for a failed or stopped job: "
                                     "States.TaskFailed with the job's description as the Cause.")),
    ]


def render(definition: Machine) -> str:
    """The file's text: two-space indented JSON and a final newline, as the committed file is written."""
    return json.dumps(definition.asl(), indent=2, ensure_ascii=False) + "\n"
