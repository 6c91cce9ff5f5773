"""The offline pipeline end to end: real training, evaluation, registry, TorchServe endpoint.

Tiny datasets and a few iterations keep this bounded (the demo's quality belongs to `make
demo`). The operator's stack sets MinMap 0 for these few-iteration trainings; a manifest may
only tighten it, so one run passes, one asks for a higher bar and fails, and one that asks for
a laxer gate is rejected before anything trains.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from d2ops.commands.console import Console, invoke_with
from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from d2ops.offline.stack import cpu_training_profile
from d2ops_core import cost
from d2ops_core.documents.detections import InvocationResponse
from model_code import artifact
from tests.fixtures.console import browser_page, screenshot
from tests.fixtures.d2export import support
from tests.fixtures.offline.support import tiny_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

TRAINING = {"model": "fasterrcnn_resnet18_fpn", "max_iter": 6, "ims_per_batch": 2, "seed": 0}
SUCCESS_STATES = ["Validate dataset", "Prepare training job", "Train model", "Evaluate challenger and champion",
                  "Read evaluation report", "Quality gate", "Quality gate passed", "Register model version",
                  "Create model", "Create endpoint config", "Find current endpoint", "Create endpoint",
                  "Wait for endpoint", "Check endpoint status", "Smoke test endpoint", "Record champion",
                  "Promote to champion", "Compose success notification", "Notify success", "Run succeeded"]
ENDPOINT_STATES = {"Create model", "Create endpoint config", "Find current endpoint", "Create endpoint",
                   "Update endpoint (blue/green)", "Smoke test endpoint"}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    with OfflineRuntime(tmp_path_factory.mktemp("e2e") / "work", parameters={"MinMap": "0"},
                        training_defaults=cpu_training_profile(64)) as rt:
        yield rt


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


# The endpoint's answer against the artifact's own module in this process: the same model on the same pixels,
# but another process and maybe another CPU kernel path (thread counts differ), so not bit for bit. Boxes
# within 0.1 px and scores within 5e-4 (the JSON rounds them to 0.01 px and 1e-4); a detection may be on
# one side only within 1e-3 of the model's score cut, where such a difference can move it across.
SERVED_ARTIFACT = support.Tolerance(box_px=0.1, score=5e-4, mask_iou=0.0, mask_iou_total=0.0, threshold_margin=1e-3)


def model_cut(detector: artifact.LoadedDetector) -> tuple[float, int]:
    """The torchvision detector's own score cut and detection cap (box_score_thresh, box_detections_per_img)."""
    assert detector.metadata.framework == "torchvision", detector.metadata.framework
    heads = detector.module.model.roi_heads
    return float(heads.score_thresh), int(heads.detections_per_img)


def assert_served_by(answer: dict[str, Any], detector: artifact.LoadedDetector, image_path: Path) -> support.Matching:
    """``answer`` (the endpoint's JSON at score_threshold 0) is the response document (docs/serving.md)
    and what ``detector``'s own TorchScript module finds in the image's pixels: the artifact's classes,
    boxes inside the image, scores in [0, 1], best first. Returns how its detections matched the module's."""
    response = InvocationResponse.model_validate(answer)  # scores in [0, 1], boxes x1 <= x2 and y1 <= y2
    # Only the document's fields: readers accept a detection's extra fields (a newer endpoint's), the writer
    # sets none, and a top-level one the model would drop.
    assert [d.model_extra for d in response.detections if d.model_extra] == [], "undeclared detection fields"
    assert response.model_dump(mode="json", exclude_none=True) == answer, "fields beside the response document's"
    with Image.open(image_path) as image:
        rgb = image.convert("RGB")
    width, height = rgb.size
    detections = response.detections
    category_ids = detector.metadata.category_ids
    labels = dict(zip(category_ids, detector.metadata.class_names, strict=True))
    for d in detections:
        assert labels.get(d.class_id) == d.class_name, f"{d.class_id} {d.class_name!r}: not the artifact's {labels}"
        x1, y1, x2, y2 = d.box
        assert 0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height, f"{d.box} is not inside {width}x{height}"
    scores = [d.score for d in detections]
    assert scores == sorted(scores, reverse=True), f"not best first: {scores}"

    # The artifact's own answer for these pixels (its module, RGB uint8 [3, H, W], no serving code), matched
    # detection by detection (class, box, score), not rank by rank: a near-tie may come out in either order.
    with torch.inference_mode():
        raw = detector.module([torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous()])[0]
    expected = support.detections_from_output(raw)
    served = [support.Detection(box=np.array(d.box, dtype=np.float32), score=d.score,
                                label=category_ids.index(d.class_id)) for d in detections]
    cut, cap = model_cut(detector)
    # A list the cap filled was cut at its lowest score too: the next one down may be on the other side.
    threshold = max([cut, *(min(d.score for d in side) for side in (served, expected) if len(side) >= cap)])
    try:
        return support.match(served, expected, SERVED_ARTIFACT, threshold)
    except AssertionError as exc:
        theirs = [(category_ids[d.label], round(d.score, 4), d.box.round(2).tolist()) for d in expected]
        raise AssertionError(f"{image_path.name}: {exc}; served {[(d.class_id, d.score, d.box) for d in detections]}"
                             f", the run's artifact finds {theirs}") from exc


