"""The shapes this pipeline repeats, built from ``d2ops.statemachine.asl``'s generic states.

The repeated shapes are functions returning ``(name, state)`` pairs:

- ``lambda_task``: a ``lambda:invoke`` Task whose ResultSelector is the handler's pydantic output
  model's fields (``payload_fields``), so a field added to the model reaches ``$`` without an edit here;
- ``sync_job_create_or_find``: the ``.sync`` SageMaker job create whose lost response is recovered by
  finding the job the first attempt started (and whose transient refusals are retried by states,
  since a Retry cannot tell throttling from a validation or access refusal: one name for all three);
- ``create_or_find``: the same idea for a create call that returns at once (model, endpoint config);
- ``FailureKind`` with ``record_failure``, ``route_failures`` and ``fail_states``: the failure triple
  (a Pass recording ``$.failure``, the Choice routing on its error, the Fail state named after it);
- ``RETRY_POLICIES``: one named Retry shape per kind of call;
- ``StageParallel``: a stage of the run as a single-branch Parallel, which the Step Functions console draws
  as one box holding the stage's states, with what a reader needs that the definition does not say (the
  stage's key, its loops' titles, an expected miss's meaning): ``d2ops.statemachine.stage_table`` writes
  them, with the stages' states, to ``d2ops_core/pipeline_stage_table.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from d2ops.functions import PipelineLambda
from d2ops.statemachine.asl import (
    ABSENT,
    RUN_ID,
    Catch,
    Choice,
    Fail,
    Json,
    Named,
    Pass,
    RetryPolicy,
    SingleBranchParallel,
    Task,
    Var,
    Wait,
    _Absent,
    all_of,
    any_of,
    catch_all,
    not_,
    resource,
    sub,
    when,
)

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

    # The states the create-or-find and its loops (sync_job_loops) both name.
    @property
    def start_retrying(self) -> str:
        return f"Start retrying {self.kind} job creation"

    @property
    def wait_retry(self) -> str:
        return f"Wait to retry creating {self.kind} job"

    @property
    def start_waiting(self) -> str:
        return f"Start waiting for created {self.kind} job"

    @property
    def wait_created(self) -> str:
        return f"Wait for created {self.kind} job"


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
    created = job.start_waiting
    retry_decision = f"Retry creating {k} job?"
    retries_left = f"{k.capitalize()} job creation retries left?"
    start_retrying, wait_retry = job.start_retrying, job.wait_retry
    count_retry = f"Count {k} job creation retry"
    check, is_ours = f"Check created {k} job", f"Created {k} job is ours?"
    wait_created, count_check = job.wait_created, f"Count created {k} job check"
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
                               catch=(ExpectedCatch(f"{k.capitalize()} job already created?", SYNC_CREATE_RECOVERABLE,
                                                    meaning=f"the {k} job exists already (or its creation is "
                                                            "retried)",
                                                    recovered_by=(created, start_retrying, wait_retry)),
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


# --- the run's stages, and how people read them ------------------------------------------------------------
# What d2ops status, d2ops graph and the console show beside the states (d2ops_core.pipeline_stages) that the
# definition does not say itself, declared with the states it talks about; `make asl` writes the stage table.


@dataclass(frozen=True)
class ExpectedCatch(Catch):
    """A Catch whose errors are a normal outcome of its Task, not a failure, when the run goes on to one of
    ``recovered_by`` (by default the Catch's own target): d2ops_core.pipeline_stages.EXPECTED_MISSES."""

    meaning: str = field(kw_only=True)  # what a reader is told the miss was
    recovered_by: tuple[str, ...] = field(default=(), kw_only=True)

    def recovering_states(self) -> tuple[str, ...]:
        return self.recovered_by or (self.next,)


@dataclass(frozen=True)
class LoopReading:
    """A wait/count/check cycle read as one line (d2ops_core.pipeline_stages.LOOPS): the states on a cycle
    through ``head`` (its Wait state: one visit a round), with ``entry`` (the Pass that starts the count) and
    without ``retries`` (the task a retry loop starts again) or ``apart`` (work on the cycle that is a line of
    its own)."""

    head: str
    title: str | None = None  # the head's name unless given
    entry: str | None = None
    retries: str | None = None
    apart: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageParallel(SingleBranchParallel):
    """One stage of the run (Validate, Train, ...): its ``key`` (d2ops_core.pipeline_stages.Stage.key), the
    loops a reader sees as one line, and ``reading_order``: ``(after, states)`` moves that put the stage's
    states in the order people read them (the console's list of states a run did not reach) where that is
    not the order the definition writes them."""

    key: str = field(kw_only=True)
    loops: tuple[LoopReading, ...] = field(default=(), kw_only=True)
    reading_order: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), kw_only=True)


def sync_job_loops(job: SyncJob) -> tuple[LoopReading, ...]:
    """The two loops of ``sync_job_create_or_find``: retrying the create (the create itself a line of its own),
    and waiting for a job a lost answer started."""
    return (LoopReading(job.wait_retry, title=f"Retry creating {job.kind} job", retries=job.create_name),
            LoopReading(job.wait_created, entry=job.start_waiting))
