"""A run's training progress over the offline stack while its training job runs.

The pipeline runs for real up to "Train model"; the training job is a scripted stand-in for the
training process that writes the job's log as the local runner does (``[algo-1] `` + the trainer's
``d2ops-metric`` lines, d2ops_core.metrics) and waits between iterations, so the test can ask the
status API (the real Lambda behind the offline HTTP API, SigV4-signed) while the job is at a known
place. Everything between the log and the answer is the product's: the local SageMaker's publisher
(the job's MetricDefinitions into moto's CloudWatch), GetMetricData in the status API, ``d2ops status``.
A real trainer's lines take the same way in tests/e2e/test_offline_pipeline.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import RunSummary, run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.services.sagemaker_jobs import JOB_LOG, JobOutcome
from d2ops_core import metrics, s3_layout
from d2ops_core.documents.training_curve import TrainingCurve
from tests.fixtures.offline.support import tiny_dataset
from tests.fixtures.pipeline import support

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TOTAL = 250


def lines(iteration: int, loss: float) -> str:
    values = {"train:loss": loss, "train:lr": 0.02, "train:iter_seconds": 0.5, "train:images_per_second": 8.0}
    return "".join(f"[algo-1] {metrics.format_metric_line(n, v, iteration, TOTAL)}\n" for n, v in values.items())


class _ScriptedTraining:
    """Writes iteration 10's lines, waits to be let on, writes iteration 20's and a half line, waits, fails."""

    def __init__(self) -> None:
        self.go_on = threading.Event()
        self.finish = threading.Event()

    def run_training(self, request: dict[str, Any], channels: dict[str, Path], work_dir: Path,
                     stop: threading.Event) -> JobOutcome:
        log = work_dir / JOB_LOG
        with log.open("a", encoding="utf-8") as f:
            f.write("[algo-1] building the model\n" + lines(10, 1.5))
            f.flush()
            self.go_on.wait(120)
            f.write(lines(20, 0.5) + "[algo-1] d2ops-metric train:loss=9")  # the next line, half written
            f.flush()
            self.finish.wait(120)
        return JobOutcome(failure_reason="AlgorithmError: the scripted job ends here")

    def run_processing(self, request: dict[str, Any], inputs: dict[str, Path], work_dir: Path,
                       stop: threading.Event) -> JobOutcome:
        raise AssertionError("the run fails at training")


def _progress_when(api: Any, run_id: str, ready: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = api.get(f"/runs/{run_id}")
        progress = (run.get("training") or {}).get("progress")
        if progress is not None and ready(progress):
            return run
        assert time.monotonic() < deadline, run.get("training")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineRuntime, _ScriptedTraining]]:
    job = _ScriptedTraining()
    root = tmp_path_factory.mktemp("progress")
    with OfflineRuntime(root / "work", jobs=job) as rt:
        yield rt, job
        job.go_on.set()
        job.finish.set()


def test_the_status_api_and_d2ops_status_follow_a_running_training_job(
        training: tuple[OfflineRuntime, _ScriptedTraining], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: the local SageMaker not publishing while the job runs (progress only after it ended, or
    never), a half-written line published, the status API not reading the run's job, a time left missing
    while it runs or left over after it ended, `d2ops status` not printing the line, an ended job's curve not
    kept in the runtime's S3 (or answered differently from there)."""
    rt, job = training
    dataset = tiny_dataset(tmp_path, "progress", "v1", images=10)
    finished: list[RunSummary] = []
    runner = threading.Thread(target=lambda: finished.append(run_pipeline(rt, dataset, out=lambda _: None,
                                                                          timeout=300)), daemon=True)
    runner.start()
    api = offline_status_api(rt.status_api.url)
    deadline = time.monotonic() + 120
    while not (running := [r for r in api.get("/runs")["runs"] if r["status"] == "RUNNING"]):
        assert time.monotonic() < deadline and runner.is_alive(), finished
        time.sleep(0.5)
    run_id = running[0]["run_id"]

    run = _progress_when(api, run_id, lambda p: p["iteration"] == 10)
    assert run["status"] == "RUNNING" and run["current_state"] == "Train model"
    progress = run["training"]["progress"]
    assert (progress["total_iterations"], progress["loss"], progress["learning_rate"]) == (TOTAL, 1.5, 0.02)
    assert progress["seconds_left"] == pytest.approx((TOTAL - 10) * 0.5)
    assert [(p["iteration"], p["loss"]) for p in progress["loss_series"]] == [(10, 1.5)]

    job.go_on.set()  # iteration 20 and half a line
    run = _progress_when(api, run_id, lambda p: p["iteration"] == 20)
    progress = run["training"]["progress"]
    assert progress["seconds_left"] == pytest.approx((TOTAL - 20) * 0.5)
    assert progress["loss_series"][-1]["iteration"] == 20
    # both iterations within a minute or across a minute's boundary: 1.0 is their mean, 0.5 the newest alone
    assert progress["loss"] in (pytest.approx(1.0), pytest.approx(0.5))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    out = subprocess.run([sys.executable, "-m", "d2ops", "status", run_id, "--work-dir", str(rt.work_dir)],
                         capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    shown = [line.strip() for line in out.splitlines() if "progress: " in line]
    assert len(shown) == 1, out  # 230 iterations left at 0.5 s: 1:55
    assert re.fullmatch(r"progress: iter 20/250 \(8%\)  loss (1\.000|0\.500)  8\.00 img/s  ~1:55 left  lr 0\.02  "
                        r"\(as of \S+\)", shown[0]), shown[0]

    job.finish.set()  # the job fails; its half line was published at its end, as SageMaker reads the whole log
    runner.join(120)
    assert finished and finished[0].status == "FAILED" and finished[0].error == "TrainingFailed", finished
    ended = api.get(f"/runs/{run_id}")["training"]
    assert ended["status"] == "Failed" and ended["progress"]["seconds_left"] is None
    assert ended["progress"]["iteration"] == 20

    # Once the ended job's values have settled, the next answer keeps its curve in the runtime's S3 (the
    # status API's own clients, as deployed) and later ones answer the same curve from there.
    support.function_path("status_api")
    from status_api import curve_store

    s3, bucket, key = rt.client("s3"), rt.stack.artifacts_bucket, s3_layout.training_curve_key(run_id)
    assert s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) == 0  # just ended: not yet
    monkeypatch.setattr(curve_store, "SETTLE_SECONDS", 0)
    assert api.get(f"/runs/{run_id}")["training"] == ended
    stored = TrainingCurve.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert stored.job_status == "Failed" and stored.progress is not None and stored.progress.iteration == 20
    assert api.get(f"/runs/{run_id}")["training"] == ended