def test_a_tiny_dataset_goes_through_every_state_to_a_served_model(runtime: OfflineRuntime, datasets: Path,
                                                                   tmp_path: Path) -> None:
    dataset = tiny_dataset(datasets, "tiny", "v1", images=16, size=64, training=TRAINING, gate={"min_map": 0.0})
    lines: list[str] = []
    summary = run_pipeline(runtime, dataset, deliveries=5, out=lines.append, timeout=1200)
    assert summary.status == "SUCCEEDED", (summary.error, summary.cause, lines[-10:])
    assert [s for s in SUCCESS_STATES if s not in summary.states_visited] == []
    executions = runtime.client("stepfunctions").list_executions(stateMachineArn=runtime.stack.state_machine_arn)
    assert [e["name"] for e in executions["executions"]] == [summary.run_id]  # five deliveries, one run

    sagemaker = runtime.client("sagemaker")
    job = sagemaker.describe_training_job(TrainingJobName=summary.output["plan"]["names"]["training_job"])
    assert job["TrainingJobStatus"] == "Completed"
    assert {m["MetricName"] for m in job["FinalMetricDataList"]} >= {"train:loss"}
    # While "Train model" waited, the job's progress from its own metric lines, the last where it ended
    entered = next(i for i, line in enumerate(lines) if line.endswith("-> Train model"))
    left = next(i for i, line in enumerate(lines) if " ok Train model (" in line)
    progress = [(i, line) for i, line in enumerate(lines) if "Train model: iter " in line]
    assert progress and all(entered < i < left for i, _ in progress), lines
    last = re.search(r"Train model: iter 6/6 \(100%\)  loss (\S+)  (\S+) img/s$", progress[-1][1])
    final = {m["MetricName"]: m["Value"] for m in job["FinalMetricDataList"]}
    assert last and float(last[1]) == pytest.approx(final["train:loss"], abs=6e-4), progress
    assert float(last[2]) == pytest.approx(final["train:images_per_second"], rel=1e-2, abs=6e-3)
    # What the run cost, from the times SageMaker reports (offline: no spot, billable == training).
    assert 0 < job["BillableTimeInSeconds"] == job["TrainingTimeInSeconds"]
    detail = offline_status_api(runtime.status_api.url).get(f"/runs/{summary.run_id}")
    # The status API's training progress: the job's log through its MetricDefinitions into (moto's) CloudWatch
    # while it ran, read back with GetMetricData, as in the cloud (docs/training.md): a point per 60 s period.
    progress = detail["training"]["progress"]
    assert (progress["iteration"], progress["total_iterations"], progress["fraction"]) == (6, 6, 1.0), progress
    assert progress["seconds_left"] is None and progress["period_seconds"] == 60  # the job has ended
    iterations = [p["iteration"] for p in progress["loss_series"]]
    assert iterations and iterations == sorted(iterations) and iterations[-1] == 6, progress
    assert progress["loss"] > 0 and progress["loss_series"][-1]["loss"] == pytest.approx(progress["loss"])
    run_cost = detail["cost"]
    training = run_cost["training"]
    price = cost.DEFAULT_PRICES.hourly("training", job["ResourceConfig"]["InstanceType"])
    assert price is not None and training["instance_count"] == job["ResourceConfig"]["InstanceCount"]
    instance_hours = job["BillableTimeInSeconds"] * training["instance_count"] / 3600
    assert training["cost_usd"] == pytest.approx(instance_hours * price, abs=1e-6)  # priced to 1e-6 USD
    assert training["spot_savings_usd"] == 0
    assert run_cost["evaluation"]["seconds"] > 0 and run_cost["endpoint"]["seconds"] > 0
    assert run_cost["total_usd"] == pytest.approx(sum(run_cost[p]["cost_usd"] for p in ("training", "evaluation",
                                                                                         "endpoint")), abs=1e-6)
    bucket, _, key = job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("s3://").partition("/")
    assert runtime.client("s3").head_object(Bucket=bucket, Key=key)["ContentLength"] > 1000
    packages = sagemaker.list_model_packages(ModelPackageGroupName=runtime.stack.model_package_group)
    assert [p["ModelApprovalStatus"] for p in packages["ModelPackageSummaryList"]] == ["Approved"]
    endpoint = sagemaker.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    assert endpoint["EndpointStatus"] == "InService"
    champion = json.loads(runtime.client("s3").get_object(Bucket=runtime.stack.artifacts_bucket,
                                                          Key="champion.json")["Body"].read())
    assert champion["run_id"] == summary.run_id

    # What the endpoint answers is this run's artifact (the training job's model data), with its classes:
    # the dataset's categories.
    model_tar = tmp_path / "model.tar.gz"
    runtime.client("s3").download_file(bucket, key, str(model_tar))
    detector = artifact.load_artifact(model_tar)
    categories = json.loads((dataset / "annotations" / "train.json").read_text())["categories"]
    assert set(zip(detector.metadata.category_ids, detector.metadata.class_names, strict=True)) == {
        (c["id"], c["name"]) for c in categories}
    images = sorted(p for p in (dataset / "images").rglob("*") if p.suffix in (".png", ".jpg"))
    smr = runtime.client("sagemaker-runtime")
    found, matchings = [], []
    for image in images:  # a six-iteration model finds something (above its 0.05) in some of them only
        answer = json.loads(smr.invoke_endpoint(EndpointName=runtime.stack.endpoint_name, Body=image.read_bytes(),
                                                ContentType="image/png" if image.suffix == ".png" else "image/jpeg",
                                                CustomAttributes="score_threshold=0;max_detections=1000")
                            ["Body"].read())
        matchings.append(assert_served_by(answer, detector, image))
        found.append(len(answer["detections"]))
    assert max(found) >= 2, f"detections per image {found}: too few for the checks to prove anything"
    support.assert_enough_matched(matchings)  # few go missing near the cut, over all the images together
    with pytest.raises(smr.exceptions.ModelError) as bad:
        smr.invoke_endpoint(EndpointName=runtime.stack.endpoint_name, Body=b"not an image", ContentType="image/png")
    assert 400 <= bad.value.response["OriginalStatusCode"] < 500
    with pytest.raises(smr.exceptions.ValidationError):
        smr.invoke_endpoint(EndpointName="no-such-endpoint", Body=image.read_bytes(), ContentType="image/png")


