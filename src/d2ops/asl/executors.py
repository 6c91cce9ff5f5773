"""Pluggable task executors: what runs a Task state's ``Resource`` when it is not mocked.

An executor is any callable ``(resource, parameters, context) -> result``; it raises
``TaskFailed(error, cause)`` for a task error (Retry and Catch route on ``error``). Executors are
looked up by resource ARN in an ``ExecutorRegistry``: an exact ARN first, then glob patterns
(``fnmatch``) in registration order. The partition is ignored on both sides, so
``arn:aws:states:::lambda:invoke`` also serves ``arn:aws-cn:states:::lambda:invoke``.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from d2ops.asl.clock import Cancel, Clock
from d2ops.asl.errors import HEARTBEAT_TIMEOUT, TIMEOUT

_PARTITION = re.compile(r"^arn:[^:]*:")


class TaskExecutor(Protocol):
    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any: ...


class TaskDeadline(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class TaskContext:
    """What an executor knows about the invocation, plus cooperative sleep/heartbeat/cancel hooks."""

    def __init__(self, *, state_name: str, resource: str, execution_arn: str, execution_name: str,
                 state_machine_name: str, retry_count: int, context_object: dict[str, Any],
                 clock: Clock, cancel: Cancel, timeout_seconds: float | None,
                 heartbeat_seconds: float | None, on_submitted: Callable[[Any], None],
                 execution_deadline: datetime | None = None) -> None:
        self.state_name = state_name
        self.resource = resource
        self.execution_arn = execution_arn
        self.execution_name = execution_name
        self.state_machine_name = state_machine_name
        self.retry_count = retry_count
        self.context_object = context_object
        self.task_token: str | None = context_object.get("Task", {}).get("Token")
        self.clock = clock
        self.cancel = cancel
        self.timeout_seconds = timeout_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.started = clock.now()
        self._last_heartbeat = self.started
        self._on_submitted = on_submitted
        self._execution_deadline = execution_deadline
        self._lock = threading.Lock()
        self._settled = False

    @property
    def cancelled(self) -> bool:
        """True once the task was abandoned (timeout, abort, failed sibling): stop work and return."""
        return self.cancel.is_set()

    def heartbeat(self) -> None:
        """Record a heartbeat (SendTaskHeartbeat): resets the HeartbeatSeconds window."""
        with self._lock:
            self._last_heartbeat = self.clock.now()

    def settle(self) -> bool:
        """Claim the task's one outcome: True for the first caller only. A callback's SendTaskSuccess and the
        timeout that would end the same task both claim it, so exactly one of them decides the task."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            return True

    def submitted(self, output: Any = None) -> None:
        """Record a TaskSubmitted event (a ``.sync`` job was created and is now being waited on)."""
        self._on_submitted(output)

    def deadline(self) -> tuple[datetime, str] | None:
        """The earliest moment the task times out and the error it then gets, if it has limits."""
        candidates: list[tuple[datetime, str]] = []
        if self.timeout_seconds is not None:
            candidates.append((self.started + timedelta(seconds=self.timeout_seconds), TIMEOUT))
        if self.heartbeat_seconds is not None:
            with self._lock:
                last = self._last_heartbeat
            candidates.append((last + timedelta(seconds=self.heartbeat_seconds), HEARTBEAT_TIMEOUT))
        return min(candidates) if candidates else None

    def sleep(self, seconds: float) -> None:
        """Let time pass inside the task (virtual or real), honouring its timeouts and cancellation."""
        limit = self.deadline()
        if self._execution_deadline is not None and (limit is None or self._execution_deadline < limit[0]):
            limit = (self._execution_deadline, TIMEOUT)  # the whole execution times out first
        # Compared in seconds, not as now + seconds: a sleep of centuries must reach the deadline, not overflow.
        left = None if limit is None else (limit[0] - self.clock.now()).total_seconds()
        if limit is not None and left is not None and seconds > left:
            self.clock.sleep(max(0.0, left), self.cancel)
            raise TaskDeadline(limit[1])
        self.clock.sleep(seconds, self.cancel)


def _normalise(arn: str) -> str:
    return _PARTITION.sub("arn:aws:", arn)


class ExecutorRegistry:
    """Maps resource ARNs (exact or glob patterns) to executors."""

    def __init__(self, executors: Mapping[str, TaskExecutor] | Iterable[tuple[str, TaskExecutor]] = ()) -> None:
        self._entries: list[tuple[str, TaskExecutor]] = []
        items = executors.items() if isinstance(executors, Mapping) else executors
        for pattern, executor in items:
            self.register(pattern, executor)

    def register(self, pattern: str, executor: TaskExecutor) -> None:
        if not callable(executor):
            raise TypeError(f"the executor for {pattern!r} is not callable")
        self._entries.append((_normalise(pattern), executor))

    def resolve(self, resource: str) -> TaskExecutor | None:
        wanted = _normalise(resource)
        for pattern, executor in self._entries:
            if pattern == wanted:
                return executor
        for pattern, executor in self._entries:
            if fnmatch.fnmatchcase(wanted, pattern):
                return executor
        return None

    def patterns(self) -> list[str]:
        return [pattern for pattern, _ in self._entries]
