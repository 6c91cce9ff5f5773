"""Drive one pipeline run offline the way a user drives the deployed one.

Upload a dataset version (manifest.json last), let the S3 "Object Created" event reach the
trigger function (optionally several times, as EventBridge's at-least-once delivery may),
follow the execution with per-state progress lines (and, while a training job runs, its
iterations, loss, images/s and time left, read from the job's log: ``d2ops.offline.progress``),
and summarise it from its history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from d2ops.offline.progress import Printer, ProgressPrinter, TrainingProgressFollower
from d2ops.offline.runtime import OfflineRuntime


@dataclass
class RunSummary:
    run_id: str
    execution_arn: str
    status: str
    error: str | None
    cause: str | None
    seconds: float
    state_durations: dict[str, float]
    states_visited: list[str]
    output: dict[str, Any] = field(default_factory=dict)
    trigger_results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gate(self) -> dict[str, Any]:
        evaluation = self.output.get("evaluation") or {}
        gate = self.output.get("gate") or {}
        return {"decision": gate.get("decision"), "reason": gate.get("reason"),
                "primary_metric": evaluation.get("primary_metric"),
                "challenger": evaluation.get("challenger_value"), "champion": evaluation.get("champion_value"),
                "min_map": evaluation.get("min_map"), "max_regression": evaluation.get("max_regression"),
                # the paired-bootstrap interval of challenger - champion the gate judged (None: no champion)
                "interval": evaluation.get("interval"), "more_val_images": evaluation.get("more_val_images")}

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "error": self.error, "seconds": round(self.seconds, 1),
                "state_durations": self.state_durations, "gate": self.gate}


def state_durations(history: list[dict[str, Any]]) -> tuple[dict[str, float], list[str]]:
    """Seconds spent in each state (summed over visits, e.g. an endpoint wait loop), in visit order."""
    durations: dict[str, float] = {}
    entered: dict[str, datetime] = {}
    order: list[str] = []
    for event in history:
        if event["type"].endswith("StateEntered"):
            name = event["stateEnteredEventDetails"]["name"]
            entered[name] = event["timestamp"]
            if name not in order:
                order.append(name)
        elif event["type"].endswith("StateExited"):
            name = event["stateExitedEventDetails"]["name"]
            if name in entered:
                spent = (event["timestamp"] - entered.pop(name)).total_seconds()
                durations[name] = round(durations.get(name, 0.0) + spent, 2)
    for name, start in entered.items():  # a Fail state or an abort leaves no Exited event
        end = history[-1]["timestamp"] if history else start
        durations[name] = round(durations.get(name, 0.0) + (end - start).total_seconds(), 2)
    return durations, order


def upload_and_trigger(rt: OfflineRuntime, dataset_dir: Path, deliveries: int, out: Printer) -> list[dict[str, Any]]:
    key, version = rt.upload_dataset(dataset_dir)
    out(f"uploaded {dataset_dir} to s3://{rt.stack.data_bucket}/{key.rpartition('/')[0]}/ (manifest.json last, "
        f"version {version[:12]}...)")
    event = rt.upload_event(rt.stack.data_bucket, key)
    results: list[dict[str, Any]] = []
    for attempt in range(1, deliveries + 1):
        result = rt.deliver_event(event)
        if result is None:
            raise RuntimeError(f"the trigger rule's pattern does not match the upload of {key}")
        seen = any(r.get("run_id") == result.get("run_id") for r in results)
        results.append(result)
        note = " (a duplicate: the run exists, no second one started)" if seen else ""
        out(f"S3 event delivery {attempt}/{deliveries}: trigger answered {result['action']} "
            f"({result.get('run_id')}){note}")
    run_ids = {r.get("run_id") for r in results}
    if len(run_ids) != 1 or results[0]["action"] not in ("started", "already-started"):
        raise RuntimeError(f"the trigger did not start exactly one run: {results}")
    return results


def wait_for_run(rt: OfflineRuntime, execution_arn: str, timeout: float,
                 tick: Callable[[], None] | None = None) -> dict[str, Any]:
    sfn = rt.client("stepfunctions")
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        if time.monotonic() > deadline:
            sfn.stop_execution(executionArn=execution_arn, error="OfflineTimeout",
                               cause=f"the run took longer than {timeout:.0f} s")
            return dict(sfn.describe_execution(executionArn=execution_arn))
        time.sleep(0.5)


def summarize(rt: OfflineRuntime, described: dict[str, Any], results: list[dict[str, Any]]) -> RunSummary:
    sfn = rt.client("stepfunctions")
    history: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"executionArn": described["executionArn"], "maxResults": 1000}
    while True:
        page = sfn.get_execution_history(**kwargs)
        history += page["events"]
        if not page.get("nextToken"):
            break
        kwargs["nextToken"] = page["nextToken"]
    durations, order = state_durations(history)
    document: dict[str, Any] = {}
    text = described.get("output")
    if not text:
        for event in reversed(history):
            details = event.get("stateExitedEventDetails") or {}
            if details.get("output"):
                text = details["output"]
                break
    if text:
        document = json.loads(text)
    stop = described.get("stopDate") or described["startDate"]
    return RunSummary(run_id=described["name"], execution_arn=described["executionArn"], status=described["status"],
                      error=described.get("error"), cause=described.get("cause"),
                      seconds=(stop - described["startDate"]).total_seconds(), state_durations=durations,
                      states_visited=order, output=document if isinstance(document, dict) else {},
                      trigger_results=results)


def run_pipeline(rt: OfflineRuntime, dataset_dir: Path, *, deliveries: int = 1, out: Printer = print,
                 timeout: float = 1800.0, tick: Callable[[str], None] | None = None) -> RunSummary:
    """Upload, trigger, follow (training progress included) and summarise one run.

    ``tick`` is called with the run id at every poll while the run runs (about every half second, after the
    training progress): what a caller does while it waits, such as deciding a review (``d2ops demo --review``).
    """
    progress = ProgressPrinter(out)
    training = TrainingProgressFollower(rt.sagemaker.job_log, out, progress.stamp)
    rt.sfn.add_listener(training)
    rt.sfn.add_listener(progress)
    try:
        results = upload_and_trigger(rt, dataset_dir, deliveries, out)
        run_id = progress.run_id = training.run_id = results[0]["run_id"]

        def poll() -> None:
            training.poll()
            if tick is not None:
                tick(run_id)

        described = wait_for_run(rt, results[0]["execution_arn"], timeout, tick=poll)
        training.finish()
    finally:
        rt.sfn.remove_listener(progress)
        rt.sfn.remove_listener(training)
    return summarize(rt, described, results)