def test_a_gate_set_too_high_fails_without_touching_the_endpoint(runtime: OfflineRuntime, datasets: Path) -> None:
    sagemaker = runtime.client("sagemaker")
    before = sagemaker.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    dataset = tiny_dataset(datasets, "tiny", "v2", images=16, size=64, seed=1, training=TRAINING,
                           gate={"min_map": 1.0, "resamples": 1200})  # more resamples than the stack's 1000
    lines: list[str] = []
    summary = run_pipeline(runtime, dataset, out=lines.append, timeout=1200)
    assert (summary.status, summary.error) == ("FAILED", "QualityGateFailed"), (summary.cause, lines[-10:])
    assert "Below quality threshold" in summary.states_visited
    assert ENDPOINT_STATES.isdisjoint(summary.states_visited)
    after = sagemaker.describe_endpoint(EndpointName=runtime.stack.endpoint_name)
    assert (after["EndpointConfigName"], after["LastModifiedTime"]) == (before["EndpointConfigName"],
                                                                        before["LastModifiedTime"])
    packages = sagemaker.list_model_packages(ModelPackageGroupName=runtime.stack.model_package_group,
                                             SortBy="CreationTime", SortOrder="Descending")
    assert packages["ModelPackageSummaryList"][0]["ModelApprovalStatus"] == "Rejected"
    assert summary.output["evaluation"]["has_champion"] is True  # evaluated against the first run's model
    # The job compared the two models by the paired bootstrap (GATE_* from the plan's gate) and the gate's
    # reason quotes the interval; the status API serves the report's comparison, the run's summary the same one.
    evaluation = summary.output["evaluation"]
    interval, plan_gate = evaluation["interval"], summary.output["plan"]["gate"]
    assert interval["low"] <= interval["high"] and interval["confidence"] == plan_gate["confidence"] == 0.95
    assert interval["challenger"] == pytest.approx(evaluation["challenger_value"], abs=1e-9)
    # The manifest's resamples reached the local processing job through its Environment (GATE_RESAMPLES).
    assert evaluation["resamples"] == plan_gate["resamples"] == 1200
    assert f"interval [{interval['low']:.3f}" in summary.cause
    report = offline_status_api(runtime.status_api.url).get(f"/runs/{summary.run_id}/evaluation")
    assert report["comparison"]["overall"] == interval and report["comparison"]["val_images"] == report["val_images"]


