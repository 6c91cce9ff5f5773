"""The documented examples of the AWS Step Functions developer guide, run through the interpreter.

Each case in tests/fixtures/asl/aws_docs_examples.json holds a definition, the documented input
and the documented output (or error), plus a script for the integrated services the example
calls (a Lambda function that returns, throws or runs for a while), played back per state.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from d2ops.asl import StateMachine, TaskContext, TaskFailed, VirtualClock

CASES = json.loads((Path(__file__).parents[1] / "fixtures" / "asl" / "aws_docs_examples.json").read_text())


class ScriptedServices:
    """Stands in for the services a documented example calls: one scripted outcome per invocation."""

    def __init__(self, script: dict[str, list[dict[str, Any]]], clock: VirtualClock) -> None:
        self.script = {state: list(steps) for state, steps in script.items()}
        self.clock = clock
        self.start = clock.now()
        self.inputs: dict[str, list[Any]] = defaultdict(list)
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def __call__(self, resource: str, parameters: Any, context: TaskContext) -> Any:
        state = context.state_name
        self.inputs[state].append(parameters)
        self.seconds[state].append((self.clock.now() - self.start).total_seconds())
        step = self.script[state].pop(0)
        if "sleep" in step:
            context.sleep(step["sleep"])
        if "throw" in step:
            raise TaskFailed(step["throw"]["Error"], step["throw"].get("Cause", ""))
        return step["return"]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_documented_example(case: dict[str, Any]) -> None:
    # A case whose definition names a moment (a Wait Timestamp) starts the clock where it says.
    clock = VirtualClock(datetime.fromisoformat(case["clock_start"]) if "clock_start" in case else None)
    services = ScriptedServices(case.get("tasks", {}), clock)
    machine = StateMachine.from_definition(case["definition"], name="DocsExample")
    execution = machine.run(case["input"], executors={"arn:*": services}, clock=clock,
                            execution_name=case.get("execution_name"))

    expect = case["expect"]
    assert execution.status == expect["status"], (execution.error, execution.cause, case["doc"])
    if "output" in expect:
        assert execution.output == expect["output"]
    for key in ("error", "cause"):
        if key in expect:
            assert getattr(execution, key) == expect[key]
    for state, inputs in case.get("expect_task_inputs", {}).items():
        assert services.inputs[state] == inputs
    for state, seconds in case.get("expect_attempt_seconds", {}).items():
        assert services.seconds[state] == seconds
    if "expect_elapsed_seconds" in case:
        assert execution.stop_date is not None
        assert (execution.stop_date - execution.start_date).total_seconds() == case["expect_elapsed_seconds"]
    assert all(not steps for steps in services.script.values()), "every scripted invocation happened"
