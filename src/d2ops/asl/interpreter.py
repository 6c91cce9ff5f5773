"""Executions of a validated ASL definition with the semantics of AWS Step Functions.

States run in their own query language (JSONPath, or JSONata through ``jsonata_expr``) and share
workflow variables (``variables``), scoped per Parallel branch and Map iteration.

``StateMachine`` holds a validated definition; ``run`` executes it in the calling thread and
``start`` in a background thread. Each ``Execution`` records its history in the
GetExecutionHistory event shape, can be aborted from any thread, and reports status, output,
error and cause like DescribeExecution.
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import random
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

from d2ops.asl import distributed, intrinsics, jsonata_expr
from d2ops.asl.callbacks import TaskTokens, new_token
from d2ops.asl.choice import evaluate_rule
from d2ops.asl.clock import Cancel, Clock, VirtualClock, iso
from d2ops.asl.definition import JSONATA, JSONPATH, is_timestamp, parse_intrinsic, task_states, validate
from d2ops.asl.errors import (
    DATA_LIMIT_EXCEEDED,
    HEARTBEAT_TIMEOUT,
    NO_CHOICE_MATCHED,
    RESULT_PATH_MATCH_FAILURE,
    RUNTIME,
    TIMEOUT,
    AslDefinitionError,
    ExecutionAborted,
    ExecutionHistoryLimitExceeded,
    ExecutionTimedOut,
    StatesError,
    TaskFailed,
)
from d2ops.asl.executors import ExecutorRegistry, TaskContext, TaskDeadline, TaskExecutor
from d2ops.asl.jsonvalue import MAX_JSON_DEPTH, json_problem, text_too_deep
from d2ops.asl.mock import MockTestCase
from d2ops.asl.paths import PathError, no_results, parse_reference_path, select, set_reference
from d2ops.asl.service_arn import parse_service_arn
from d2ops.asl.substitution import substitute
from d2ops.asl.variables import VariableScope, reading, split_path

log = logging.getLogger(__name__)

PAYLOAD_LIMIT_BYTES = 256 * 1024
# Wait limits (https://docs.aws.amazon.com/step-functions/latest/dg/state-wait.html): Seconds from 0
# to 99999999; timestamps in RFC 3339 with an uppercase T and Z (or a numeric offset), considered to
# the second. A Standard execution runs at most one year and then fails with States.Timeout
# (https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html), whatever it waits for.
MAX_WAIT_SECONDS = 99_999_999
# The longest delay a Wait state may compute (from SecondsPath or a timestamp): about 68 years, the service's
# 32-bit count of seconds. AWS-recorded: a TimestampPath 24,855 days ahead waits (the execution then times out
# at one year), 24,856 days ahead fails at once with States.Runtime "Wait state delay is too long." (LocalStack's
# snapshot test_wait.py::test_timestamp_too_far_in_future_boundary, recorded against AWS).
MAX_WAIT_DELAY_SECONDS = 2**31 - 1
MAX_EXECUTION_SECONDS = 365 * 24 * 3600
# A Standard execution's history holds at most 25,000 events; at that point the execution fails
# (https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html). Offline this also ends
# an endless loop (Pass -> Pass) instead of spinning forever on a virtual clock.
MAX_HISTORY_EVENTS = 25_000
_EXECUTION_NAME = re.compile(r"^[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f]{1,80}$")
_LAMBDA_FUNCTION_ARN = re.compile(r"^arn:[^:]+:lambda:[^:]*:[^:]*:function:")
_DEFAULT_MAP_CONCURRENCY = 40
# A *Path number the service reads from text: AWS-recorded runs accept "1" from a variable for MaxConcurrencyPath,
# ToleratedFailureCountPath/PercentagePath, MaxItemsPath and the batcher paths, and refuse "NoNumber" and 1.5.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")

EventCallback = Callable[[dict[str, Any]], None]
_Step = tuple[Any, str | None]  # a state's output and the next state's name (None: the end)
Executors: TypeAlias = Mapping[str, TaskExecutor] | ExecutorRegistry


class _BranchCancelled(Exception):
    pass


def describe_response(*, arn: str, state_machine_arn: str, name: str, status: str, start_date: Any, input: str,
                      stop_date: Any, output: str | None, error: str | None, cause: str | None) -> dict[str, Any]:
    """The DescribeExecution response shape (input and output as JSON strings): stopDate, output, error and
    cause only when the execution has them. One home for the interpreter's and the offline store's answers."""
    result: dict[str, Any] = {"executionArn": arn, "stateMachineArn": state_machine_arn, "name": name,
                              "status": status, "startDate": start_date, "input": input,
                              "inputDetails": {"included": True}}
    if stop_date is not None:
        result["stopDate"] = stop_date
    if output is not None:
        result["output"] = output
        result["outputDetails"] = {"included": True}
    if error:
        result["error"] = error
    if cause:
        result["cause"] = cause
    return result


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _parse_timestamp(value: Any) -> datetime | None:
    """A Wait timestamp as Step Functions reads it: RFC 3339 with ``T`` and ``Z`` or an offset, to the second."""
    if not is_timestamp(value):
        return None
    try:
        return datetime.fromisoformat(value).replace(microsecond=0)
    except ValueError:  # the right shape but no such date (2024-02-30)
        return None


def _is_callback(resource: str) -> bool:
    """A Task of the callback pattern: it waits for its task token after the service call."""
    return resource.endswith(".waitForTaskToken")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _size(value: Any) -> int:
    return len(_dumps(value).encode("utf-8"))


def _json_copy(value: Any, what: str) -> Any:
    problem = json_problem(value)
    if problem is not None:
        raise StatesError(RUNTIME, f"{what} is not a valid JSON payload: {problem}")
    try:
        return json.loads(_dumps(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise StatesError(RUNTIME, f"{what} is not JSON-serializable: {exc}") from exc


def _brief(value: Any, limit: int = 300) -> str:
    text = _dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _details_key(event_type: str) -> str:
    if event_type.endswith("StateEntered"):
        return "stateEnteredEventDetails"
    if event_type.endswith("StateExited"):
        return "stateExitedEventDetails"
    return event_type[0].lower() + event_type[1:] + "EventDetails"


def _error_details(error: str, cause: str) -> dict[str, str]:
    details = {}
    if error:
        details["error"] = error
    if cause:
        details["cause"] = cause
    return details


@dataclass
class _Frame:
    """Where a branch of execution is: its last event (for previousEventId), its stop signal, the
    variables it sees, and the assignments of the state it is running (committed when it exits)."""

    last_event: int
    cancel: Cancel
    variables: VariableScope
    assigned: dict[str, Any] | None = None


class StateMachine:
    """A validated ASL definition, ready to run. Use ``from_file`` or ``from_definition``."""

    def __init__(self, definition: dict[str, Any], *, name: str, region: str = "us-east-1",
                 account_id: str = "123456789012", role_arn: str | None = None, source: str | None = None) -> None:
        validate(definition, source=source)
        self.definition = definition
        self.name = name
        self.region = region
        self.account_id = account_id
        self.arn = f"arn:aws:states:{region}:{account_id}:stateMachine:{name}"
        self.role_arn = role_arn or f"arn:aws:iam::{account_id}:role/{name}-role"
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path, substitutions: Mapping[str, object] | None = None,
                  name: str | None = None, **options: Any) -> StateMachine:
        """Load ``path``, replace ``${Key}`` placeholders, validate. The name defaults to the file
        name without ``.asl.json`` (or ``.json``)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise AslDefinitionError(f"cannot read the definition: {exc}", source=str(path)) from exc
        except UnicodeDecodeError as exc:
            raise AslDefinitionError(f"the definition is not UTF-8 text: {exc}", source=str(path)) from exc
        return cls.from_definition(text, name=name or definition_name(path), substitutions=substitutions,
                                   source=str(path), **options)

    @classmethod
    def from_definition(cls, definition: str | dict[str, Any], name: str = "StateMachine", *,
                        substitutions: Mapping[str, object] | None = None, source: str | None = None,
                        **options: Any) -> StateMachine:
        if not isinstance(definition, str):
            problem = json_problem(definition)
            if problem is not None:
                raise AslDefinitionError(f"not a usable definition: {problem}", source=source)
        text = definition if isinstance(definition, str) else json.dumps(definition)
        text = substitute(text, substitutions, source=source)
        if text_too_deep(text):
            raise AslDefinitionError(f"not a usable definition: it is nested more than {MAX_JSON_DEPTH} levels deep",
                                     source=source)
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, or an integer of over 4300 digits
            raise AslDefinitionError(f"not valid JSON: {exc}", source=source) from exc
        return cls(parsed, name=name, source=source, **options)

    def start(self, input: Any = None, **options: Any) -> Execution:
        """Start an execution in a background thread and return it at once (see ``run`` for options).

        Meant for the offline runtime, so the clock defaults to real time (``Clock()``)."""
        options.setdefault("clock", Clock())
        execution = self._prepare(input, **options)
        thread = threading.Thread(target=execution._execute, name=f"asl-{execution.name}", daemon=True)
        thread.start()
        return execution

    def run(self, input: Any = None, **options: Any) -> Execution:
        """Run an execution to its end in the calling thread and return it.

        Options: ``executors`` (a mapping of resource ARN or glob -> executor, or an
        ExecutorRegistry), ``mock`` (a MockTestCase), ``execution_name``, ``clock`` (default: a
        VirtualClock), ``on_event`` (called with each history event as it is recorded), ``rng``
        (random.Random for jitter, UUIDs, MathRandom and task tokens), ``callbacks`` (the TaskTokens
        registry that SendTaskSuccess/Failure/Heartbeat reach; default: the execution's own, ``callbacks``).
        """
        execution = self._prepare(input, **options)
        execution._execute()
        return execution

    def _prepare(self, input: Any, *, executors: Executors | None = None, mock: MockTestCase | None = None,
                 execution_name: str | None = None, clock: Clock | None = None, on_event: EventCallback | None = None,
                 rng: random.Random | None = None, callbacks: TaskTokens | None = None) -> Execution:
        registry = executors if isinstance(executors, ExecutorRegistry) else ExecutorRegistry(executors or {})
        self.check_tasks(registry, mock)
        name = execution_name or str(uuid.uuid4())
        if not _EXECUTION_NAME.match(name):
            raise ValueError(f"invalid execution name {name!r}: 1-80 characters without whitespace "
                             "or any of <>{}[]?*\"#%\\^|~`$&,;:/")
        problem = json_problem(input)
        if problem is not None:
            raise ValueError(f"the execution input is not valid JSON for Step Functions: {problem}")
        try:
            data = json.loads(_dumps({} if input is None else input))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"the execution input is not JSON-serializable: {exc}") from exc
        if _size(data) > PAYLOAD_LIMIT_BYTES:
            raise ValueError(f"the execution input is {_size(data)} bytes, over the {PAYLOAD_LIMIT_BYTES} byte limit")
        return Execution(self, data, name=name, registry=registry, mock=mock, clock=clock or VirtualClock(),
                         on_event=on_event, rng=rng or random.Random(), callbacks=callbacks or TaskTokens())

    def check_tasks(self, registry: ExecutorRegistry, mock: MockTestCase | None) -> None:
        """Refuse to start when a mock test case names something that is not a Task state or, without
        a mock, when a Task state has no executor. (With a mock, an unmocked Task state without an
        executor fails the execution only if it is reached: a test case mocks the path it takes.)"""
        problems = []
        tasks = dict(task_states(self.definition))
        if mock is not None:
            problems += [f"the mock test case {mock.name!r} mocks {state!r}, which is not a Task state of this "
                         "definition" for state in mock.responses if state not in tasks]
        else:
            problems += [f"Task state {name!r}: no mocked response and no executor for {state['Resource']!r}"
                         for name, state in tasks.items() if registry.resolve(state["Resource"]) is None]
        if problems:
            raise AslDefinitionError(problems, source=self.source)


