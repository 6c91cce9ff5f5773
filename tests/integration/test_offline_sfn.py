"""The local Step Functions API (over the ASL interpreter) through boto3 and real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from d2ops.asl import StateMachine
from d2ops.offline.processes import RuntimeBusy
from d2ops.offline.runtime import OfflineRuntime
from tests.fixtures.offline.support import WAIT_DEFINITION

pytestmark = pytest.mark.integration


@pytest.fixture()
def runtime(tmp_path: Path) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path / "work") as rt:
        rt.sfn.add_state_machine(StateMachine.from_file(WAIT_DEFINITION, name="wait"))
        yield rt


def _arn(rt: OfflineRuntime) -> str:
    return next(arn for arn in rt.sfn.machines if arn.endswith(":wait"))


HOLD = "arn:aws:states:::test:hold"
# A run the test ends: it stays RUNNING in "Hold" until the test sets the gate (or stops it), then
# echoes its tag. Unlike a Wait of N seconds, no busy machine can end it before the test is done with it.
HELD_DEFINITION = {"StartAt": "Hold", "States": {
    "Hold": {"Type": "Task", "Resource": HOLD, "ResultPath": None, "Next": "Done"},
    "Done": {"Type": "Pass", "Parameters": {"echo.$": "$.tag"}, "End": True}}}


def _held_machine(rt: OfflineRuntime) -> tuple[str, threading.Event]:
    """A state machine whose runs hold until the returned gate is set. -> (its ARN, the gate)."""
    gate = threading.Event()

    def hold(resource: str, parameters: Any, context: Any) -> None:
        while not (gate.is_set() or context.cancelled):
            gate.wait(0.05)

    rt.sfn.executors.register(HOLD, hold)
    machine = StateMachine.from_definition(HELD_DEFINITION, name="held")
    rt.sfn.add_state_machine(machine)
    return machine.arn, gate


def _wait_done(sfn: Any, arn: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = sfn.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return described
        time.sleep(0.1)
    raise AssertionError(f"{arn} still running after {timeout} s")


def test_start_execution_is_idempotent_only_while_running_with_identical_input(runtime: OfflineRuntime) -> None:
    sfn = runtime.client("stepfunctions")
    machine, gate = _held_machine(runtime)  # RUNNING until the test opens the gate
    body = json.dumps({"tag": "a"})
    first = sfn.start_execution(stateMachineArn=machine, name="same-name", input=body)
    again = sfn.start_execution(stateMachineArn=machine, name="same-name", input=body)
    assert again["executionArn"] == first["executionArn"]
    assert again["startDate"] == first["startDate"]
    with pytest.raises(sfn.exceptions.ExecutionAlreadyExists):
        sfn.start_execution(stateMachineArn=machine, name="same-name", input=json.dumps({"tag": "b"}))
    assert sfn.describe_execution(executionArn=first["executionArn"])["status"] == "RUNNING"
    gate.set()
    done = _wait_done(sfn, first["executionArn"])
    assert done["status"] == "SUCCEEDED" and json.loads(done["output"]) == {"echo": "a"}
    with pytest.raises(sfn.exceptions.ExecutionAlreadyExists):  # finished: the name stays used
        sfn.start_execution(stateMachineArn=machine, name="same-name", input=body)
    listed = sfn.list_executions(stateMachineArn=machine)["executions"]
    assert [e["name"] for e in listed] == ["same-name"]


def test_unknown_state_machine_and_execution_are_named_errors(runtime: OfflineRuntime) -> None:
    sfn = runtime.client("stepfunctions")
    with pytest.raises(sfn.exceptions.StateMachineDoesNotExist):
        sfn.start_execution(stateMachineArn=_arn(runtime) + "-nope", input="{}")
    with pytest.raises(sfn.exceptions.ExecutionDoesNotExist):
        sfn.describe_execution(executionArn=_arn(runtime).replace("stateMachine", "execution") + ":nope")
    with pytest.raises(sfn.exceptions.InvalidExecutionInput):
        sfn.start_execution(stateMachineArn=_arn(runtime), input="{not json")


def test_list_filters_and_paginates_and_history_pages(runtime: OfflineRuntime) -> None:
    sfn = runtime.client("stepfunctions")
    machine = _arn(runtime)
    for i in range(3):
        sfn.start_execution(stateMachineArn=machine, name=f"quick-{i}", input=json.dumps({"seconds": 0, "tag": i}))
    # Stopped by the test at its end: RUNNING until then, however long a busy machine takes to get there.
    slow = sfn.start_execution(stateMachineArn=machine, name="slow", input=json.dumps({"seconds": 600, "tag": "s"}))
    for i in range(3):
        _wait_done(sfn, f"{machine.replace('stateMachine', 'execution')}:quick-{i}")
    running = sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")["executions"]
    assert [e["name"] for e in running] == ["slow"]
    pages = list(sfn.get_paginator("list_executions").paginate(stateMachineArn=machine,
                                                               PaginationConfig={"PageSize": 2}))
    assert [len(p["executions"]) for p in pages] == [2, 2]
    names = [e["name"] for p in pages for e in p["executions"]]
    assert names[0] == "slow" and sorted(names) == ["quick-0", "quick-1", "quick-2", "slow"]
    quick = f"{machine.replace('stateMachine', 'execution')}:quick-0"
    events = sfn.get_execution_history(executionArn=quick)["events"]
    assert events[0]["type"] == "ExecutionStarted" and events[-1]["type"] == "ExecutionSucceeded"
    first = sfn.get_execution_history(executionArn=quick, maxResults=2)
    rest = sfn.get_execution_history(executionArn=quick, maxResults=100, nextToken=first["nextToken"])
    assert [e["id"] for e in first["events"] + rest["events"]] == [e["id"] for e in events]
    reverse = sfn.get_execution_history(executionArn=quick, reverseOrder=True)["events"]
    assert [e["id"] for e in reverse] == [e["id"] for e in reversed(events)]
    stopped = sfn.stop_execution(executionArn=slow["executionArn"], error="Manual", cause="test")
    assert stopped["stopDate"]
    described = sfn.describe_execution(executionArn=slow["executionArn"])
    assert (described["status"], described.get("error")) == ("ABORTED", "Manual")


def test_records_survive_a_restart_and_a_second_runtime_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with OfflineRuntime(work) as rt:
        rt.sfn.add_state_machine(StateMachine.from_file(WAIT_DEFINITION, name="wait"))
        sfn = rt.client("stepfunctions")
        arn = sfn.start_execution(stateMachineArn=_arn(rt), name="kept", input=json.dumps({"seconds": 0, "tag": 1}))
        _wait_done(sfn, arn["executionArn"])
        with pytest.raises(RuntimeBusy, match="another d2ops offline runtime"):
            OfflineRuntime(work).start()
    with OfflineRuntime(work) as rt:
        rt.sfn.add_state_machine(StateMachine.from_file(WAIT_DEFINITION, name="wait"))
        described = rt.client("stepfunctions").describe_execution(executionArn=arn["executionArn"])
        assert described["status"] == "SUCCEEDED" and json.loads(described["output"]) == {"echo": 1}


KILLED_RUNTIME = textwrap.dedent("""
    import json, subprocess, sys, time
    from pathlib import Path
    from d2ops.asl import StateMachine
    from d2ops.offline.runtime import OfflineRuntime
    rt = OfflineRuntime(Path(sys.argv[1]))
    rt.start()
    machine = StateMachine.from_file(sys.argv[2], name="wait")
    rt.sfn.add_state_machine(machine)
    rt.client("stepfunctions").start_execution(stateMachineArn=machine.arn, name="interrupted",
                                                 input=json.dumps({"seconds": 600, "tag": 0}))
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)  # like a detached TorchServe
    table = Path(sys.argv[1]) / "processes.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the warden records its descendants every second, if it gets the CPU
        try:
            if child.pid in [p["pid"] for p in json.loads(table.read_text())["processes"]]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_a_killed_runtime_leaves_no_processes_and_its_run_is_closed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd() / "src"), str(Path.cwd())])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUNTIME, str(work), str(WAIT_DEFINITION)],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    child_pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)  # no cleanup code runs
    proc.wait(timeout=10)
    assert psutil.pid_exists(child_pid)
    with OfflineRuntime(work) as rt:
        rt.sfn.add_state_machine(StateMachine.from_file(WAIT_DEFINITION, name="wait"))
        assert any("stopped leftover process" in m for m in rt.messages), rt.messages
        assert any("interrupted" in m and "marked ABORTED" in m for m in rt.messages), rt.messages
        described = rt.client("stepfunctions").describe_execution(
            executionArn=_arn(rt).replace("stateMachine", "execution") + ":interrupted")
    assert described["status"] == "ABORTED" and described["error"] == "OfflineRuntimeStopped"
    assert "in state 'Hold'" in described["cause"]
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE


def test_stopping_the_runtime_aborts_its_running_executions(tmp_path: Path) -> None:
    # The runtime stops each emulated service that runs something (services.SERVICES, shutdown()):
    # an execution still running ends ABORTED, saying why, and stays so for the next runtime.
    work = tmp_path / "work"
    with OfflineRuntime(work) as rt:
        arn, _gate = _held_machine(rt)
        execution = rt.client("stepfunctions").start_execution(stateMachineArn=arn, name="held-at-stop",
                                                               input='{"tag": "x"}')["executionArn"]
    with OfflineRuntime(work) as rt:
        described = rt.client("stepfunctions").describe_execution(executionArn=execution)
    assert described["status"] == "ABORTED" and described["error"] == "OfflineRuntimeStopped"
    assert described["cause"] == "the offline runtime is stopping"
