"""The callback pattern: task tokens of ``.waitForTaskToken`` tasks, and what completes them.

A Task whose ``Resource`` ends ``.waitForTaskToken`` gets a token in its context object
(``$$.Task.Token``); the interpreter opens it here, lets the executor make the service call (its answer
is the ``TaskSubmitted`` event), then waits on the token until one of these arrives:

- ``succeed(token, output)`` (SendTaskSuccess): ``output`` is the task's result;
- ``fail(token, error, cause)`` (SendTaskFailure): the task fails with that error and cause, and
  Retry/Catch route on it;
- the task's ``TimeoutSeconds``, or its ``HeartbeatSeconds`` without a ``heartbeat(token)``
  (SendTaskHeartbeat) in between: the task times out (``TaskDeadline``);
- the execution's end (StopExecution, its own timeout, a failed Parallel branch): the wait stops at once.

A token is single-use. Whichever comes first of a completion and a timeout settles the task
(``TaskContext.settle``), so exactly one of two racing SendTaskSuccess calls wins and a callback that
loses to a timeout is refused. A token whose task no longer waits (completed, timed out, its execution
ended) is refused with ``TaskTimedOut``, one that never named a task here with ``InvalidToken``: the
errors and words the service answers (see ``TokenRefused``).

Waiting works on both clocks: on a real clock the deadlines are wall-clock moments; on a
``VirtualClock`` nothing advances time while a task waits for a person, so the wait holds (in real
time) until a completion arrives or someone moves the clock past a deadline (``VirtualClock.advance``).

Tokens live in memory only: a registry survives nothing, and the offline runtime, whose RUNNING
executions are aborted when it restarts, starts each time with an empty one.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from d2ops.asl.errors import INVALID_TOKEN, TASK_TIMED_OUT, TaskFailed, TokenRefused
from d2ops.asl.executors import TaskContext, TaskDeadline

# The service's words: an unknown token (recorded from AWS by LocalStack's aws-sdk:sfn SendTaskSuccess
# test with "NoSuchTaskToken", tests/aws/services/stepfunctions/v2/services/test_aws_sdk_task_service),
# and a token whose task is closed (AWS's answer to a reused token, quoted in
# aws-samples/amazon-mwaa-examples#61: "Task Timed Out: 'Provided task does not exist anymore'").
INVALID_TOKEN_MESSAGE = "Invalid Token: 'Invalid token'"
TASK_CLOSED_MESSAGE = "Task Timed Out: 'Provided task does not exist anymore'"

_REAL_POLL_SECONDS = 0.05  # how often a waiting task looks at the clock and its stop signal
_VIRTUAL_POLL_SECONDS = 0.01


def new_token(execution_arn: str, rng: random.Random) -> str:
    """A fresh token of a task in ``execution_arn``: opaque to callers (URL-safe base64, as the service's
    are base64), 128 random bits from ``rng``, and the execution it belongs to, so that a token of an
    execution that has ended can be told from one that never existed (``token_execution``)."""
    body = json.dumps({"execution": execution_arn, "nonce": f"{rng.getrandbits(128):032x}"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def token_execution(token: str) -> str | None:
    """The execution ARN a token made by ``new_token`` names; None for anything else."""
    if not isinstance(token, str) or not 0 < len(token) <= 4096:
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or set(body) != {"execution", "nonce"} or not isinstance(body["execution"], str):
        return None
    canonical = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")
    return body["execution"] if canonical == token else None


@dataclass(frozen=True)
class _Outcome:
    output: Any = None
    error: str | None = None  # None: SendTaskSuccess; else SendTaskFailure's error ("" when it gave none)
    cause: str = ""


@dataclass
class _Waiting:
    task: TaskContext
    wake: threading.Event = field(default_factory=threading.Event)
    outcome: _Outcome | None = None


class TaskTokens:
    """The open tokens of the executions that share this registry (one per offline runtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}
        self._executions: set[str] = set()  # every execution that opened a token here (small: one ARN each)

    # ----- the interpreter's side ------------------------------------------------------------
    def open(self, token: str, task: TaskContext) -> None:
        """Register ``task``'s token before its service call (a Lambda may call back before it returns); it stays
        here until ``close``, refused once settled."""
        with self._lock:
            if token in self._waiting:
                raise ValueError("this task token is already open")
            self._waiting[token] = _Waiting(task)
            self._executions.add(task.execution_arn)

    def close(self, token: str) -> None:
        """The task is over, whatever ended it: the token is refused from now on."""
        with self._lock:
            self._waiting.pop(token, None)

    def waiting(self) -> list[str]:
        """The tokens whose tasks are waiting now (oldest first)."""
        with self._lock:
            return [token for token, entry in self._waiting.items() if entry.outcome is None]

    def wait(self, token: str, task: TaskContext) -> Any:
        """Block until the token is completed (its output, or ``TaskFailed``), the task times out
        (``TaskDeadline``) or it is abandoned (None: the interpreter has already recorded why)."""
        with self._lock:
            entry = self._waiting.get(token)
        if entry is None or entry.task is not task:
            raise RuntimeError("wait() on a token that was not opened for this task")
        poll = _VIRTUAL_POLL_SECONDS if task.clock.virtual else _REAL_POLL_SECONDS
        while True:
            with self._lock:
                if entry.outcome is not None:
                    break
                if task.cancelled:  # StopExecution, the execution's timeout, a failed sibling branch
                    task.settle()
                    self._waiting.pop(token, None)
                    return None
                limit = task.deadline()
                if limit is not None and task.clock.now() >= limit[0]:
                    self._waiting.pop(token, None)
                    if task.settle():
                        raise TaskDeadline(limit[1])
                    return None  # the interpreter's own deadline check settled it first and records it
            pause = poll
            if limit is not None and not task.clock.virtual:
                pause = min(poll, max(0.001, (limit[0] - task.clock.now()).total_seconds()))
            entry.wake.wait(pause)
        outcome = entry.outcome
        if outcome.error is None:
            return outcome.output
        raise TaskFailed(outcome.error, outcome.cause)

    # ----- the callers' side (SendTaskSuccess / SendTaskFailure / SendTaskHeartbeat) -----------
    def succeed(self, token: str, output: Any) -> None:
        """SendTaskSuccess: ``output`` (parsed JSON) becomes the task's result. Raises ``TokenRefused``."""
        self._complete(token, _Outcome(output=output))

    def fail(self, token: str, error: str = "", cause: str = "") -> None:
        """SendTaskFailure: the task fails with ``error`` and ``cause``. Raises ``TokenRefused``."""
        self._complete(token, _Outcome(error=error or "", cause=cause or ""))

    def heartbeat(self, token: str) -> None:
        """SendTaskHeartbeat: restart the task's HeartbeatSeconds window. Raises ``TokenRefused``."""
        with self._lock:
            self._usable(token).task.heartbeat()

    def _complete(self, token: str, outcome: _Outcome) -> None:
        with self._lock:
            entry = self._usable(token)
            if not entry.task.settle():  # a timeout claimed it a moment ago
                raise TokenRefused(TASK_TIMED_OUT, TASK_CLOSED_MESSAGE)
            entry.outcome = outcome  # single use: the next call with it finds the task settled
            entry.wake.set()

    def _usable(self, token: str) -> _Waiting:
        """The waiting entry of ``token`` (under the lock), or the refusal the service answers."""
        entry = self._waiting.get(token)
        if entry is None:
            execution = token_execution(token)
            if execution is not None and execution in self._executions:
                raise TokenRefused(TASK_TIMED_OUT, TASK_CLOSED_MESSAGE)
            raise TokenRefused(INVALID_TOKEN, INVALID_TOKEN_MESSAGE, execution_arn=execution)
        task = entry.task
        limit = task.deadline()
        # Past its deadline the task has timed out, even if the waiter has not looked at the clock yet.
        if entry.outcome is not None or task.cancelled or (limit is not None and task.clock.now() >= limit[0]):
            raise TokenRefused(TASK_TIMED_OUT, TASK_CLOSED_MESSAGE)
        return entry
