"""Exceptions of the ASL interpreter: definition problems, runtime (``States.*``) errors, task failures."""

from __future__ import annotations

from collections.abc import Sequence

# The predefined error names the interpreter raises itself (the rest come from tasks).
ALL = "States.ALL"
RUNTIME = "States.Runtime"
TIMEOUT = "States.Timeout"
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
TASK_FAILED = "States.TaskFailed"
DATA_LIMIT_EXCEEDED = "States.DataLimitExceeded"
NO_CHOICE_MATCHED = "States.NoChoiceMatched"
RESULT_PATH_MATCH_FAILURE = "States.ResultPathMatchFailure"


class AslDefinitionError(ValueError):
    """The definition (or its substitutions, or a mock config) is unusable; ``problems`` lists each one."""

    def __init__(self, problems: str | Sequence[str], *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        prefix = f"{source}: " if source else ""
        if len(self.problems) == 1:
            message = f"{prefix}{self.problems[0]}"
        else:
            message = f"{prefix}{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class TaskFailed(Exception):
    """Raised by a task executor: the Task state fails with this error name and cause (Retry/Catch route on it)."""

    def __init__(self, error: str, cause: str = "") -> None:
        super().__init__(f"{error}: {cause}" if cause else error)
        self.error = error
        self.cause = cause


class StatesError(Exception):
    """A runtime error inside an execution, carrying the Step Functions error name and cause.

    ``also`` names errors a retrier or catcher may match besides ``error``, which is the name the history
    records: a callback task's heartbeat timeout is recorded as ``States.Timeout`` and still matched by
    ``States.HeartbeatTimeout`` ("only available inside the Catch and Retry fields", as the service's
    error-handling guide says of it)."""

    def __init__(self, error: str, cause: str = "", also: Sequence[str] = ()) -> None:
        super().__init__(f"{error}: {cause}" if cause else error)
        self.error = error
        self.cause = cause
        self.also = tuple(also)
        # The event a Parallel or Map state records when this error ends it (ParallelStateFailed,
        # MapStateFailed): recorded once no retrier takes the error, before a catcher or the failure.
        self.failed_event: str | None = None
        # A Task state's failure on its way out of a Parallel branch or Map iteration: the id of its
        # TaskFailed/TaskTimedOut event, which AWS's TaskStateAborted follows (recorded); moved to
        # ``chain_event`` once the branch has recorded it, for the enclosing state's Failed event to follow too.
        self.failed_task_event: int | None = None
        # A task's result over the payload limit: AWS records it as the task's failure, which States.ALL
        # catches (recorded), unlike the terminal States.DataLimitExceeded of a state's own output.
        self.task_result_too_large = False
        # A task's timeout has no cause, yet a catcher's error output carries "Cause": "" (recorded).
        self.empty_cause_caught = False
        self.chain_event: int | None = None

    def matched_by(self, error_equals: Sequence[str]) -> bool:
        """Whether a retrier's or catcher's ``ErrorEquals`` covers this error (or one of ``also``)."""
        if self.task_result_too_large and ALL in error_equals:
            return True
        return any(error_matches(error_equals, name) for name in (self.error, *self.also))


# SendTaskSuccess/SendTaskFailure/SendTaskHeartbeat's answers for a token they cannot use (botocore's
# stepfunctions model names the error shapes): one that never named a task, and one whose task no longer
# waits (completed, timed out, or its execution ended).
INVALID_TOKEN = "InvalidToken"
TASK_TIMED_OUT = "TaskTimedOut"


class TokenRefused(Exception):
    """A callback (SendTask*) names a token no task is waiting on; ``code`` is the API error it answers.

    ``execution_arn``: for an InvalidToken, the execution a well-formed token names (a caller that knows
    more executions than the registry, such as the offline API after a restart, may answer TaskTimedOut)."""

    def __init__(self, code: str, message: str, execution_arn: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.execution_arn = execution_arn


class ExecutionAborted(Exception):
    """The execution was stopped from outside (``Execution.abort``) while it was running."""


class ExecutionHistoryLimitExceeded(Exception):
    """The execution recorded the service's maximum number of history events (an endless loop, or an
    inline Map too large): it fails, uncatchable, as a Standard execution does."""


class ExecutionTimedOut(Exception):
    """The state machine's top-level ``TimeoutSeconds`` elapsed."""


def error_matches(error_equals: Sequence[str], error: str) -> bool:
    """Whether a retrier's or catcher's ``ErrorEquals`` list covers ``error``.

    ``States.Runtime`` is never retried or caught; ``States.ALL`` matches everything else except
    ``States.DataLimitExceeded`` (terminal unless named explicitly); ``States.TaskFailed`` matches
    everything but timeouts; ``States.Timeout`` also covers heartbeat timeouts.
    """
    if error == RUNTIME:
        return False
    for name in error_equals:
        if name == error:
            return True
        if name == ALL and error != DATA_LIMIT_EXCEEDED:
            return True
        if name == TASK_FAILED and error not in (TIMEOUT, HEARTBEAT_TIMEOUT, DATA_LIMIT_EXCEEDED):
            return True
        if name == TIMEOUT and error == HEARTBEAT_TIMEOUT:
            return True
    return False
