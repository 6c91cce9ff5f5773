"""A run read at a glance: the timeline by stage (d2ops_core.stage_timeline), ``d2ops status``'s lines and
``d2ops graph``'s picture (d2ops_core.state_graph), on runs of the real definition (the mocked pipeline of
tests/fixtures/pipeline) and on hand-made steps for the cases a mocked run does not reach."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from d2ops.commands.status import format_run, format_timeline
from d2ops_core.pipeline_stages import all_states
from d2ops_core.stage_timeline import Step, human_duration, lines_of, stage_statuses, steps_from_history, summarise
from d2ops_core.state_graph import render_png, render_svg, stage_view
from tests.fixtures.pipeline import support
from tests.unit.test_pipeline_stages import STAGE_KEYS

DEFINITION: dict[str, Any] = json.loads(support.DEFINITION.read_text())
# A run that goes well passes every stage but the failure report, in the order people see them.
SUCCEEDED_STAGES = [key for key in STAGE_KEYS if key != "failure"]


@cache
def _run(case: str) -> tuple[list[dict[str, Any]], str]:
    execution = support.run_case(case)
    return execution.history, execution.status


def _steps(case: str) -> list[Step]:
    history, status = _run(case)
    return steps_from_history(history, status)


def _api_steps(case: str) -> list[dict[str, Any]]:
    """The steps as the status API's JSON carries them (what `d2ops status` reads)."""
    return [dict(vars(s)) for s in _steps(case)]


@pytest.mark.parametrize(("seconds", "said"), [
    (None, "-"), (0.0, "0s"), (0.04, "0s"), (3.14159, "3.1s"), (9.96, "10.0s"), (12.6, "13s"), (59.6, "1m 00s"),
    (580, "9m 40s"), (3599.4, "59m 59s"), (7500, "2h 05m")])
def test_durations_read_as_people_say_them(seconds: float | None, said: str) -> None:
    assert human_duration(seconds) == said


def test_a_first_deployment_reads_as_its_stages_with_the_wait_on_one_line_and_the_lookup_a_miss() -> None:
    steps = _steps("FirstDeployment")
    stays = summarise(steps)
    assert [s.stage.key for s in stays] == SUCCEEDED_STAGES
    assert {s.status for s in stays} == {"succeeded"}
    deploy = next(s for s in stays if s.stage.key == "deploy")
    waits = [line for line in deploy.lines if "Wait for endpoint" in line.states]
    assert len(waits) == 1 and waits[0].loop and waits[0].title == "Wait for endpoint"
    assert waits[0].rounds == sum(s.name == "Wait for endpoint" for s in steps) >= 2
    assert "Check endpoint status" in waits[0].states and "Smoke test endpoint" not in waits[0].states
    lookup = next(line for line in deploy.lines if line.title == "Find current endpoint")
    assert (lookup.status, lookup.error) == ("missed", None) and lookup.note and "no endpoint" in lookup.note

    lines = format_timeline(_api_steps("FirstDeployment"))
    text = "\n".join(lines)
    assert not re.search(r"\bfailed\b", text), text  # the expected miss is not a failure
    assert re.search(r"missed +Find current endpoint +0s +no endpoint yet", text), text
    wait = [line for line in lines if "Wait for endpoint" in line]
    assert len(wait) == 1 and re.search(rf"Wait for endpoint \u00d7{waits[0].rounds} +1m 30s$", wait[0]), wait
    assert not any("Check endpoint status" in line or "Count endpoint check" in line for line in lines)
    assert lines[0].split() == ["Validate", "succeeded", "0s"]


def test_a_failed_training_reads_as_failed_in_train_and_ends_on_the_fail_state_named() -> None:
    stays = summarise(_steps("TrainingFailed"))
    assert [s.stage.key for s in stays] == ["validate", "prepare", "train", "failure"]
    assert [s.status for s in stays] == ["succeeded", "succeeded", "failed", "failed"]
    train = stays[2].lines
    assert [(line.title, line.status, line.error) for line in train] == [
        ("Train model", "failed", "States.TaskFailed"), ("Record training failure", "succeeded", None)]
    assert (stays[-1].lines[-1].title, stays[-1].lines[-1].error) == ("Training failed", "TrainingFailed")
    assert stage_statuses(stays)["deploy"] == "not reached"


def test_a_lookup_that_fails_for_another_reason_stays_a_failure() -> None:
    at = "2026-01-01T00:00:{:02d}+00:00".format
    names = ["Create endpoint config", "Find current endpoint", "Endpoint missing?", "Endpoint lookup failed",
             "Record deployment failure", "Describe failure", "Deployment failed"]
    steps = [Step(name=n, status="succeeded", entered_at=at(i), exited_at=at(i + 1), duration_seconds=1.0)
             for i, n in enumerate(names)]
    steps[1].status, steps[1].error = "failed", "SageMaker.SageMakerException"
    steps[-1].status, steps[-1].exited_at, steps[-1].error = "failed", None, "DeploymentFailed"
    lookup = lines_of(steps)[1]
    assert (lookup.status, lookup.error, lookup.note) == ("caught", "SageMaker.SageMakerException", None)
    stays = summarise(steps)
    assert [(s.stage.key, s.status) for s in stays] == [("deploy", "failed"), ("failure", "failed")]
    assert stays[0].seconds == 5.0  # from entering its first state to leaving its last (five: its record too)


