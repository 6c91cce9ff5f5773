"""Typed builders for an Amazon States Language definition: its states, Retry and Catch, Choice rules.

Each state is a small frozen dataclass whose ``asl()`` is its JSON object, keys in the order the
committed ``statemachine/*.asl.json`` writes them (Type, Comment, inputs, outputs, error handling,
transition), so the generated file reads like a hand-written one and diffs stay small. Nothing here
knows this project: the shapes the pipeline repeats (its retry policies, the create-or-find and
failure patterns, its stages) are in ``d2ops.statemachine.patterns``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

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
class SingleBranchParallel:
    """A Parallel state with a single branch: a group of states the Step Functions console draws as one box
    (d2ops.statemachine.patterns.StageParallel: a stage of the run). The branch's output passes on unchanged
    (``OutputPath: $[0]`` unwraps the Parallel's one-element result), and a branch's error fails the Parallel
    with the same error and cause, as if its states were written inline."""

    branch: Machine
    next: str | None  # None: End
    comment: str | None = None

    def asl(self) -> Json:
        return _state("Parallel", self.comment, ("Branches", [self.branch.asl()]), ("OutputPath", "$[0]"),
                      ("End", True) if self.next is None else ("Next", self.next))


State = Task | Pass | Choice | Wait | Fail | Succeed | DistributedMap | SingleBranchParallel


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
            elif isinstance(state, SingleBranchParallel):
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


def render(definition: Machine) -> str:
    """The file's text: two-space indented JSON and a final newline, as the committed file is written."""
    return json.dumps(definition.asl(), indent=2, ensure_ascii=False) + "\n"
