"""A local Step Functions API over the ASL interpreter (the operations the pipeline's code calls;
AWS JSON 1.0, ``X-Amz-Target: AWSStepFunctions.<Op>``).

StartExecution keeps the service's idempotency rule, which the S3 trigger relies on: a used
execution name returns the original execution while it is still RUNNING with identical
input, and fails with ``ExecutionAlreadyExists`` otherwise. Executions run in background
threads on the real clock; each history event is persisted (see `store`), and executions
found RUNNING on disk at start-up belonged to a runtime that was killed: they are closed as
ABORTED with a cause saying so, since their worker processes are gone.

SendTaskSuccess, SendTaskFailure and SendTaskHeartbeat complete the executions' ``.waitForTaskToken``
tasks (`d2ops.asl.callbacks`) with the service's errors: ``ValidationException`` for a member beyond
botocore's model limits, ``InvalidOutput`` for output that is not JSON, ``InvalidToken`` for a token
that never named a task, ``TaskTimedOut`` for one whose task no longer waits (already completed,
timed out, its execution ended). The tokens live in memory only: a restart aborts the RUNNING
executions, and a token of one of them is then answered ``TaskTimedOut``.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from d2ops.asl import ExecutorRegistry, StateMachine, TaskTokens, TokenRefused
from d2ops.asl.callbacks import TASK_CLOSED_MESSAGE
from d2ops.asl.errors import INVALID_TOKEN, TASK_TIMED_OUT
from d2ops.asl.interpreter import Execution
from d2ops.asl.jsonvalue import json_problem, text_too_deep
from d2ops.offline.errors import ApiError
from d2ops.offline.services.base import AwsJsonService, RuntimeParts
from d2ops.offline.stack import ACCOUNT_ID, REGION
from d2ops.offline.store import ExecutionRecord, ExecutionStore
from d2ops.offline.task_integrations import ServiceExecutors

INTERRUPTED_ERROR = "OfflineRuntimeStopped"
MAX_PAGE = 1000
# botocore's stepfunctions model (SendTaskSuccessInput, SendTaskFailureInput): TaskToken 1-2048 characters,
# SensitiveData at most 262144 (bytes of UTF-8, the API reference says of output), SensitiveError at most
# 256 and SensitiveCause at most 32768 characters.
MAX_TASK_TOKEN = 2048
MAX_OUTPUT_BYTES = 262_144
MAX_ERROR = 256
MAX_CAUSE = 32_768
EventListener = Callable[[str, dict[str, Any]], None]  # (execution name, history event)


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _offset(token: str | None) -> int:
    if not token:
        return 0
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
        if not isinstance(value, int) or value < 0:
            raise ValueError
        return value
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError("InvalidToken", f"invalid nextToken {token[:40]!r}") from exc


def _validation(problems: list[str]) -> ApiError:
    """The JSON protocol's ValidationException, in AWS's words; the members are sensitive, so no values."""
    count = len(problems)
    return ApiError("ValidationException", f"{count} validation error{'s' if count > 1 else ''} detected: "
                                           + "; ".join(problems))


def _string_member(request: dict[str, Any], member: str, problems: list[str], *, required: bool,
                   minimum: int = 0, maximum: int) -> str | None:
    """A string member of a SendTask* request, its model constraints checked into ``problems``."""
    value = request.get(member)
    if value is None:
        if required:
            problems.append(f"Value null at '{member}' failed to satisfy constraint: Member must not be null")
        return None
    if not isinstance(value, str):
        raise ApiError("SerializationException", f"{member} must be a string")
    if len(value) < minimum:
        problems.append(f"Value at '{member}' failed to satisfy constraint: Member must have length greater than "
                        f"or equal to {minimum}")
    if len(value) > maximum:
        problems.append(f"Value at '{member}' failed to satisfy constraint: Member must have length less than or "
                        f"equal to {maximum}")
    return value


def _page_size(value: Any, default: int) -> int:
    if value in (None, 0):
        return default
    if not isinstance(value, int) or not 0 < value <= MAX_PAGE:
        raise ApiError("ValidationException", f"maxResults must be between 1 and {MAX_PAGE}")
    return value


class LocalStepFunctions(AwsJsonService):
    """State machines by ARN, and their executions (live ones and those reloaded from disk)."""

    CLIENT = "stepfunctions"
    ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_SFN"
    TARGET_PREFIX = "AWSStepFunctions"
    JSON_VERSION = "1.0"

    def __init__(self, store: ExecutionStore, executors: ExecutorRegistry) -> None:
        self.store = store
        self.executors = executors
        self.machines: dict[str, StateMachine] = {}
        self._records: dict[str, ExecutionRecord] = {}  # by execution ARN
        self._live: dict[str, Execution] = {}
        self._lock = threading.RLock()
        self._listeners: list[EventListener] = []
        self.recovery_messages: list[str] = []
        # The open task tokens of this runtime's executions: in memory only, so a restart forgets them (the
        # executions that held them are aborted by reload()).
        self.callbacks = TaskTokens()

    @classmethod
    def from_runtime(cls, parts: RuntimeParts) -> LocalStepFunctions:
        """The stack's state machine, with the executions recorded in the work dir (`reload`); Task states
        run through the runtime's service integrations (its Lambdas, boto3 against its endpoints)."""
        made = cls(ExecutionStore(parts.work_dir / "executions"),
                   ServiceExecutors(parts.lambdas, parts.client, parts.lost_responses, parts.throttles).registry())
        stack = parts.stack
        made.add_state_machine(StateMachine.from_file(stack.definition_path, substitutions=stack.substitutions,
                                                      name=stack.state_machine_name, region=REGION,
                                                      account_id=ACCOUNT_ID))
        made.reload()  # notifies no listener: the runtime may add its own after
        return made

    def add_state_machine(self, machine: StateMachine) -> None:
        self.machines[machine.arn] = machine

    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # ----- persistence ---------------------------------------------------------------------
    def reload(self) -> None:
        """Load recorded executions; close those a killed runtime left RUNNING."""
        records, problems = self.store.load_all()
        self.recovery_messages.extend(problems)
        for record in records:
            if record.status == "RUNNING":
                last = record.history[-1] if record.history else None
                where = ""
                for event in reversed(record.history):
                    details = event.get("stateEnteredEventDetails")
                    if details:
                        where = f" in state {details['name']!r}"
                        break
                record.status = "ABORTED"
                record.error = INTERRUPTED_ERROR
                record.cause = (f"the offline runtime stopped while this execution was running{where}; its jobs "
                                "and endpoints were stopped with it. Upload the dataset again (or `d2ops run`) "
                                "to start a new run.")
                record.stop_date = last["timestamp"] if last else record.start_date
                record.history.append({"timestamp": record.stop_date, "type": "ExecutionAborted",
                                       "id": len(record.history) + 1,
                                       "previousEventId": len(record.history),
                                       "executionAbortedEventDetails": {"error": record.error,
                                                                         "cause": record.cause}})
                self.store.save(record)
                self.recovery_messages.append(f"run {record.name} was interrupted{where}; marked ABORTED")
            self._records[record.execution_arn] = record

    def _snapshot(self, execution: Execution) -> ExecutionRecord:
        d = execution.describe()
        return ExecutionRecord(execution_arn=d["executionArn"], state_machine_arn=d["stateMachineArn"],
                               name=d["name"], status=d["status"], start_date=d["startDate"],
                               stop_date=d.get("stopDate"), input=d["input"], output=d.get("output"),
                               error=d.get("error"), cause=d.get("cause"), history=execution.history)

    def _on_event(self, arn: str, event: dict[str, Any]) -> None:
        with self._lock:
            execution = self._live.get(arn)
            if execution is None:  # the first event arrives before start() returns
                return
            record = self._snapshot(execution)  # the status is final before the final event
            self._records[arn] = record
            self.store.save(record)
        for listener in list(self._listeners):
            listener(record.name, event)

    # ----- the API -------------------------------------------------------------------------
    def _machine(self, arn: str | None) -> StateMachine:
        if not arn:
            raise ApiError("ValidationException", "stateMachineArn is required")
        try:
            return self.machines[arn]
        except KeyError:
            raise ApiError("StateMachineDoesNotExist", f"State Machine Does Not Exist: '{arn}'") from None

    def _record(self, arn: str | None) -> ExecutionRecord:
        if not arn:
            raise ApiError("ValidationException", "executionArn is required")
        with self._lock:
            live = self._live.get(arn)
            if live is not None:
                return self._snapshot(live)
            try:
                return self._records[arn]
            except KeyError:
                raise ApiError("ExecutionDoesNotExist", f"Execution Does Not Exist: '{arn}'") from None

    def start_execution(self, request: dict[str, Any]) -> dict[str, Any]:
        machine = self._machine(request.get("stateMachineArn"))
        name = request.get("name") or str(uuid.uuid4())
        text = request.get("input") or "{}"
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json can parse
            raise ApiError("InvalidExecutionInput", f"the input is not valid JSON: {exc}") from exc
        with self._lock:
            arn = f"arn:aws:states:{machine.region}:{machine.account_id}:execution:{machine.name}:{name}"
            if arn in self._records:
                current = self._record(arn)
                if current.status == "RUNNING" and json.loads(current.input) == data:
                    return {"executionArn": arn, "startDate": current.start_date}
                raise ApiError("ExecutionAlreadyExists", f"Execution Already Exists: '{arn}'")
            try:
                # The execution thread's first event waits for this lock, so it sees _live filled in.
                # SystemRandom: task tokens are bearer secrets of their tasks, so not from a predictable generator.
                execution = machine.start(data, executors=self.executors, execution_name=name,
                                          on_event=lambda event: self._on_event(arn, event),
                                          callbacks=self.callbacks, rng=random.SystemRandom())
            except ValueError as exc:
                raise ApiError("InvalidName" if "name" in str(exc) else "InvalidExecutionInput", str(exc)) from exc
            self._live[execution.arn] = execution
            record = self._snapshot(execution)
            self._records[execution.arn] = record
            self.store.save(record)
            threading.Thread(target=self._retire, args=(execution,), daemon=True,
                             name=f"sfn-retire-{execution.name}").start()
            return {"executionArn": execution.arn, "startDate": execution.start_date}

    def _retire(self, execution: Execution) -> None:
        execution.wait()
        with self._lock:
            record = self._snapshot(execution)
            self._records[execution.arn] = record
            self.store.save(record)
            self._live.pop(execution.arn, None)

    def describe_execution(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._record(request.get("executionArn")).describe()

    def list_executions(self, request: dict[str, Any]) -> dict[str, Any]:
        machine = self._machine(request.get("stateMachineArn"))
        status = request.get("statusFilter")
        if status and status not in ("RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"):
            raise ApiError("ValidationException", f"invalid statusFilter {status!r}")
        with self._lock:
            arns = [arn for arn, r in self._records.items() if r.state_machine_arn == machine.arn]
            items = [self._record(arn) for arn in arns]
        items = [r for r in items if not status or r.status == status]
        items.sort(key=lambda r: (r.start_date, r.name), reverse=True)
        start = _offset(request.get("nextToken"))
        size = _page_size(request.get("maxResults"), 100)
        page = items[start:start + size]
        response: dict[str, Any] = {"executions": [r.list_item() for r in page]}
        if start + size < len(items):
            response["nextToken"] = _token(start + size)
        return response

    def get_execution_history(self, request: dict[str, Any]) -> dict[str, Any]:
        record = self._record(request.get("executionArn"))
        events = list(reversed(record.history)) if request.get("reverseOrder") else list(record.history)
        if request.get("includeExecutionData") is False:
            events = [{k: ({kk: vv for kk, vv in v.items() if kk not in ("input", "output")}
                           if k.endswith("EventDetails") and isinstance(v, dict) else v)
                       for k, v in e.items()} for e in events]
        start = _offset(request.get("nextToken"))
        size = _page_size(request.get("maxResults"), 100)
        response: dict[str, Any] = {"events": events[start:start + size]}
        if start + size < len(events):
            response["nextToken"] = _token(start + size)
        return response

    def stop_execution(self, request: dict[str, Any]) -> dict[str, Any]:
        arn = request.get("executionArn")
        record = self._record(arn)
        live = self._live.get(str(arn))
        if live is None or record.status != "RUNNING":
            raise ApiError("ExecutionNotRunning" if record else "ExecutionDoesNotExist",
                           f"execution {record.name} is {record.status}, not RUNNING")
        live.abort(request.get("error", ""), request.get("cause", ""))
        live.wait(30)
        return {"stopDate": live.stop_date or datetime.now(UTC)}

    def describe_state_machine(self, request: dict[str, Any]) -> dict[str, Any]:
        machine = self._machine(request.get("stateMachineArn"))
        return {"stateMachineArn": machine.arn, "name": machine.name, "status": "ACTIVE",
                "definition": json.dumps(machine.definition), "roleArn": machine.role_arn, "type": "STANDARD",
                "creationDate": datetime(2024, 1, 1, tzinfo=UTC)}

    # ----- the callback pattern -------------------------------------------------------------
    def send_task_success(self, request: dict[str, Any]) -> dict[str, Any]:
        problems: list[str] = []
        token = _string_member(request, "taskToken", problems, required=True, minimum=1, maximum=MAX_TASK_TOKEN)
        text = _string_member(request, "output", problems, required=True, maximum=MAX_OUTPUT_BYTES)
        if text is not None and len(text) <= MAX_OUTPUT_BYTES < len(text.encode("utf-8", "surrogatepass")):
            problems.append(f"Value at 'output' failed to satisfy constraint: Member must have length less than or "
                            f"equal to {MAX_OUTPUT_BYTES}")
        if problems:
            raise _validation(problems)
        assert token is not None and text is not None
        output = self._parse_output(text)  # before the token is used: a refused output leaves the task waiting
        return self._callback(lambda: self.callbacks.succeed(token, output))

    def send_task_failure(self, request: dict[str, Any]) -> dict[str, Any]:
        problems: list[str] = []
        token = _string_member(request, "taskToken", problems, required=True, minimum=1, maximum=MAX_TASK_TOKEN)
        error = _string_member(request, "error", problems, required=False, maximum=MAX_ERROR)
        cause = _string_member(request, "cause", problems, required=False, maximum=MAX_CAUSE)
        if problems:
            raise _validation(problems)
        assert token is not None
        return self._callback(lambda: self.callbacks.fail(token, error or "", cause or ""))

    def send_task_heartbeat(self, request: dict[str, Any]) -> dict[str, Any]:
        problems: list[str] = []
        token = _string_member(request, "taskToken", problems, required=True, minimum=1, maximum=MAX_TASK_TOKEN)
        if problems:
            raise _validation(problems)
        assert token is not None
        return self._callback(lambda: self.callbacks.heartbeat(token))

    @staticmethod
    def _parse_output(text: str) -> Any:
        """SendTaskSuccess's output as the task's result, or InvalidOutput (the service's error for output that
        is not JSON; its message is ours, in the service's "<Error>: '<detail>'" form)."""
        problem: str | None = "it is nested too deeply" if text_too_deep(text) else None
        if problem is None:
            try:
                value = json.loads(text)
            except (ValueError, RecursionError) as exc:
                problem = f"it is not valid JSON ({exc})"
            else:
                problem = json_problem(value)
                if problem is None:
                    return value
        raise ApiError("InvalidOutput", f"Invalid Output: '{problem}'")

    def _callback(self, complete: Callable[[], None]) -> dict[str, Any]:
        try:
            complete()
        except TokenRefused as refused:
            code, message = refused.code, refused.message
            with self._lock:
                known = refused.execution_arn is not None and refused.execution_arn in self._records
            if code == INVALID_TOKEN and known:
                # A token of an execution this runtime has on record but whose task no registry holds: the
                # execution ran under an earlier runtime and was aborted when this one started (reload()).
                code, message = TASK_TIMED_OUT, TASK_CLOSED_MESSAGE
            raise ApiError(code, message) from None
        return {}

    OPERATIONS = ("StartExecution", "DescribeExecution", "ListExecutions", "GetExecutionHistory", "StopExecution",
                  "DescribeStateMachine", "SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat")

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        if operation not in self.OPERATIONS:
            raise ApiError("UnknownOperationException", f"the offline Step Functions API does not serve {operation}")
        method = "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")
        result: dict[str, Any] = getattr(self, method)(request)
        return result

    def shutdown(self) -> None:
        """The runtime is stopping: its executions end (ABORTED) with it."""
        self.abort_all("the offline runtime is stopping")

    def abort_all(self, cause: str) -> None:
        with self._lock:
            live = list(self._live.values())
        for execution in live:
            execution.abort(INTERRUPTED_ERROR, cause)
        for execution in live:
            execution.wait(10)