def definition_name(path: str | Path) -> str:
    """The state machine name a definition file stands for: its name without .asl.json / .json."""
    base = Path(path).name
    for suffix in (".asl.json", ".json"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


class Execution:
    """One run of a state machine. Attributes mirror DescribeExecution; ``history`` mirrors
    GetExecutionHistory's ``events`` (timestamps are timezone-aware datetimes, as boto3 returns)."""

    def __init__(self, machine: StateMachine, input: Any, *, name: str, registry: ExecutorRegistry,
                 mock: MockTestCase | None, clock: Clock, on_event: EventCallback | None,
                 rng: random.Random, callbacks: TaskTokens | None = None) -> None:
        self.state_machine = machine
        self.input = input
        self.name = name
        self.arn = f"arn:aws:states:{machine.region}:{machine.account_id}:execution:{machine.name}:{name}"
        self.status = "RUNNING"
        self.output: Any = None
        self.error: str | None = None
        self.cause: str | None = None
        self.clock = clock
        self.start_date = clock.now()
        self.stop_date: datetime | None = None
        self._registry = registry
        self._mock = mock
        # Where this execution's .waitForTaskToken tasks wait for SendTaskSuccess/Failure/Heartbeat.
        self.callbacks = callbacks if callbacks is not None else TaskTokens()
        self._on_event = on_event
        self._rng = rng
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._invocations: dict[str, int] = {}
        self._invocation_lock = threading.Lock()  # shared with Distributed Map children (mock counters)
        self._history_limit = MAX_HISTORY_EVENTS  # an Express child keeps no history of its own to limit
        self._cancel_means_abort = False  # True for a Distributed Map child (see _execute)
        self._timeout_cause_text: str | None = None
        # Distributed Map runs: map run ARN -> DescribeMapRun's fields + "executions" (the child Executions)
        self.map_runs: dict[str, dict[str, Any]] = {}
        self._cancel = Cancel()
        self._abort_requested = threading.Event()
        self._abort_details: tuple[str, str] = ("", "")
        self._timed_out = False
        self._done = threading.Event()
        timeout = machine.definition.get("TimeoutSeconds")
        self._deadline = self.start_date + timedelta(seconds=min(timeout or MAX_EXECUTION_SECONDS,
                                                                 MAX_EXECUTION_SECONDS))
        self._entered = threading.local()  # the StateEntered event id of the state running on this thread

    # ----- public API -------------------------------------------------------------------------
    @property
    def history(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    @property
    def children(self) -> list[Execution]:
        """Every child execution of this execution's Distributed Map runs, in Map Run and item order."""
        return [child for run in list(self.map_runs.values()) for child in run["executions"]]

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the execution ends (True) or ``timeout`` seconds pass (False)."""
        return self._done.wait(timeout)

    def abort(self, error: str = "", cause: str = "") -> None:
        """StopExecution: the execution ends ABORTED at its next check (running tasks are abandoned)."""
        self._abort_details = (error, cause)
        self._abort_requested.set()
        self._cancel.set()

    def describe(self) -> dict[str, Any]:
        """The DescribeExecution response shape (input and output as JSON strings)."""
        return describe_response(arn=self.arn, state_machine_arn=self.state_machine.arn, name=self.name,
                                 status=self.status, start_date=self.start_date, input=_dumps(self.input),
                                 stop_date=self.stop_date,
                                 output=_dumps(self.output) if self.status == "SUCCEEDED" else None,
                                 error=self.error, cause=self.cause)

    # ----- the run ---------------------------------------------------------------------------
    def _execute(self) -> None:
        frame = _Frame(0, self._cancel, VariableScope())
        self._event(frame, "ExecutionStarted", {"input": _dumps(self.input), "inputDetails": {"truncated": False},
                                                "roleArn": self.state_machine.role_arn})
        # The service records the first state's Entered event with previousEventId 0, not 1 (every history in
        # LocalStack's snapshots recorded against AWS); the chain goes on from there.
        frame.last_event = 0
        try:
            output = self._run_scope(self.state_machine.definition, self.input, frame)
            self._finish("SUCCEEDED", output=output)
            self._event(frame, "ExecutionSucceeded", {"output": _dumps(output), "outputDetails": {"truncated": False}})
        except StatesError as err:
            self._finish("FAILED", error=err.error, cause=err.cause)
            self._event(frame, "ExecutionFailed", _error_details(err.error, err.cause))
        except ExecutionAborted:
            error, cause = self._abort_details
            self._finish("ABORTED", error=error, cause=cause)
            self._event(frame, "ExecutionAborted", _error_details(error, cause))
        except ExecutionHistoryLimitExceeded:
            # The service's words (the Standard quota; an endless loop or too large an inline Map gets here).
            cause = f"The execution reached the maximum number of history events ({MAX_HISTORY_EVENTS})."
            self._finish("FAILED", error=RUNTIME, cause=cause)
            self._event(frame, "ExecutionFailed", _error_details(RUNTIME, cause))
        except (ExecutionTimedOut, _BranchCancelled) as exc:
            if isinstance(exc, _BranchCancelled) and self._cancel_means_abort and not self._timed_out:
                # A Distributed Map child its Map Run stopped (a failed sibling over the threshold, the
                # parent's end): ABORTED, as the service records such children.
                self._finish("ABORTED")
                self._event(frame, "ExecutionAborted", None)
                return
            limit = self.state_machine.definition.get("TimeoutSeconds")
            cause = (f"the execution ran longer than its TimeoutSeconds ({limit})" if limit and
                     limit <= MAX_EXECUTION_SECONDS else "the execution ran longer than one year, the "
                     "maximum duration of a Standard workflow execution")
            if self._timeout_cause_text and not (limit and limit <= MAX_EXECUTION_SECONDS):
                cause = self._timeout_cause_text
            self._finish("TIMED_OUT", error=TIMEOUT, cause=cause)
            self._event(frame, "ExecutionTimedOut", _error_details(TIMEOUT, cause))
        except Exception as exc:  # an interpreter or executor bug must still end the execution
            log.exception("execution %s crashed", self.arn)
            self._finish("FAILED", error=RUNTIME, cause=f"internal interpreter error: {exc!r}")
            self._event(frame, "ExecutionFailed", _error_details(RUNTIME, f"internal interpreter error: {exc!r}"))
        finally:
            self._done.set()

    def _finish(self, status: str, *, output: Any = None, error: str = "", cause: str = "") -> None:
        with self._lock:
            self.status = status
            self.output = output
            self.error = error or None
            self.cause = cause or None
            self.stop_date = self.clock.now()

    def _event(self, frame: _Frame, event_type: str, details: dict[str, Any] | None,
               abandoned: Cancel | None = None) -> int:
        """Record one history event. An event of a worker its state has ``abandoned`` (abort, timeout, failed
        sibling) is dropped: checked under the lock the state's own TaskStateAborted/TaskTimedOut/... takes, so
        it lands before that event or not at all, never after the execution's end."""
        with self._lock:
            if abandoned is not None and abandoned.is_set():
                return frame.last_event
            event_id = len(self._events) + 1
            event: dict[str, Any] = {"timestamp": self.clock.now(), "type": event_type, "id": event_id,
                                     "previousEventId": frame.last_event}
            if details is not None:
                event[_details_key(event_type)] = details
            self._events.append(event)
            frame.last_event = event_id
        if self._on_event is not None:
            try:
                self._on_event(dict(event))
            except Exception:  # a broken progress display must not break the execution
                log.exception("on_event callback failed for event %s", event_type)
        return event_id

    def _abort_failed_task(self, err: StatesError, frame: _Frame) -> None:
        """AWS records TaskStateAborted for a Task whose failure ends its Parallel branch or Map iteration
        (after MapIterationFailed), chained, like the enclosing state's Failed event, to the task's failure
        (recorded: TaskFailed 8, TaskStateAborted 9 <- 8, ParallelStateFailed 10 <- 8). A top-level Task, or
        a Fail state in a branch, records none."""
        if err.failed_task_event is None:
            return
        last = frame.last_event
        frame.last_event = err.failed_task_event
        self._event(frame, "TaskStateAborted", None)
        frame.last_event = last
        err.chain_event, err.failed_task_event = err.failed_task_event, None

    @staticmethod
    def _chain_failure(err: StatesError, frame: _Frame) -> None:
        """A Parallel or Map failed by a branch's Task: its Failed event follows the task's failure."""
        if err.chain_event is not None:
            frame.last_event, err.chain_event = err.chain_event, None

    def _run_branch(self, branch: dict[str, Any], data: Any, frame: _Frame) -> Any:
        try:
            return self._run_scope(branch, data, frame)
        except StatesError as err:
            self._abort_failed_task(err, frame)
            raise

    def _last_event_id(self) -> int:
        with self._lock:
            return len(self._events)

    def _check(self, frame: _Frame) -> None:
        if self._abort_requested.is_set():
            raise ExecutionAborted()
        if self._timed_out or (self._deadline is not None and self.clock.now() >= self._deadline):
            self._timed_out = True
            self._cancel.set()
            raise ExecutionTimedOut()
        # At 24,999 events only ExecutionSucceeded may still be written, and every _check precedes a
        # state's event: fail here so that ExecutionFailed is event 25,000, where the service writes it.
        if len(self._events) >= self._history_limit - 1:
            self._cancel.set()  # every other branch stops too
            raise ExecutionHistoryLimitExceeded()
        if frame.cancel.is_set():
            raise _BranchCancelled()

    def _sleep(self, seconds: float, frame: _Frame) -> None:
        if self._deadline is not None:
            seconds = min(seconds, max(0.0, (self._deadline - self.clock.now()).total_seconds()))
        self.clock.sleep(seconds, frame.cancel)
        self._check(frame)

    def _context(self, state: str, entered: datetime, retry_count: int | None, **extra: Any) -> dict[str, Any]:
        """The context object. ``retry_count`` None: a state that cannot retry (Pass, Choice, Wait, Succeed,
        Fail), whose ``State`` the service records without ``RetryCount``."""
        machine = self.state_machine
        state_node: dict[str, Any] = {"Name": state, "EnteredTime": iso(entered)}
        if retry_count is not None:
            state_node["RetryCount"] = retry_count
        context = {
            "Execution": {"Id": self.arn, "Input": self.input, "Name": self.name, "RoleArn": machine.role_arn,
                          "StartTime": iso(self.start_date), "RedriveCount": 0},
            "StateMachine": {"Id": machine.arn, "Name": machine.name},
            "State": state_node,
        }
        context.update(extra)
        return context

    def _run_scope(self, scope: dict[str, Any], data: Any, frame: _Frame) -> Any:
        name: str | None = scope["StartAt"]
        while name is not None:
            self._check(frame)
            data, name = self._run_state(name, scope["States"][name], data, frame)
        return data

    def _run_state(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame) -> _Step:
        kind = state["Type"]
        entered = self.clock.now()
        self._event(frame, f"{kind}StateEntered",
                    {"name": name, "input": _dumps(raw), "inputDetails": {"truncated": False}})
        outer = getattr(self._entered, "id", None)  # Parallel/Map run their states on this thread too
        self._entered.id = frame.last_event
        frame.assigned = None
        try:
            with reading(frame.variables):  # JSONPath's $name paths read the variables at state entry
                output, next_name = getattr(self, f"_state_{kind.lower()}")(name, state, raw, frame, entered)
            self._limit(output, name, "the state output")
            assigned, frame.assigned = frame.assigned, None
            if assigned is not None:
                frame.variables.commit(assigned, name)
        except StatesError as err:
            if kind == "Task" and err.failed_task_event is None:
                err.failed_task_event = frame.last_event
            raise
        except (ExecutionAborted, ExecutionTimedOut, _BranchCancelled):
            self._event(frame, f"{kind}StateAborted", None)
            raise
        finally:
            self._entered.id = outer
        details: dict[str, Any] = {"name": name, "output": _dumps(output), "outputDetails": {"truncated": False}}
        if assigned is not None:
            details["assignedVariables"] = {key: _dumps(value) for key, value in assigned.items()}
            details["assignedVariablesDetails"] = {"truncated": False}
        self._event(frame, f"{kind}StateExited", details)
        return output, next_name

    # ----- query languages and variables ------------------------------------------------------------
    def _language(self, state: dict[str, Any]) -> str:
        """The state's query language: its own QueryLanguage, else the state machine's (JSONPath by default)."""
        return str(state.get("QueryLanguage") or self.state_machine.definition.get("QueryLanguage") or JSONPATH)

    def _jsonata(self, name: str, frame: _Frame, context: dict[str, Any], state_input: Any,
                 **states: Any) -> jsonata_expr.Evaluator:
        """The evaluator of a JSONata state's fields: $states (input, context and ``states``: result or
        errorOutput) and the variables as they were when the state was entered."""
        entered = getattr(self._entered, "id", None)

        def failed(err: StatesError, location: str | None) -> None:
            # The service records where a JSONata state failed before the state's own failure events, its
            # previousEventId that of the state's Entered event (AWS-recorded histories).
            details = {"error": err.error, "cause": err.cause, "state": name}
            if location is not None:
                details["location"] = location
            if entered is not None:
                with self._lock:
                    frame.last_event = self._events[entered - 1]["previousEventId"]
            self._event(frame, "EvaluationFailed", details)

        return jsonata_expr.Evaluator({"input": state_input, "context": context, **states}, frame.variables.snapshot(),
                                      self._rng, self._runtime_prefix(name), failed)

    def _jsonpath_assign(self, assign: Any, name: str, value: Any, context: Any, field: str = "Assign") -> Any:
        """A JSONPath state's Assign: '.$' fields select from ``value`` (the state's result), ``$$`` or a variable."""
        return self._render(assign, value, context, name, field)

    # ----- input and output processing -------------------------------------------------------
    def _limit(self, value: Any, state: str, what: str, source: str | None = None) -> None:
        """Refuse ``value`` over the payload limit; the cause names ``source`` (what returned it), else the state."""
        size = _size(value)
        if size > PAYLOAD_LIMIT_BYTES:
            # AWS's words, word for word; the size (which the console does not give) goes to the log.
            log.warning("execution %s, state %s: %s is %d bytes, over the %d byte limit", self.arn, state, what,
                        size, PAYLOAD_LIMIT_BYTES)
            raise StatesError(DATA_LIMIT_EXCEEDED, f"The state/task '{source or state}' returned a result with a size "
                                                   "exceeding the maximum number of bytes service limit.")

    def _runtime_prefix(self, state: str) -> str:
        """How AWS starts the Cause of a States.Runtime error raised while a state runs."""
        return f"An error occurred while executing the state '{state}' (entered at the event id " \
               f"#{getattr(self._entered, 'id', None) or '?'})."

    def _null_input(self, state: str) -> StatesError:
        # AWS's words when a path is applied to a state input that is JSON null (a Lambda that returned
        # nothing, passed on whole): quoted from a console error in a public Q&A thread.
        return StatesError(RUNTIME, f"{self._runtime_prefix(state)} Unable to apply Path transformation to null or "
                                    "empty input.")

    def _select(self, path: str, data: Any, context: Any, state: str, field: str) -> Any:
        if data is None and path != "$" and not path.startswith("$$") and split_path(path) is None:
            raise self._null_input(state)
        try:
            return select(path, data, context)
        except PathError as exc:
            detail = no_results(path, context if path.startswith("$$") else data) if split_path(path) is None \
                else no_results(path)
            raise StatesError(RUNTIME, f"{self._runtime_prefix(state)} Invalid path '{path}' : "
                                       f"{detail or exc}") from exc

    def _input_path(self, state: dict[str, Any], name: str, raw: Any, context: Any) -> Any:
        path = state.get("InputPath", "$")
        return {} if path is None else self._select(path, raw, context, name, "InputPath")

    def _output_path(self, state: dict[str, Any], name: str, data: Any, context: Any) -> Any:
        path = state.get("OutputPath", "$")
        return {} if path is None else self._select(path, data, context, name, "OutputPath")

    def _result_path(self, path: str | None, name: str, raw: Any, result: Any) -> Any:
        if path is None:
            return raw
        steps = parse_reference_path(path)
        assert steps is not None  # validated: ResultPath is a reference path
        try:
            return set_reference(raw, steps, result, path)
        except PathError as exc:
            raise StatesError(RESULT_PATH_MATCH_FAILURE, f"state {name!r}: {exc}") from exc

    def _render(self, template: Any, data: Any, context: Any, state: str, field: str) -> Any:
        """Evaluate a payload template (Parameters, ResultSelector, ItemSelector)."""
        if isinstance(template, list):
            return [self._render(item, data, context, state, field) for item in template]
        if not isinstance(template, dict):
            return template
        rendered: dict[str, Any] = {}
        for key, value in template.items():
            if not key.endswith(".$"):
                rendered[key] = self._render(value, data, context, state, f"{field}.{key}")
            elif intrinsics.is_intrinsic(value):
                try:
                    rendered[key[:-2]] = intrinsics.evaluate(parse_intrinsic(value), data, context, self._rng)
                except intrinsics.IntrinsicError as exc:
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(state)} The intrinsic function of the field "
                                               f"'{field}.{key}' failed: {exc}") from exc
            else:
                if data is None and not value.startswith("$$") and split_path(value) is None:
                    raise self._null_input(state)
                try:
                    rendered[key[:-2]] = select(value, data, context)
                except PathError as exc:
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(state)} The JSONPath '{value}' specified for "
                                               f"the field '{key}' could not be found in the input "
                                               f"'{_dumps(context if value.startswith('$$') else data)}'") from exc
        return rendered

    def _finish_result(self, state: dict[str, Any], name: str, raw: Any, result: Any, context: Any,
                       frame: _Frame) -> Any:
        """A JSONPath state's result -> its output: ResultSelector, Assign (from the selected result),
        ResultPath, OutputPath."""
        if "ResultSelector" in state:
            result = self._render(state["ResultSelector"], result, context, name, "ResultSelector")
        if "Assign" in state:
            frame.assigned = self._jsonpath_assign(state["Assign"], name, result, context)
        output = self._result_path(state.get("ResultPath", "$"), name, raw, result)
        return self._output_path(state, name, output, context)

    def _jsonata_finish(self, state: dict[str, Any], name: str, raw: Any, result: Any, context: Any,
                        frame: _Frame) -> Any:
        """A JSONata state's result -> its output: Assign and Output see $states.result and the variables
        as they were at state entry (Assign first, then Output); without Output the result is the output."""
        evaluator = self._jsonata(name, frame, context, raw, result=result)
        if "Assign" in state:
            frame.assigned = evaluator.template(state["Assign"], "Assign")
        return evaluator.template(state["Output"], "Output") if "Output" in state else result

    def _positive_seconds(self, state: dict[str, Any], key: str, data: Any, context: Any, name: str,
                          evaluator: jsonata_expr.Evaluator | None = None) -> float | None:
        if key in state and evaluator is not None and jsonata_expr.is_expression(state[key]):
            value = evaluator.typed(state[key], key, "integer", lambda v: _is_int(v) and 0 < v <= MAX_WAIT_SECONDS)
            return float(value)
        if key in state:
            return float(state[key])
        if key + "Path" not in state:
            return None
        value = self._select(state[key + "Path"], data, context, name, key + "Path")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_WAIT_SECONDS:
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The {key}Path parameter does not reference a "
                                       f"positive integer up to {MAX_WAIT_SECONDS}: {state[key + 'Path']} == "
                                       f"{_brief(value)}")
        return float(value)

    def _seconds_path(self, path: str, data: Any, context: Any, name: str) -> float:
        """A Wait's SecondsPath value: a non-negative integer (the docs: "an integer value"; the 0-99999999
        bound is Seconds' alone, and a longer delay is refused only past MAX_WAIT_DELAY_SECONDS). The three
        causes are AWS-recorded (LocalStack's snapshots test_wait.py::test_base_wait_seconds_path and
        test_logs.py, recorded against AWS). A string ("60") is refused too: nothing recorded says otherwise."""
        if data is None and not path.startswith("$$") and split_path(path) is None:
            raise self._null_input(name)
        try:
            value = select(path, data, context)
        except PathError as exc:
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The SecondsPath parameter does not reference "
                                       f"an input value: {path}") from exc
        text = value if isinstance(value, str) else _dumps(value)
        number = value if _is_int(value) else None
        if number is None or not -2**63 <= number < 2**63:  # a Java long
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The SecondsPath parameter cannot be parsed as "
                                       f"a long value: {path} == {text}")
        if number < 0:
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The SecondsPath parameter references a "
                                       f"negative value: {path} == {text}")
        return float(number)

    # ----- error handling ----------------------------------------------------------------------
    def _retry_and_catch(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame,
                         attempt: Callable[[int], Any], entered: datetime) -> _Step:
        retriers: list[dict[str, Any]] = state.get("Retry", [])
        counts = [0] * len(retriers)
        retry_count = 0
        while True:
            try:
                return attempt(retry_count), state.get("Next")
            except StatesError as err:
                frame.assigned = None  # a failed attempt assigns nothing
                index = next((i for i, r in enumerate(retriers) if err.matched_by(r["ErrorEquals"])), None)
                if index is not None and counts[index] < retriers[index].get("MaxAttempts", 3):
                    err.failed_event = None  # AWS records <Type>StateFailed only for the attempt that ends the state
                    retrier = retriers[index]
                    try:
                        delay = retrier.get("IntervalSeconds", 1) * retrier.get("BackoffRate", 2.0) ** counts[index]
                    except OverflowError:  # BackoffRate 1e300 on a later attempt
                        delay = float("inf")
                    # No wait outlives the execution (one year at most), so no timedelta overflows.
                    delay = min(delay, retrier.get("MaxDelaySeconds", MAX_EXECUTION_SECONDS), MAX_EXECUTION_SECONDS)
                    if retrier.get("JitterStrategy") == "FULL":
                        delay = self._rng.uniform(0, delay)
                    counts[index] += 1
                    retry_count += 1
                    self._sleep(delay, frame)
                    continue
                if err.failed_event is not None:
                    self._event(frame, err.failed_event, None)
                    err.failed_event = None
                for position, catcher in enumerate(state.get("Catch", [])):
                    if err.matched_by(catcher["ErrorEquals"]):
                        error_output: dict[str, Any] = {"Error": err.error}
                        if err.cause or err.empty_cause_caught:
                            error_output["Cause"] = err.cause
                        if not err.error:  # SendTaskFailure without an error: the service's {"Error": null, ...}
                            error_output = {"Error": None, "Cause": err.cause or None}
                        return self._caught(name, state, catcher, position, raw, error_output, frame, entered,
                                            retry_count), catcher["Next"]
                raise

    def _caught(self, name: str, state: dict[str, Any], catcher: dict[str, Any], position: int, raw: Any,
                error_output: dict[str, Any], frame: _Frame, entered: datetime, retry_count: int) -> Any:
        """The output (and assignments) of a matching catcher: JSONata's Output/Assign see
        $states.errorOutput, JSONPath's Assign selects from the error output and ResultPath places it."""
        context = self._context(name, entered, retry_count)
        if self._language(state) == JSONATA:
            evaluator = self._jsonata(name, frame, context, raw, errorOutput=error_output)
            if "Assign" in catcher:
                frame.assigned = evaluator.template(catcher["Assign"], f"Catch[{position}]/Assign")
            if "Output" in catcher:
                return evaluator.template(catcher["Output"], f"Catch[{position}]/Output")
            return error_output
        if "Assign" in catcher:
            frame.assigned = self._jsonpath_assign(catcher["Assign"], name, error_output, context)
        return self._result_path(catcher.get("ResultPath", "$"), name, raw, error_output)

    # ----- states ------------------------------------------------------------------------------
    def _state_pass(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        context = self._context(name, entered, None)
        if self._language(state) == JSONATA:
            return self._jsonata_finish(state, name, raw, raw, context, frame), state.get("Next")
        data = self._input_path(state, name, raw, context)
        if "Parameters" in state:
            data = self._render(state["Parameters"], data, context, name, "Parameters")
        result = state.get("Result", data)
        if "Assign" in state:
            frame.assigned = self._jsonpath_assign(state["Assign"], name, result, context)
        output = self._result_path(state.get("ResultPath", "$"), name, raw, result)
        return self._output_path(state, name, output, context), state.get("Next")

    def _state_succeed(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        context = self._context(name, entered, None)
        if self._language(state) == JSONATA:
            return self._jsonata_finish(state, name, raw, raw, context, frame), None
        return self._output_path(state, name, self._input_path(state, name, raw, context), context), None

    def _state_fail(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        context = self._context(name, entered, None)
        if self._language(state) == JSONATA:
            evaluator = self._jsonata(name, frame, context, raw)
            texts = [evaluator.typed(state[key], key, "string", lambda v: isinstance(v, str))
                     if jsonata_expr.is_expression(state.get(key)) else state.get(key, "")
                     for key in ("Error", "Cause")]
            raise StatesError(texts[0], texts[1])
        texts = []
        for key in ("Error", "Cause"):
            value: Any = state.get(key, "")
            if key + "Path" in state:
                expression = state[key + "Path"]
                if intrinsics.is_intrinsic(expression):
                    try:
                        value = intrinsics.evaluate(parse_intrinsic(expression), raw, context, self._rng)
                    except intrinsics.IntrinsicError as exc:
                        raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The intrinsic function of the "
                                                   f"field '{key}Path' failed: {exc}") from exc
                else:
                    if raw is None and not expression.startswith("$$") and split_path(expression) is None:
                        raise self._null_input(name)
                    try:
                        value = select(expression, raw, context)
                    except PathError as exc:  # AWS-recorded (test_invalid_jsonpath[INVALID_JSONPATH_IN_ERRORPATH])
                        shown = context if expression.startswith("$$") else raw
                        raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The JSONPath '{expression}' "
                                                   f"specified for the field '{key}Path' could not be found in the "
                                                   f"input '{_dumps(shown)}'") from exc
                if not isinstance(value, str):
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The {key}Path field must select a "
                                               f"string: {expression} == {_brief(value)}")
            texts.append(value)
        raise StatesError(texts[0], texts[1])

    def _state_choice(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        context = self._context(name, entered, None)
        jsonata = self._language(state) == JSONATA
        evaluator = self._jsonata(name, frame, context, raw) if jsonata else None
        data = raw if jsonata else self._input_path(state, name, raw, context)
        matched: tuple[int, dict[str, Any]] | None = None
        try:
            for position, rule in enumerate(state["Choices"]):
                if evaluator is not None:
                    condition = rule["Condition"]
                    if jsonata_expr.is_expression(condition):
                        condition = evaluator.typed(condition, f"Choices[{position}]/Condition", "boolean",
                                                    lambda v: isinstance(v, bool))
                    hit = condition is True
                else:
                    hit = evaluate_rule(rule, data, context)
                if hit:
                    matched = (position, rule)
                    break
        except StatesError as err:  # a missing Variable: say which Choice state it is in, as AWS does
            if err.error != RUNTIME:
                raise
            raise StatesError(err.error, f"{self._runtime_prefix(name)} {err.cause}") from err
        if matched is None and "Default" not in state:
            raise StatesError(NO_CHOICE_MATCHED, f"no choice rule of state {name!r} matched its input "
                                                 f"{_brief(data)} and it has no Default")
        # A matched rule's own Assign/Output apply; the state's top-level ones go with its Default.
        source, field = (state, "") if matched is None else (matched[1], f"Choices[{matched[0]}]/")
        next_name = state["Default"] if matched is None else matched[1]["Next"]
        if evaluator is not None:
            if "Assign" in source:
                frame.assigned = evaluator.template(source["Assign"], f"{field}Assign")
            return (evaluator.template(source["Output"], f"{field}Output") if "Output" in source else raw), next_name
        if "Assign" in source:
            frame.assigned = self._jsonpath_assign(source["Assign"], name, data, context)
        return self._output_path(state, name, data, context), next_name

    def _state_wait(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        context = self._context(name, entered, None)
        evaluator = self._jsonata(name, frame, context, raw) if self._language(state) == JSONATA else None
        data = raw if evaluator is not None else self._input_path(state, name, raw, context)
        if evaluator is not None and jsonata_expr.is_expression(state.get("Seconds")):
            seconds = float(evaluator.typed(state["Seconds"], "Seconds", "integer",
                                            lambda v: _is_int(v) and 0 <= v <= MAX_WAIT_SECONDS))
        elif "Seconds" in state:
            seconds = float(state["Seconds"])
        elif "SecondsPath" in state:
            seconds = self._seconds_path(state["SecondsPath"], data, context, name)
        else:
            stamp = state.get("Timestamp")
            field, where = ("Timestamp", stamp) if stamp is not None else ("TimestampPath", state["TimestampPath"])
            if evaluator is not None and jsonata_expr.is_expression(stamp):
                stamp = evaluator.typed(stamp, "Timestamp", "string", lambda v: isinstance(v, str))
                until = _parse_timestamp(stamp)
                if until is None:  # AWS-recorded words (a JSONata Wait): a query error, not States.Runtime
                    raise evaluator.error("The Timestamp field cannot be parsed as an ISO-8601 extended offset "
                                          f"date-time format string: {stamp}", "Timestamp")
            else:
                if stamp is None:
                    stamp = self._select(state["TimestampPath"], data, context, name, "TimestampPath")
                until = _parse_timestamp(stamp)
                if until is None:
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The {field} parameter does not "
                                               f"reference a valid ISO-8601 extended offset date-time format string: "
                                               f"{where} == {stamp if isinstance(stamp, str) else _dumps(stamp)}")
            seconds = max(0.0, (until - self.clock.now()).total_seconds())
        if seconds > MAX_WAIT_DELAY_SECONDS:
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} Wait state delay is too long.")
        if evaluator is not None:
            # Assign and Output are evaluated when the wait is over, against the values at state entry.
            self._sleep(seconds, frame)
            if "Assign" in state:
                frame.assigned = evaluator.template(state["Assign"], "Assign")
            return (evaluator.template(state["Output"], "Output") if "Output" in state else raw), state.get("Next")
        if "Assign" in state:
            frame.assigned = self._jsonpath_assign(state["Assign"], name, data, context)
        self._sleep(seconds, frame)
        return self._output_path(state, name, data, context), state.get("Next")

    def _state_task(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        resource: str = state["Resource"]
        jsonata = self._language(state) == JSONATA

        def attempt(retry_count: int) -> Any:
            extra = {"Task": {"Token": new_token(self.arn, self._rng)}} if _is_callback(resource) else {}
            context = self._context(name, entered, retry_count, **extra)
            if jsonata:
                evaluator = self._jsonata(name, frame, context, raw)
                data = raw
                parameters = evaluator.template(state["Arguments"], "Arguments") if "Arguments" in state else raw
            else:
                evaluator = None
                data = self._input_path(state, name, raw, context)
                parameters = self._render(state["Parameters"], data, context, name, "Parameters") \
                    if "Parameters" in state else data
            self._limit(parameters, name, "the task input")
            timeout = self._positive_seconds(state, "TimeoutSeconds", data, context, name, evaluator)
            heartbeat = self._positive_seconds(state, "HeartbeatSeconds", data, context, name, evaluator)
            result = self._invoke(name, resource, parameters, context, frame, timeout, heartbeat, retry_count)
            if jsonata:
                return self._jsonata_finish(state, name, raw, result, context, frame)
            return self._finish_result(state, name, raw, result, context, frame)

        return self._retry_and_catch(name, state, raw, frame, attempt, entered)

    def _run_jobs(self, jobs: Sequence[Callable[[_Frame], Any]], frame: _Frame, max_concurrency: int,
                  thread_cap: int = _DEFAULT_MAP_CONCURRENCY) -> list[Any]:
        """Run branches or iterations: in threads on a real clock; on a virtual clock one after the
        other, each started at the virtual time a pool of ``max_concurrency`` workers (0: one per
        job) would start it, the clock ending at the latest finish."""
        group = Cancel(frame.cancel)
        if not jobs:
            return []
        workers = min(len(jobs), max_concurrency or len(jobs))
        if isinstance(self.clock, VirtualClock):
            # (when each simulated worker is free again, its number): a heap, so that 10,000 Distributed
            # Map workers cost log(n) per job; ties go to the lowest-numbered worker.
            lanes = [(self.clock.now(), lane) for lane in range(workers)]
            latest = self.clock.now()
            results = []
            try:
                for job in jobs:
                    free_at, lane = heapq.heappop(lanes)
                    self.clock.set(free_at)
                    try:
                        results.append(job(_Frame(frame.last_event, group, frame.variables.child())))
                    finally:
                        latest = max(latest, self.clock.now())
                        heapq.heappush(lanes, (self.clock.now(), lane))
            finally:
                self.clock.set(max(latest, *(t for t, _ in lanes)))
                frame.last_event = self._last_event_id()
            return results
        workers = min(workers, thread_cap)
        first_error: BaseException | None = None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"asl-{self.name}") as pool:
            futures = [pool.submit(job, _Frame(frame.last_event, group, frame.variables.child())) for job in jobs]
            for future in as_completed(futures):
                error = future.exception()
                if error is not None and first_error is None and not isinstance(error, _BranchCancelled):
                    first_error = error
                    group.set()
        frame.last_event = self._last_event_id()
        if first_error is not None:
            raise first_error
        return [future.result() for future in futures]

    def _state_parallel(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        jsonata = self._language(state) == JSONATA

        def attempt(retry_count: int) -> Any:
            context = self._context(name, entered, retry_count)
            if jsonata:
                data = raw
                if "Arguments" in state:
                    data = self._jsonata(name, frame, context, raw).template(state["Arguments"], "Arguments")
            else:
                data = self._input_path(state, name, raw, context)
                if "Parameters" in state:
                    data = self._render(state["Parameters"], data, context, name, "Parameters")
            self._event(frame, "ParallelStateStarted", None)
            jobs = [functools.partial(self._run_branch, branch, data) for branch in state["Branches"]]
            try:
                results = self._run_jobs(jobs, frame, 0)
            except StatesError as err:
                self._chain_failure(err, frame)
                err.failed_event = "ParallelStateFailed"
                raise
            self._event(frame, "ParallelStateSucceeded", None)
            if jsonata:
                return self._jsonata_finish(state, name, raw, results, context, frame)
            return self._finish_result(state, name, raw, results, context, frame)

        return self._retry_and_catch(name, state, raw, frame, attempt, entered)

    def _jsonata_items(self, state: dict[str, Any], name: str, raw: Any,
                       evaluator: jsonata_expr.Evaluator) -> list[Any]:
        """A JSONata Map's items: ``Items`` (an array, whose members may be expressions, or an expression
        that must yield an array), else the state input, which must then be an array."""
        if "Items" not in state:
            if not isinstance(raw, list):
                # AWS-recorded: States.QueryEvaluationError, EvaluationFailed without a location.
                raise evaluator.error(f"Map state input must be an array but was: {_dumps(raw)}", None)
            return raw
        items = state["Items"]
        if jsonata_expr.is_expression(items):
            value: list[Any] = evaluator.typed(items, "Items", "array", lambda v: isinstance(v, list))
            return value
        rendered: list[Any] = evaluator.template(items, "Items")
        return rendered

    def _state_map(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame, entered: datetime) -> _Step:
        processor = state.get("ItemProcessor") or state["Iterator"]
        if processor.get("ProcessorConfig", {}).get("Mode") == "DISTRIBUTED":
            return self._state_distributed_map(name, state, raw, frame, entered)
        selector = state.get("ItemSelector", state.get("Parameters"))
        jsonata = self._language(state) == JSONATA

        def attempt(retry_count: int) -> Any:
            context = self._context(name, entered, retry_count)
            evaluator = self._jsonata(name, frame, context, raw) if jsonata else None
            if evaluator is not None:
                data = raw
                try:
                    items = self._jsonata_items(state, name, raw, evaluator)
                    concurrency = state.get("MaxConcurrency", 0)
                    if jsonata_expr.is_expression(concurrency):
                        concurrency = evaluator.typed(concurrency, "MaxConcurrency", "integer",
                                                      lambda v: _is_int(v) and v >= 0)
                except StatesError as err:
                    err.failed_event = "MapStateFailed"  # as recorded: no MapStateStarted before it
                    raise
            else:
                data = self._input_path(state, name, raw, context)
                items = self._select(state.get("ItemsPath", "$"), data, context, name, "ItemsPath")
                if not isinstance(items, list):
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The ItemsPath field must select an "
                                               f"array: {state.get('ItemsPath', '$')} == {_brief(items)}")
                concurrency = state.get("MaxConcurrency", 0)
                if "MaxConcurrencyPath" in state:
                    concurrency = self._path_number(state, "MaxConcurrency", data, context, name, "integer")
                    if concurrency < 0:
                        raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} MaxConcurrency cannot be negative.")
            self._event(frame, "MapStateStarted", {"length": len(items)})

            def iteration(index: int, item: Any, child: _Frame) -> Any:
                item_input = item
                if selector is not None:
                    item_context = dict(context, Map={"Item": {"Index": index, "Value": item}})
                    if jsonata:
                        item_input = self._jsonata(name, frame, item_context, raw).template(selector, "ItemSelector")
                    else:
                        with reading(frame.variables):  # a worker thread: the Map state's variables
                            item_input = self._render(selector, data, item_context, name, "ItemSelector")
                self._event(child, "MapIterationStarted", {"name": name, "index": index})
                try:
                    output = self._run_scope(processor, item_input, child)
                except StatesError as err:
                    self._event(child, "MapIterationFailed", {"name": name, "index": index})
                    self._abort_failed_task(err, child)
                    raise
                except (ExecutionAborted, ExecutionTimedOut, _BranchCancelled):
                    self._event(child, "MapIterationAborted", {"name": name, "index": index})
                    raise
                self._event(child, "MapIterationSucceeded", {"name": name, "index": index})
                return output

            jobs = [functools.partial(iteration, i, item) for i, item in enumerate(items)]
            try:
                results = self._run_jobs(jobs, frame, concurrency)
            except StatesError as err:
                self._chain_failure(err, frame)
                err.failed_event = "MapStateFailed"
                raise
            self._event(frame, "MapStateSucceeded", None)
            if jsonata:
                return self._jsonata_finish(state, name, raw, results, context, frame)
            return self._finish_result(state, name, raw, results, context, frame)

        return self._retry_and_catch(name, state, raw, frame, attempt, entered)

    # ----- Distributed Map ---------------------------------------------------------------------------
    def _path_number(self, state: dict[str, Any], key: str, data: Any, context: Any, name: str,
                     kind: str) -> Any:
        """A ``<key>Path`` value as the service reads it (the Runtime error's words are AWS's)."""
        path = state[key + "Path"]
        value = self._select(path, data, context, name, key + "Path")
        if isinstance(value, str) and (_INTEGER_TEXT if kind == "integer" else _FLOAT_TEXT).fullmatch(value.strip()):
            return int(value) if kind == "integer" else float(value)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            kind == "float" or float(value).is_integer())
        if not ok:
            shown = value if isinstance(value, str) else _dumps(value)
            raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The {key}Path field refers to value "
                                       f"\"{shown}\" which is not a valid {kind}: {path}")
        return int(value) if kind == "integer" else float(value)

    def _state_distributed_map(self, name: str, state: dict[str, Any], raw: Any, frame: _Frame,
                               entered: datetime) -> _Step:
        processor = state.get("ItemProcessor") or state["Iterator"]
        express = processor["ProcessorConfig"].get("ExecutionType") == "EXPRESS"
        label = state.get("Label", name)
        parent = self.state_machine
        # The children run the processor's states in the machine's language (a state's own QueryLanguage
        # does not reach into its ItemProcessor).
        inherited = {"QueryLanguage": parent.definition["QueryLanguage"]} if "QueryLanguage" in parent.definition \
            else {}
        child_machine = StateMachine({**inherited, **{k: v for k, v in processor.items() if k != "ProcessorConfig"}},
                                     name=f"{parent.name}/{label}", region=parent.region,
                                     account_id=parent.account_id, role_arn=parent.role_arn, source=parent.source)
        selector = state.get("ItemSelector", state.get("Parameters"))
        reader: dict[str, Any] | None = state.get("ItemReader")
        batcher: dict[str, Any] | None = state.get("ItemBatcher")
        writer: dict[str, Any] | None = state.get("ResultWriter")
        jsonata = self._language(state) == JSONATA

        def attempt(retry_count: int) -> Any:
            context = self._context(name, entered, retry_count)
            evaluator = self._jsonata(name, frame, context, raw) if jsonata else None
            data = raw if jsonata else self._input_path(state, name, raw, context)

            def number(holder: dict[str, Any], key: str, kind: str) -> Any:
                """A numeric field: a literal, a JSONata expression or (JSONPath) its ``…Path``."""
                if evaluator is not None and jsonata_expr.is_expression(holder.get(key)):
                    check = _is_int if kind == "integer" else _is_number
                    return evaluator.typed(holder[key], key, kind, check)
                if key + "Path" in holder:
                    return self._path_number(holder, key, data, context, name, kind)
                return holder.get(key)

            def template(value: Any, at: dict[str, Any], field: str) -> Any:
                if jsonata:
                    return self._jsonata(name, frame, at, raw).template(value, field.replace(".", "/"))
                return self._render(value, data, at, name, field)

            items: list[Any] | None = None
            if reader is None and evaluator is not None:
                try:
                    items = self._jsonata_items(state, name, raw, evaluator)
                except StatesError as err:
                    err.failed_event = "MapStateFailed"
                    raise
            elif reader is None:
                selected = self._select(state.get("ItemsPath", "$"), data, context, name, "ItemsPath")
                if not isinstance(selected, list):
                    raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} The ItemsPath field must select an "
                                               f"array: {state.get('ItemsPath', '$')} == {_brief(selected)}")
                items = selected
            self._event(frame, "MapStateStarted", {"length": len(items) if items is not None else 0})
            concurrency = number(state, "MaxConcurrency", "integer") or 0
            if concurrency < 0:
                raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} MaxConcurrency cannot be negative.")
            count = number(state, "ToleratedFailureCount", "integer")
            if count is not None and count < 0:
                raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} ToleratedFailureCount cannot be negative.")
            percentage = number(state, "ToleratedFailurePercentage", "float")
            if percentage is not None and not 0 <= percentage <= 100:
                raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} ToleratedFailurePercentage must be "
                                           "between 0 and 100.")
            reader_config = (reader or {}).get("ReaderConfig", {})
            max_items = number(reader_config, "MaxItems", "integer")
            if max_items is None:
                max_items = distributed.MAX_ITEMS
            batch_items = batch_bytes = None
            batch_input: Any = None
            if batcher is not None:
                for key in ("MaxItemsPerBatch", "MaxInputBytesPerBatch"):
                    value = number(batcher, key, "integer")
                    if value is not None and value <= 0:
                        raise StatesError(RUNTIME, f"{self._runtime_prefix(name)} {key} must be positive.")
                    if key == "MaxItemsPerBatch":
                        batch_items = value
                    else:
                        batch_bytes = value
                if "BatchInput" in batcher:
                    batch_input = template(batcher["BatchInput"], context, "ItemBatcher.BatchInput")
            map_run_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            map_run_arn = f"arn:aws:states:{parent.region}:{parent.account_id}:mapRun:{parent.name}/{label}:" \
                          f"{map_run_id}"
            self._event(frame, "MapRunStarted", {"mapRunArn": map_run_arn})
            try:
                output = self._map_run(name, state, template, context, frame, items, reader, max_items, selector,
                                       batch_items, batch_bytes, batch_input, batcher is not None, concurrency,
                                       count, percentage, child_machine, express, map_run_arn, writer)
            except StatesError as err:
                self._event(frame, "MapRunFailed", _error_details(err.error, err.cause))
                err.failed_event = "MapStateFailed"
                raise
            except (ExecutionAborted, ExecutionTimedOut, _BranchCancelled):
                self._event(frame, "MapRunAborted", None)  # the parent ended: its Map Run is aborted
                raise
            self._event(frame, "MapRunSucceeded", None)
            run_done = frame.last_event
            self._event(frame, "MapStateSucceeded", None)
            frame.last_event = run_done  # MapStateExited follows MapRunSucceeded in the service's history
            if jsonata:
                return self._jsonata_finish(state, name, raw, output, context, frame)
            return self._finish_result(state, name, raw, output, context, frame)

        return self._retry_and_catch(name, state, raw, frame, attempt, entered)

    def _map_run(self, name: str, state: dict[str, Any], template: Callable[[Any, dict[str, Any], str], Any],
                 context: dict[str, Any], frame: _Frame,
                 items: list[Any] | None, reader: dict[str, Any] | None, max_items: int, selector: Any,
                 batch_items: int | None, batch_bytes: int | None, batch_input: Any, batching: bool,
                 concurrency: int, count: int | None, percentage: float | None, child_machine: StateMachine,
                 express: bool, map_run_arn: str, writer: dict[str, Any] | None) -> Any:
        """One Map Run: read, select, batch, run each child execution, judge the failures, write results.
        ``template`` renders a payload template in the state's language (Parameters or Arguments)."""
        arguments = "Arguments" if self._language(state) == JSONATA else "Parameters"
        if max_items < 0:
            raise StatesError(distributed.ITEM_READER_FAILED, "field MaxItems must be positive")
        limit = min(max_items or distributed.MAX_ITEMS, distributed.MAX_ITEMS)
        if reader is not None:
            parameters = template(reader.get(arguments, {}), context, f"ItemReader.{arguments}")
            items = distributed.read_items(reader["Resource"], parameters, reader.get("ReaderConfig", {}), limit,
                                           self.state_machine.region)
        assert items is not None
        if reader is None:
            items = items[:limit] if max_items else items
        if selector is not None:
            items = [template(selector, dict(context, Map={"Item": {"Index": i, "Value": item}}), "ItemSelector")
                     for i, item in enumerate(items)]

        def batch_payload(batch: list[Any]) -> Any:
            payload: dict[str, Any] = {"BatchInput": batch_input} if batch_input is not None else {}
            payload["Items"] = batch
            return payload

        if batching:
            groups = distributed.batches(items, batch_items, batch_bytes, lambda b: _size(batch_payload(b)))
            inputs = [(len(batch), batch_payload(batch)) for _, batch in groups]
        else:
            inputs = [(1, item) for item in items]
        total = len(items)
        names = [str(uuid.UUID(int=self._rng.getrandbits(128), version=4)) for _ in inputs]
        run_cancel = Cancel(frame.cancel)
        lock = threading.Lock()
        failed = [0]
        exceeded = threading.Event()

        def over() -> bool:
            if count is None and percentage is None:
                return failed[0] > 0
            if count is not None and failed[0] > count:
                return True
            return percentage is not None and total > 0 and failed[0] * 100.0 / total > percentage

        def child(index: int, job: _Frame) -> Execution | None:
            if exceeded.is_set() or run_cancel.is_set():
                return None  # never started: the Map Run already failed
            weight, child_input = inputs[index]
            execution = Execution(child_machine, child_input, name=names[index], registry=self._registry,
                                  mock=self._mock, clock=self.clock, on_event=None, rng=self._rng,
                                  callbacks=self.callbacks)
            execution._invocations = self._invocations
            execution._invocation_lock = self._invocation_lock
            execution._cancel = Cancel(job.cancel)
            execution._cancel_means_abort = True
            limit_seconds = distributed.EXPRESS_CHILD_SECONDS if express else MAX_EXECUTION_SECONDS
            execution._deadline = min(self._deadline, execution.start_date + timedelta(seconds=limit_seconds))
            if express:
                execution._history_limit = 2**62
                execution._timeout_cause_text = ("the Express child execution ran longer than "
                                                 f"{distributed.EXPRESS_CHILD_SECONDS} seconds, the maximum "
                                                 "duration of an Express workflow execution")
            try:
                self._limit(child_input, name, "the child execution input")
            except StatesError as err:
                execution._finish("FAILED", error=err.error, cause=err.cause)
            else:
                execution._execute()
            if execution.status != "SUCCEEDED" and not run_cancel.is_set():
                with lock:
                    failed[0] += weight
                    if over():
                        exceeded.set()
                        run_cancel.set()  # the children still running are stopped
            return execution

        workers = concurrency or 10_000  # the service's own ceiling of a Map Run's concurrency
        results = self._run_jobs([functools.partial(child, i) for i in range(len(inputs))],
                                 _Frame(frame.last_event, run_cancel, frame.variables), workers, thread_cap=16)
        self._check(frame)  # an abort or a timeout of the parent ends it here, not as a failed Map Run
        children = [c for c in results if c is not None]
        self.map_runs[map_run_arn] = self._describe_map_run(map_run_arn, children, results, inputs, concurrency,
                                                            count, percentage, writer is not None, exceeded.is_set())
        # Express children too: the service has no GetExecutionHistory for them, but offline their
        # histories are what path tests inspect (a child Task's rendered Parameters, its retries).
        self.map_runs[map_run_arn]["executions"] = children
        exporting = writer is not None and "Resource" in writer
        config = (writer or {}).get("WriterConfig", {})
        # ResultWriter (Map): NONE (metadata records) is the default when exporting to S3, COMPACT (the
        # children's outputs) when there is no ResultWriter; a failed child's entry is always its record.
        transformation = config.get("Transformation", "NONE" if exporting else "COMPACT")

        def entries(executions: list[Execution]) -> list[Any]:
            out: list[Any] = []
            for execution in executions:
                if transformation == "NONE" or execution.status != "SUCCEEDED":
                    out.append(self._child_record(execution, express))
                elif transformation == "FLATTEN" and isinstance(execution.output, list):
                    out.extend(execution.output)
                else:
                    out.append(execution.output)
            return out

        if exporting:
            assert writer is not None
            by_status: dict[str, list[Execution]] = {"SUCCEEDED": [], "FAILED": [], "PENDING": []}
            for execution in children:
                # Children the Map Run stopped before they ended are PENDING (they could be redriven).
                status = {"SUCCEEDED": "SUCCEEDED", "ABORTED": "PENDING"}.get(execution.status, "FAILED")
                by_status[status].append(execution)
            parameters = template(writer.get(arguments, {}), context, f"ResultWriter.{arguments}")
            details = distributed.write_results(self.state_machine.region, parameters.get("Bucket"),
                                                parameters.get("Prefix"), map_run_arn,
                                                {status: entries(group) for status, group in by_status.items()},
                                                config.get("OutputType", "JSON"))
        if exceeded.is_set():
            raise StatesError(distributed.EXCEED_TOLERATED_FAILURE_THRESHOLD,
                              distributed.EXCEED_TOLERATED_FAILURE_CAUSE)
        if exporting:
            return {"MapRunArn": map_run_arn, "ResultWriterDetails": details}
        return entries(children)

    def _describe_map_run(self, arn: str, children: list[Execution], results: list[Execution | None],
                          inputs: list[tuple[int, Any]], concurrency: int, count: int | None,
                          percentage: float | None, written: bool, failed: bool) -> dict[str, Any]:
        """DescribeMapRun's shape: the Map Run's status and its children/items counted by status."""
        keys = {"SUCCEEDED": "succeeded", "FAILED": "failed", "TIMED_OUT": "timedOut", "ABORTED": "aborted"}
        executions = dict.fromkeys(("aborted", "failed", "pending", "resultsWritten", "running", "succeeded",
                                    "timedOut", "total"), 0)
        items = dict(executions)
        for (weight, _), child in zip(inputs, results, strict=True):
            key = keys.get(child.status, "failed") if child is not None else "pending"
            for counts, amount in ((executions, 1), (items, weight)):
                counts[key] += amount
                counts["total"] += amount
                if written and child is not None:
                    counts["resultsWritten"] += amount
        return {"mapRunArn": arn, "executionArn": self.arn, "status": "FAILED" if failed else "SUCCEEDED",
                "startDate": min((c.start_date for c in children), default=self.clock.now()),
                "stopDate": self.clock.now(), "maxConcurrency": concurrency,
                "toleratedFailureCount": count or 0, "toleratedFailurePercentage": float(percentage or 0),
                "itemCounts": items, "executionCounts": executions}

    @staticmethod
    def _child_record(execution: Execution, express: bool) -> dict[str, Any]:
        """One entry of a ResultWriter file: DescribeExecution's fields as the service writes them."""
        record: dict[str, Any] = {"ExecutionArn": execution.arn, "Input": _dumps(execution.input),
                                  "InputDetails": {"Included": True}, "Name": execution.name}
        if execution.status == "SUCCEEDED":
            record["Output"] = _dumps(execution.output)
            record["OutputDetails"] = {"Included": True}
        else:
            if execution.error:
                record["Error"] = execution.error
            if execution.cause:
                record["Cause"] = execution.cause
        record["RedriveCount"] = 0
        if express or execution.status == "SUCCEEDED":
            record["RedriveStatus"] = "NOT_REDRIVABLE"
            record["RedriveStatusReason"] = ("Execution is of type EXPRESS and cannot be redriven" if express and
                                             execution.status != "SUCCEEDED" else
                                             f"Execution is {execution.status} and cannot be redriven")
        else:
            record["RedriveStatus"] = "REDRIVABLE"
        record["StartDate"] = iso(execution.start_date)
        record["StateMachineArn"] = execution.state_machine.arn
        record["Status"] = execution.status
        record["StopDate"] = iso(execution.stop_date or execution.clock.now())
        return record

    # ----- task invocation ----------------------------------------------------------------------
    def _invoke(self, name: str, resource: str, parameters: Any, context: dict[str, Any], frame: _Frame,
                timeout: float | None, heartbeat: float | None, retry_count: int) -> Any:
        with self._invocation_lock:
            invocation = self._invocations.get(name, 0)
            self._invocations[name] = invocation + 1
        prefix, service_details = self._task_event_shape(resource)
        if prefix == "LambdaFunction":
            scheduled: dict[str, Any] = {"resource": resource, "input": _dumps(parameters),
                                         "inputDetails": {"truncated": False}}
            if timeout is not None:
                scheduled["timeoutInSeconds"] = int(timeout)
            self._event(frame, "LambdaFunctionScheduled", scheduled)
            self._event(frame, "LambdaFunctionStarted", None)
        else:
            scheduled = dict(service_details, region=self.state_machine.region, parameters=_dumps(parameters))
            if timeout is not None:
                scheduled["timeoutInSeconds"] = int(timeout)
            if heartbeat is not None:
                scheduled["heartbeatInSeconds"] = int(heartbeat)
            self._event(frame, "TaskScheduled", scheduled)
            self._event(frame, "TaskStarted", dict(service_details))
        try:
            result = self._task_result(name, resource, parameters, context, frame, timeout, heartbeat,
                                       retry_count, invocation, service_details)
        except StatesError as err:
            timed_out = err.error in (TIMEOUT, HEARTBEAT_TIMEOUT)
            suffix = "TimedOut" if timed_out else "Failed"
            err.empty_cause_caught = timed_out and not err.cause
            self._event(frame, f"{prefix}{suffix}", dict(service_details, **_error_details(err.error, err.cause)))
            raise
        self._event(frame, f"{prefix}Succeeded", dict(service_details, output=_dumps(result),
                                                      outputDetails={"truncated": False}))
        return result

    @staticmethod
    def _task_event_shape(resource: str) -> tuple[str, dict[str, str]]:
        if _LAMBDA_FUNCTION_ARN.match(resource):
            return "LambdaFunction", {}
        arn = parse_service_arn(resource)
        if arn is not None:
            return "Task", {"resourceType": arn.resource_type, "resource": arn.resource}
        parts = resource.split(":")
        return "Task", {"resourceType": parts[2] if len(parts) > 2 else "unknown", "resource": resource}

    def _task_result(self, name: str, resource: str, parameters: Any, context: dict[str, Any], frame: _Frame,
                     timeout: float | None, heartbeat: float | None, retry_count: int, invocation: int,
                     service_details: dict[str, str]) -> Any:
        mocked = self._mock.responses.get(name) if self._mock else None
        if mocked is not None:
            outcome = mocked.outcome(invocation)
            if outcome is None:
                raise StatesError(RUNTIME, f"mocked response {mocked.name!r} of state {name!r} has no entry for "
                                           f"invocation {invocation} (it has: {mocked.describe_keys()})")
            if outcome.error is not None:
                raise StatesError(outcome.error, outcome.cause)
            result = _json_copy(outcome.returned, f"the mocked response {mocked.name!r}")
        else:
            executor = self._registry.resolve(resource)
            if executor is None:
                case = f"not mocked in test case {self._mock.name!r}" if self._mock else "not mocked"
                raise StatesError(RUNTIME, f"Task state {name!r} is {case} and has no executor for {resource!r}")
            result = self._call_executor(executor, name, resource, parameters, context, frame, timeout, heartbeat,
                                         retry_count, service_details)
        try:
            # The cause names what returned the result: the integration ('lambda') or the resource ARN.
            self._limit(result, name, "the task result", service_details.get("resourceType", resource)
                        if parse_service_arn(resource) is not None else resource)
        except StatesError as err:
            err.task_result_too_large = True
            raise
        return result

    def _call_executor(self, executor: TaskExecutor, name: str, resource: str, parameters: Any,
                       context: dict[str, Any], frame: _Frame, timeout: float | None, heartbeat: float | None,
                       retry_count: int, service_details: dict[str, str]) -> Any:
        def submitted(output: Any) -> None:
            # Called on the worker thread: a .sync create whose answer arrives after the state gave up on
            # it (StopExecution while the create was in flight) must not add to the history.
            self._event(frame, "TaskSubmitted", dict(service_details, output=_dumps(output),
                                                     outputDetails={"truncated": False}), abandoned=task.cancel)

        task = TaskContext(state_name=name, resource=resource, execution_arn=self.arn, execution_name=self.name,
                           state_machine_name=self.state_machine.name, retry_count=retry_count,
                           context_object=context, clock=self.clock, cancel=Cancel(frame.cancel),
                           timeout_seconds=timeout, heartbeat_seconds=heartbeat, on_submitted=submitted,
                           execution_deadline=self._deadline)
        box: dict[str, Any] = {}
        own_parameters = json.loads(_dumps(parameters))  # the executor may mutate its copy freely
        token = task.task_token if _is_callback(resource) else None

        def work() -> None:
            try:
                result = executor(resource, own_parameters, task)
                if token is not None:  # the call went out: its answer is TaskSubmitted, the token's is the result
                    submitted(_json_copy(result, f"the result of the executor for {resource!r}"))
                    result = self.callbacks.wait(token, task)
                box["result"] = result
            except BaseException as exc:  # reported to the execution, whatever it is
                box["error"] = exc

        def deadline_error(error: str) -> StatesError:
            return self._deadline_error(name, error, timeout, heartbeat, callback=token is not None)

        # A worker thread lets the execution enforce timeouts and aborts on executors that block.
        worker = threading.Thread(target=work, name=f"asl-task-{name}", daemon=True)
        if token is not None:
            self.callbacks.open(token, task)  # before the call: the service may call back before it answers
        try:
            worker.start()
            while worker.is_alive():
                worker.join(0.05)
                if not worker.is_alive():
                    break
                if frame.cancel.is_set() or self._deadline is not None:
                    try:
                        self._check(frame)
                    except BaseException:
                        task.cancel.set()
                        raise
                limit = task.deadline()
                # settle(): a callback that completed the task a moment before its deadline keeps it.
                if not self.clock.virtual and limit is not None and self.clock.now() >= limit[0] and task.settle():
                    task.cancel.set()
                    raise deadline_error(limit[1])
            self._check(frame)
        finally:
            if worker.is_alive():
                task.cancel.set()  # the state is done with it, however it ended: a waiting callback stops too
            if token is not None:
                self.callbacks.close(token)
        error = box.get("error")
        if isinstance(error, TaskDeadline):
            raise deadline_error(error.error)
        if isinstance(error, TaskFailed | StatesError):
            raise StatesError(error.error, error.cause)
        if error is not None:
            log.warning("executor for %s (state %s) raised %r", resource, name, error, exc_info=error)
            raise StatesError(type(error).__name__, str(error))
        limit = task.deadline()
        if limit is not None and self.clock.now() > limit[0] and task.settle():
            raise deadline_error(limit[1])
        return _json_copy(box.get("result"), f"the result of the executor for {resource!r}")

    def _deadline_error(self, name: str, error: str, timeout: float | None, heartbeat: float | None, *,
                        callback: bool) -> StatesError:
        """The error of a task past its TimeoutSeconds or HeartbeatSeconds."""
        if callback:
            # The service records a callback task's timeout, of either kind, as TaskTimedOut with the error
            # States.Timeout and no cause (LocalStack's snapshots recorded from AWS: callback/
            # test_sqs_wait_for_task_token_timeout, timeouts/test_heartbeats); a Retry or Catch that names
            # States.HeartbeatTimeout still matches a heartbeat timeout.
            return StatesError(TIMEOUT, "", also=(HEARTBEAT_TIMEOUT,) if error == HEARTBEAT_TIMEOUT else ())
        if error == HEARTBEAT_TIMEOUT:
            return StatesError(error, f"state {name!r} sent no heartbeat for {heartbeat:g} seconds (HeartbeatSeconds)")
        # Past TimeoutSeconds: TaskTimedOut (or LambdaFunctionTimedOut) without a cause, as AWS records it
        # (test_timeouts::test_fixed_timeout_service_lambda, test_fixed_timeout_lambda).
        return StatesError(TIMEOUT, "")