def test_a_repeated_state_is_one_line_and_a_state_of_another_version_is_kept() -> None:
    steps = [Step(name="Check image batch", status="succeeded", duration_seconds=2.0) for _ in range(4)]
    steps.append(Step(name="A state of a newer definition", status="running"))
    lines = lines_of(steps)
    assert [(line.title, line.rounds, line.seconds, line.loop) for line in lines] == [
        ("Check image batch", 4, 8.0, False), ("A state of a newer definition", 1, None, False)]
    assert [s.stage.key for s in summarise(steps)] == ["validate", "other"]
    assert [s.status for s in summarise(steps)] == ["succeeded", "running"]


def test_a_lease_wait_reads_as_one_line_of_rounds() -> None:
    stays = summarise(_steps("EndpointBusy"))
    prepare = next(s for s in stays if s.stage.key == "prepare")
    loops = [line for line in prepare.lines if line.loop]
    assert len(loops) == 1 and loops[0].title == "Wait for endpoint lease" and loops[0].rounds >= 2
    assert "Acquire endpoint lease" in loops[0].states  # its expected misses are inside the line, not failures
    assert loops[0].status != "failed" and stays[-1].lines[-1].error == "EndpointBusy"


def test_status_prints_a_rejected_run_by_stage() -> None:
    run = {"run_id": "r", "status": "FAILED", "error": "DatasetRejected", "timeline": _api_steps("DatasetRejected")}
    lines = format_run(run)
    at = lines.index("  timeline")
    heads = [line.split()[0] for line in lines[at + 1:] if not line.startswith("      ")]
    assert heads == ["Validate", "Report"]
    assert lines[-1].split()[:3] == ["failed", "Dataset", "rejected"] and "[DatasetRejected]" in lines[-1]


def test_the_graph_has_the_stages_on_top_the_run_highlighted_and_the_unreached_folded(tmp_path: Path) -> None:
    history, status = _run("FirstDeployment")
    views = stage_view(DEFINITION, steps_from_history(history, status))
    assert [v.key for v in views] == STAGE_KEYS
    by = {v.key: v for v in views}
    assert by["failure"].status == "not reached" and by["failure"].lines == []
    assert "Route failure" in by["failure"].folded and "Undo deployment" in by["deploy"].folded
    assert "Create endpoint" not in by["deploy"].folded
    assert by["deploy"].next_stages == ["notify"] and by["notify"].next_stages == []
    drawn = sum(len(v.lines) for v in views)
    assert drawn < 40 < len(all_states(DEFINITION))  # the run's path, not the whole machine

    svg = render_svg(DEFINITION, history, status, "run")
    width, height = (float(v) for v in re.search(r'width="(\d+)" height="(\d+)"', svg).groups())  # type: ignore[union-attr]
    assert height < 1000 and width < 2000
    assert svg.count('class="taken"') == len(SUCCEEDED_STAGES) - 1  # validate -> ... -> notify
    # a group for each stage, and a folded one for each stage with states this run did not reach
    assert svg.count('<g class="stage"') == len(STAGE_KEYS)
    assert svg.count('<g class="folded"') == sum(1 for v in views if v.folded)  # deploy's, failure's, ... (above)
    assert by["notify"].folded == ["Success notification without cost", "Notification failed"]  # all went well
    assert "<title>Find current endpoint (Task): caught</title>" in svg  # the state's outcome, by name
    assert ">missed \u00b7 0s<" in svg and ">Wait for endpoint \u00d73<" in svg
    # every state is named once, drawn or folded
    assert svg.count("<g><title>") == len(all_states(DEFINITION))
    png = tmp_path / "run.png"
    render_png(DEFINITION, history, status, "run", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_live_progress_says_an_expected_miss_once_the_run_shows_it_recovered() -> None:
    from datetime import UTC, datetime, timedelta

    from d2ops.offline.progress import ProgressPrinter

    history, _ = _run("FirstDeployment")
    lines: list[str] = []
    printer = ProgressPrinter(lines.append)
    for recorded in history:
        printer("run", recorded)
    assert [line for line in lines if "!!" in line] == []
    assert any(re.search(r" ok Find current endpoint \(0\.0s, missed: no endpoint yet", line) for line in lines)

    def event(kind: str, name: str | None = None, error: str | None = None) -> dict[str, Any]:
        found: dict[str, Any] = {"type": kind, "timestamp": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=1)}
        if name and kind.endswith("Entered"):
            found["stateEnteredEventDetails"] = {"name": name}
        elif name:
            found["stateExitedEventDetails"] = {"name": name}
        if error:
            found["taskFailedEventDetails"] = {"error": error}
        return found

    lines.clear()
    printer = ProgressPrinter(lines.append)
    for e in (event("TaskStateEntered", "Find current endpoint"),
              event("TaskFailed", error="SageMaker.SageMakerException"),
              event("TaskStateExited", "Find current endpoint"), event("ChoiceStateEntered", "Endpoint missing?"),
              event("ChoiceStateExited", "Endpoint missing?"), event("PassStateEntered", "Endpoint lookup failed"),
              event("PassStateExited", "Endpoint lookup failed")):
        printer("run", e)
    assert [line for line in lines if "Find current endpoint (" in line] == []  # not decided yet
    printer("run", event("PassStateEntered", "Record deployment failure"))  # the failure path: it was a failure
    assert lines[-1].endswith("!! Find current endpoint (0.0s, caught SageMaker.SageMakerException)")