def test_a_manifest_asking_for_a_laxer_gate_is_rejected_before_training(runtime: OfflineRuntime,
                                                                       datasets: Path) -> None:
    sagemaker = runtime.client("sagemaker")
    jobs_before = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    dataset = tiny_dataset(datasets, "tiny", "v3", images=16, size=64, training=TRAINING,
                           gate={"max_regression": 0.5})  # the stack allows 0.01
    lines: list[str] = []
    summary = run_pipeline(runtime, dataset, out=lines.append, timeout=600)
    assert (summary.status, summary.error) == ("FAILED", "DatasetRejected"), (summary.cause, lines[-10:])
    assert "Train model" not in summary.states_visited
    assert sagemaker.list_training_jobs()["TrainingJobSummaries"] == jobs_before
    first_errors = summary.output["failure"]["first_errors"]  # what the notification and GET /runs/{id} show
    assert [(e["code"], e["location"]) for e in first_errors] == [("GATE_MAX_REGRESSION_ABOVE_STACK",
                                                                   "manifest.json:gate.max_regression")]


def test_the_console_shows_the_runs_their_reports_the_endpoint_history_and_detections(
        runtime: OfflineRuntime, datasets: Path) -> None:
    """`d2ops console` in headless Chromium on this module's three runs (no training of its own)."""
    api = offline_status_api(runtime.status_api.url)
    runs = {r["dataset_version"]: r["run_id"] for r in api.get("/runs")["runs"]}
    deployed, gated = runs["v1"], runs["v2"]
    smr = runtime.client("sagemaker-runtime")
    image = next(p for p in sorted((datasets / "tiny-v1" / "images").rglob("*")) if p.suffix in (".png", ".jpg"))
    expected = json.loads(smr.invoke_endpoint(EndpointName=runtime.stack.endpoint_name, Body=image.read_bytes(),
                                              ContentType="image/png" if image.suffix == ".png" else "image/jpeg",
                                              CustomAttributes="score_threshold=0.0")["Body"].read())["detections"]
    with Console(api, invoke_with(smr)) as server, browser_page() as page:
        page.goto(server.url)
        for run_id in runs.values():
            page.locator(f'tr.run[data-run="{run_id}"] td.gate[data-loaded]').wait_for(timeout=60_000)
        gate = {v: page.locator(f'tr.run[data-run="{r}"] td.gate').inner_text() for v, r in runs.items()}
        assert gate == {"v1": "approved", "v2": "rejected", "v3": "-"}  # v3 was rejected before training
        assert page.locator(f'tr.run[data-run="{deployed}"] td.cost').inner_text().startswith("$")
        screenshot(page, "e2e-run-list")

        page.goto(f"{server.url}#run={deployed}")
        page.locator("#run-title", has_text=deployed).wait_for(timeout=60_000)
        page.locator("#history-served").wait_for(timeout=60_000)
        try:
            page.locator("#pr-curves svg.pr-curve").first.wait_for(timeout=60_000)
        except PlaywrightTimeout as exc:  # say what the page shows instead (an error line, or nothing yet)
            raise AssertionError(f"no PR curves; #evaluation: {page.locator('#evaluation').inner_text()!r}; "
                                 f"problems: {page.problems}") from exc
        graph = api.get(f"/runs/{deployed}/graph")
        # the run by stage: the states it went through (loops as one line), not every state of the definition
        assert page.locator("#stages li.line").count() == sum(len(s["lines"]) for s in graph["stages"]) < 40
        assert [s["status"] for s in graph["stages"]] == ["succeeded"] * 7 + ["not reached"]
        promoted = page.locator('li.line[data-name="Promote to champion"]')
        assert promoted.get_attribute("data-status") == "succeeded"
        # the first deployment's lookup finds no endpoint: the miss the definition expects, not a failure
        assert page.locator('li.line[data-name="Find current endpoint"]').get_attribute("data-status") == "missed"
        waits = page.locator('li.line[data-name="Wait for endpoint"]')  # the wait loop: one line, its rounds
        assert waits.count() == 1
        assert re.fullmatch(r"Wait for endpoint \u00d7\d+", waits.locator(".line-title").inner_text())
        screenshot(page, "e2e-deployed-run")
        report = api.get(f"/runs/{deployed}/evaluation")
        classes = sorted(report["challenger"]["per_class"])
        assert len(classes) == 3 and report["champion"] is None  # the first model has no champion to face
        assert page.locator("#per-class-ap rect.bar.challenger").count() == len(classes)
        assert page.locator("#per-class-ap rect.bar.champion").count() == 0
        assert page.locator("#pr-curves svg.pr-curve").count() == len(classes)
        assert page.locator("#pr-curves polyline.curve.challenger").count() >= 1
        assert page.locator("#gate-decision").inner_text().startswith("approved")
        served = page.locator("#history-served tbody tr")
        assert served.count() == 1 and "serving now" in served.inner_text()
        # the Training panel: the real job's published progress and loss curve (it ended: no time left)
        page.locator("#loss-curve circle.latest").wait_for(timeout=60_000)  # a one-period curve is this dot alone
        progress = api.get(f"/runs/{deployed}")["training"]["progress"]
        assert page.locator("#loss-curve").get_attribute("data-points") == str(len(progress["loss_series"]))
        line = page.locator("#training-progress").inner_text()
        assert line.startswith("iter 6/6 (100%) · loss ") and " left" not in line, line

        page.set_input_files("#try-file", str(image))
        page.fill("#try-threshold", "0")
        page.click("#try-send")
        page.locator("#try-canvas[data-detections]").wait_for(timeout=60_000)
        drawn = int(page.locator("#try-canvas").get_attribute("data-detections") or -1)
        # What the page draws is the endpoint's answer for this image and threshold (a six-iteration model
        # may find nothing; the boxes are then none, and the picture is still shown).
        assert drawn == len(expected) == page.locator("#try-canvas rect.detection").count()
        assert page.locator("#try-detections li").count() == drawn
        assert page.locator("#try-canvas image").count() == 1
        assert page.locator("#try-message").inner_text() == f"{drawn} detection(s)"
        screenshot(page, "e2e-deployed-run")

        page.goto(f"{server.url}#run={gated}")
        page.locator("#run-title", has_text=gated).wait_for(timeout=60_000)
        page.locator("#per-class-ap").wait_for(timeout=60_000)
        assert page.locator("#per-class-ap rect.bar.champion").count() == len(classes)  # beside the champion's
        # the Errors panel: the evaluation job's own error analysis of both models (report/errors.json)
        errors = api.get(f"/runs/{gated}/evaluation")["errors"]
        assert list(errors["models"]) == ["challenger", "champion"]
        for who, model in errors["models"].items():
            matrix = page.locator(f'#errors table.confusion[data-model="{who}"]')
            assert matrix.locator("tbody th[scope=row]").all_inner_texts() == model["confusion"]["labels"]
            assert [int(n) for n in matrix.locator("tbody td").all_inner_texts()] == [
                n for row in model["confusion"]["counts"] for n in row]
        assert page.locator("#error-gallery figure.worst").count() == len(errors["gallery"])
        assert page.locator("#error-gallery img").count() == 2 * len(errors["gallery"])  # both models drawn
        assert page.locator("#gate-decision").inner_text().startswith("rejected")
        assert "this run did not deploy" in page.locator("#deployment").inner_text()
        screenshot(page, "e2e-gated-run")
        assert page.problems == []
