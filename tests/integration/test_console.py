"""``d2ops console`` in a real headless Chromium against the offline stack (a run rejected at validation).

The rejected run costs seconds and exercises the page's run list, the graph, the validation
report and the places a run that never trained says so; the whole journey (evaluation plots,
endpoint history, the image box) runs on the end-to-end pipeline's trained run in
tests/e2e/test_offline_pipeline.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.commands.console import Console, invoke_with
from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import RunSummary, run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from tests.fixtures.console import browser_page, screenshot
from tests.fixtures.offline.support import break_dataset, tiny_dataset

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, OfflineRuntime, RunSummary]]:
    root = tmp_path_factory.mktemp("console")
    dataset = tiny_dataset(root, "broken", "v1", images=10)
    break_dataset(dataset)
    with OfflineRuntime(root / "work") as rt:
        summary = run_pipeline(rt, dataset, out=lambda line: None, timeout=120)
        assert summary.status == "FAILED"
        with Console(offline_status_api(rt.status_api.url), invoke_with(rt.client("sagemaker-runtime"))) as server:
            yield server, rt, summary


def _request(url: str, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_page_lists_the_run_and_opens_it_with_graph_and_validation(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    server, rt, summary = console
    with browser_page() as page:
        page.goto(server.url)
        row = page.locator(f'tr.run[data-run="{summary.run_id}"]')
        row.wait_for(timeout=30_000)
        assert row.locator("td").nth(3).inner_text() == "FAILED"
        assert row.locator("td").nth(1).inner_text() == "broken"
        row.locator("td.gate[data-loaded]").wait_for(timeout=30_000)  # filled from the run's detail
        assert row.locator("td").nth(6).inner_text() == "-"  # rejected before the gate
        screenshot(page, "rejected-run-list")

        row.locator("a").click()
        page.locator("#stages li.stage").first.wait_for(timeout=30_000)
        page.locator("#validation-codes").wait_for(timeout=30_000)
        graph = offline_status_api(rt.status_api.url).get(f"/runs/{summary.run_id}/graph")
        # The stages on top, in the pipeline's order, each with the run's outcome in it (issue 23: the page drew
        # every state of the definition, some 3,000 px of boxes, before)
        stages = page.locator("#stages li.stage")
        assert [stages.nth(i).get_attribute("data-stage") for i in range(stages.count())] == [
            s["key"] for s in graph["stages"]] == ["validate", "prepare", "train", "evaluate", "gate", "deploy",
                                                   "notify", "failure"]
        status = {k: page.locator(f'li.stage[data-stage="{k}"]').get_attribute("data-status")
                  for k in ("validate", "train", "failure")}
        # the run left Validate for its failure path (the dataset rejected): that is where it failed
        assert status == {"validate": "failed", "train": "not reached", "failure": "failed"}
        # the states the run went through, and only those, are open; the run went from validate to its failure path
        lines = page.locator("#stages li.line")
        assert lines.count() == sum(len(s["lines"]) for s in graph["stages"]) < 16
        rejected = page.locator('li.line[data-name="Dataset rejected"]')
        assert rejected.is_visible() and rejected.get_attribute("data-status") == "failed"
        assert "Report failure" in page.locator('li.stage[data-stage="validate"] .stage-away').inner_text()
        detail = page.locator('li.line[data-name="Validate dataset"] .line-detail').inner_text()
        assert re.fullmatch(r"succeeded · ([0-9.]+s|\d+m \d\ds)", detail), detail  # outcome and duration
        # a stage the run never reached is folded, and opens to name its states
        train = page.locator('li.stage[data-stage="train"]')
        assert not train.locator("li.state", has_text="Train model").is_visible()
        train.locator("summary").first.click()
        folded = train.locator("details.folded")
        assert folded.locator("summary").inner_text() == f"+{len(graph['stages'][2]['folded'])} not reached"
        folded.locator("summary").click()
        assert train.locator("li.state", has_text="Train model").is_visible()
        # the failure stage's unreached states (the other Fail states) stay folded
        assert not page.locator('li.stage[data-stage="failure"] li.state', has_text="Training failed").is_visible()
        assert page.locator("#graph").bounding_box()["height"] < 900
        codes = page.locator("#validation-codes tbody tr td:first-child").all_inner_texts()
        assert "BBOX_OUTSIDE_IMAGE" in codes
        assert page.locator("table.class-stats tbody tr").count() >= 3  # per-class rows of each split
        assert "did not reach the quality gate" in page.locator("#gate").inner_text()
        assert "no evaluation report" in page.locator("#evaluation").inner_text()
        assert "no data diff" in page.locator("#data-diff").inner_text()  # rejected before preparing training
        screenshot(page, "rejected-run")
        assert page.problems == []


def test_a_busy_status_api_is_asked_again_before_the_page_gives_up(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    server, _, summary = console
    answers: dict[str, list[int]] = {"validation": [], "graph": []}

    def flaky(route: Any) -> None:  # the validation report: 503 once, then the real answer
        answers["validation"].append(503 if not answers["validation"] else 200)
        if answers["validation"][-1] == 503:
            route.fulfill(status=503, content_type="application/json", body='{"message": "busy"}')
        else:
            route.continue_()

    def down(route: Any) -> None:  # the graph: 502 every time
        answers["graph"].append(502)
        route.fulfill(status=502, content_type="application/json", body='{"message": "bad gateway"}')

    with browser_page() as page:
        page.route("**/api/runs/*/validation", flaky)
        page.route("**/api/runs/*/graph", down)
        page.goto(f"{server.url}#run={summary.run_id}")
        page.locator("#validation-codes").wait_for(timeout=30_000)
        page.locator("#graph", has_text="bad gateway").wait_for(timeout=30_000)
    assert answers == {"validation": [503, 200], "graph": [502, 502, 502]}  # asked three times, then said so


def test_the_run_shows_what_changed_in_the_data_since_the_champion(
        console: tuple[Console, OfflineRuntime, RunSummary], tmp_path: Path) -> None:
    """The panel draws the run detail's dataset_diff: here a real diff of two versions with known changes,
    put into the real answer (the rejected run never prepared training, so it has none of its own)."""
    from d2ops_core.dataset_diff import compare, directory_reader, index_version
    from d2ops_core.documents.dataset_diff import DatasetDiffSummary
    from tests.unit.test_dataset_diff import VERSION_A, VERSION_B, write_version

    def index(root: Path) -> Any:
        read, fingerprints = directory_reader(str(root))
        return index_version(str(root) + "/", "directory", read, fingerprints)

    diff = compare(index(write_version(tmp_path / "a", VERSION_A, version="v1")),
                   index(write_version(tmp_path / "b", VERSION_B, version="v2")))
    summary = DatasetDiffSummary.of(diff, uri="s3://artifacts/runs/r/dataset-diff.json", champion_run_id="pets_v1_c")
    server, _, run = console

    def with_diff(answer: dict[str, Any]) -> Any:
        def handle(route: Any) -> None:
            response = route.fetch()
            route.fulfill(response=response, json={**response.json(), "dataset_diff": answer})
        return handle

    with browser_page() as page:
        page.route(f"**/api/runs/{run.run_id}", with_diff(summary.model_dump(mode="json")))
        page.goto(f"{server.url}#run={run.run_id}")
        page.locator("#data-diff-facts").wait_for(timeout=30_000)
        facts = dict(zip(page.locator("#data-diff-facts dt").all_inner_texts(),
                         page.locator("#data-diff-facts dd").all_inner_texts(), strict=True))
        assert facts["against"] == "pets/v1 (run pets_v1_c)" and facts["images"] == "7 → 6"
        assert (facts["added"], facts["removed"], facts["renamed"], facts["moved train↔val"]) == ("1", "2", "1", "1")
        assert facts["instances"] == "+1" and facts["new classes"] == "bird" and facts["vanished classes"] == "cow"
        assert facts["full diff"] == "s3://artifacts/runs/r/dataset-diff.json"
        rows = page.locator("#data-diff-classes tbody tr")
        assert rows.nth(0).locator("td").all_inner_texts() == ["bird", "0", "3", "+3"]
        assert page.problems == []
    with browser_page() as page:  # the diff could not be computed: the panel says why
        page.route(f"**/api/runs/{run.run_id}", with_diff({"error": "DiffTimeout: the diff ran past its time budget"}))
        page.goto(f"{server.url}#run={run.run_id}")
        page.locator("#data-diff-error").wait_for(timeout=30_000)
        assert page.locator("#data-diff-error").inner_text() == (
            "not computed: DiffTimeout: the diff ran past its time budget")


def _mocked_state_output(case: str, state: str, tmp_path: Path) -> dict[str, Any]:
    """A state's output in a mocked run of the definition (tests/fixtures/pipeline), run in a process of its
    own: its real notification handlers run under moto's in-process mock, whose start and stop reset the
    moto backends this module's offline runtime keeps its buckets in."""
    out = tmp_path / "state-output.json"
    code = ("import json, sys; from pathlib import Path; from tests.fixtures.pipeline import support; "
            "Path(sys.argv[3]).write_text(json.dumps(support.state_output(support.run_case(sys.argv[1]), "
            "sys.argv[2])))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    subprocess.run([sys.executable, "-c", code, case, state, str(out)], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=120)
    return json.loads(out.read_text())


def test_the_gate_shows_the_interval_it_judged_and_the_val_images_it_would_need(
        console: tuple[Console, OfflineRuntime, RunSummary], tmp_path: Path) -> None:
    """The Gate panel draws the run's $.gate and $.evaluation as the definition makes them from the summarize
    Lambda's answer (the mocked per-class refusal; the rejected run never reached the gate)."""
    decided = _mocked_state_output("GateFailedClassRegression", "Register model version", tmp_path)
    server, _, run = console

    def with_gate(route: Any) -> None:
        response = route.fetch()
        route.fulfill(response=response, json={**response.json(), "gate": decided["gate"],
                                               "evaluation": decided["evaluation"]})

    with browser_page() as page:
        page.route(f"**/api/runs/{run.run_id}", with_gate)
        page.goto(f"{server.url}#run={run.run_id}")
        page.locator("#gate-facts").wait_for(timeout=30_000)
        facts = dict(zip(page.locator("#gate-facts dt").all_inner_texts(),
                         page.locator("#gate-facts dd").all_inner_texts(), strict=True))
        assert facts["difference"] == "0.0400" and facts["interval"] == "[-0.0200, 0.1000] (95%, 1000 resamples)"
        assert facts["more val images"] == "about 1400 more (40 now) would narrow the interval to ±0.01"
        assert "champion floor" not in facts  # the point-estimate floor no longer decides
        row = page.locator("#gate-classes tbody tr").first.locator("td").all_inner_texts()
        assert row == ["disc", "0.4100", "0.6000", "-0.1900", "[-0.2900, -0.1100] (97.5%)", "41"]
        assert "97.5% interval [-0.290, -0.110]" in page.locator("#gate").inner_text()  # the reason, whole
        assert page.problems == []


def test_the_evaluation_shows_the_error_analysis_of_both_models(
        console: tuple[Console, OfflineRuntime, RunSummary], tmp_path: Path) -> None:
    """The Errors panel draws the evaluation answer's errors: a real errors.json of two models (the
    known-answer report of tests/unit/test_error_analysis.py), put into the answer the status API's own
    model (EvaluationView) makes; the rejected run has no evaluation of its own."""
    from d2ops_core.documents.error_analysis import ErrorAnalysis
    from tests.fixtures.pipeline import support
    from tests.unit.test_error_analysis import sample_report

    support.function_path("status_api")
    from status_api.models import EvaluationView

    errors = ErrorAnalysis.model_validate_json((sample_report(tmp_path).parent / "errors.json").read_text())
    answer = EvaluationView.model_validate(
        {"report_uri": "s3://artifacts/runs/r/evaluation/evaluation.json", "primary_metric": "bbox_AP",
         "val_images": 2, "challenger": {"metrics": {"bbox_AP": 0.6}}, "champion": {"metrics": {"bbox_AP": 0.5}},
         "errors": errors}).model_dump(mode="json")
    server, _, run = console
    with browser_page() as page:
        page.route(f"**/api/runs/{run.run_id}/evaluation",
                   lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(answer)))
        page.goto(f"{server.url}#run={run.run_id}")
        page.locator("#error-gallery figure.worst img").first.wait_for(timeout=30_000)
        for who, model in errors.models.items():
            matrix = page.locator(f'table.confusion[data-model="{who}"]')
            labels = matrix.locator("thead th[scope=col]").all_inner_texts()
            rows = matrix.locator("tbody th[scope=row]").all_inner_texts()
            assert labels == rows == model.confusion.labels == ["cat", "dog", "background"]
            cells = [[int(t) for t in matrix.locator("tbody tr").nth(i).locator("td").all_inner_texts()]
                     for i in range(len(rows))]
            assert cells == model.confusion.counts, who  # rows true, columns predicted, as the document
        challenger = page.locator('table.confusion[data-model="challenger"]')
        # the dog taken for a cat is in the dog's row, the cat's column; false positives in the background row
        assert challenger.locator('td[data-true="dog"][data-predicted="cat"]').inner_text() == "1"
        assert challenger.locator('td[data-true="cat"][data-predicted="dog"]').inner_text() == "0"
        assert challenger.locator('td[data-true="background"]').all_inner_texts() == ["1", "1", "0"]
        assert challenger.locator('td[data-predicted="background"]').all_inner_texts() == ["1", "0", "0"]

        sizes = page.locator("#ap-by-size tbody tr").first.locator("td").all_inner_texts()
        expected = [v for m in errors.models.values()
                    for v in (m.ap_by_size["bbox"].small, m.ap_by_size["bbox"].medium, m.ap_by_size["bbox"].large)]
        assert sizes[0] == "all classes"
        assert sizes[1:] == ["-" if v is None else f"{v:.3f}" for v in expected]

        figures = page.locator("#error-gallery figure.worst")
        assert figures.count() == len(errors.gallery) == 1
        shown = figures.first.locator(".worst-model")
        assert [shown.nth(i).get_attribute("data-model") for i in range(shown.count())] == ["challenger", "champion"]
        for i, who in enumerate(("challenger", "champion")):
            img = shown.nth(i).locator("img")
            assert img.get_attribute("src") == errors.gallery[0].thumbnails[who]
            assert img.evaluate("i => i.complete && i.naturalWidth") > 0  # the drawn picture decoded and shown
        assert "challenger: 1 missed, 2 false positive(s), 1 confused" in shown.nth(0).inner_text()
        assert "champion: 2 missed, 0 false positive(s), 0 confused" in shown.nth(1).inner_text()
        assert page.locator("#error-legend span").count() == len(errors.legend)
        screenshot(page, "error-analysis")
        assert page.problems == []


def test_the_status_api_answers_the_console_routes_with_4xx_for_what_is_not_there(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    _, rt, summary = console
    api = offline_status_api(rt.status_api.url)
    status, data, _ = api.request("GET", f"/runs/{summary.run_id}/evaluation")
    assert status == 404 and "no evaluation report" in json.loads(data)["message"]
    status, data, _ = api.request("GET", "/runs/no_such_run/graph")
    assert status == 404 and "no run 'no_such_run'" in json.loads(data)["message"]
    assert api.request("GET", "/runs/bad%20id/validation")[0] == 404
    status, data, _ = api.request("GET", f"/endpoints/{rt.stack.endpoint_name}/history")
    assert status == 404 and "no recorded deployments" in json.loads(data)["message"]
    status, data, _ = api.request("GET", "/endpoints/-bad-/history")
    assert status == 404 and "endpoint" in json.loads(data)["message"]
    report = api.get(f"/runs/{summary.run_id}/validation")
    assert report["valid"] is False and report["issue_counts"]["BBOX_OUTSIDE_IMAGE"] >= 1


def test_the_console_server_refuses_what_it_does_not_serve(console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    server, rt, _ = console
    base = server.url.rstrip("/")
    assert _request(f"{base}/api/nowhere")[0] == 404
    assert _request(f"{base}/../etc/passwd")[0] == 404
    status, answer = _request(f"{base}/api/runs/no_such_run")
    assert (status, answer["message"]) == (404, "no run 'no_such_run'")
    # A page on another origin cannot post images through the console, nor reach it by a rebound name.
    invoke = f"{base}/api/endpoints/{rt.stack.endpoint_name}/invocations"
    assert _request(invoke, "POST", b"\x89PNG", {"Content-Type": "image/png"})[0] == 403
    assert _request(f"{base}/api/runs", headers={"Host": "evil.example:80"})[0] == 403
    console_headers = {"X-D2ops-Console": "1"}
    status, answer = _request(invoke, "POST", b"hello", {**console_headers, "Content-Type": "text/plain"})
    assert status == 415 and "send an image" in answer["message"]
    status, answer = _request(invoke, "POST", b"\x89PNG", {**console_headers, "Content-Type": "image/png",
                                                            "X-Score-Threshold": "2"})
    assert status == 400 and "X-Score-Threshold" in answer["message"]
    status, answer = _request(invoke, "POST", b"\x89PNG", {**console_headers, "Content-Type": "image/png"})
    assert status == 404 and rt.stack.endpoint_name in answer["message"]  # no endpoint before a deployment


def test_the_command_serves_the_running_runtime_and_reaches_its_endpoint_through_the_gateway(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    _, rt, summary = console
    # PYTHONFAULTHANDLER: a process that does not stop is asked (SIGABRT) where each of its threads is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "PYTHONFAULTHANDLER": "1"}
    # While this runtime holds the work dir, the command reads its status API (runtime.json).
    # Ctrl-C as a terminal sends it: SIGINT at its default, Python's KeyboardInterrupt, even where this test runs
    # with SIGINT ignored (started in the background by a shell without job control, which a child inherits).
    ctrl_c_default = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "runpy.run_module('d2ops', run_name='__main__', alter_sys=True)")
    process = subprocess.Popen([sys.executable, "-c", ctrl_c_default, "console", "--work-dir", str(rt.work_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.match(r"d2ops console: (http://127\.0\.0\.1:\d+/) ", line)
        assert found, line
        status, listing = _request(found[1] + "api/runs")
        assert status == 200 and [r["run_id"] for r in listing["runs"]] == [summary.run_id]
        status, answer = _request(f"{found[1]}api/endpoints/{rt.stack.endpoint_name}/invocations", "POST", b"\x89PNG",
                                  {"X-D2ops-Console": "1", "Content-Type": "image/png"})
        assert status == 404 and rt.stack.endpoint_name in answer["message"]  # asked the gateway: not deployed
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    os.killpg(process.pid, signal.SIGINT)
    # communicate() drains both pipes: a process blocked writing to a full, unread stderr never exits
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGABRT)
        _, err = process.communicate()
        raise AssertionError(f"d2ops console did not stop on Ctrl-C in 60 s; its threads: {err[-8000:]}") from None
    assert process.returncode == 0, err[-4000:]


def test_a_truncated_evaluation_names_what_it_left_out_and_links_the_whole_documents(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    """An answer the status API cut to stay under Lambda's 6 MB (status_api.response_budget), in the API's own
    model. Catches: a cut the page does not say, the links not offered, a link that is not http(s) followed."""
    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    from status_api.models import EvaluationView

    links = [{"name": "evaluation", "uri": "s3://artifacts/runs/r/evaluation/evaluation.json",
              "url": "https://artifacts.s3.amazonaws.com/runs/r/evaluation/evaluation.json?X-Amz-Signature=abc",
              "expires_at": "2026-11-29T05:00:00+00:00"},
             {"name": "pr_curves", "uri": "s3://artifacts/runs/r/evaluation/report/pr_curves.json",
              "url": "javascript:alert(1)", "expires_at": "2026-11-29T05:00:00+00:00"}]
    answer = EvaluationView.model_validate(
        {"report_uri": "s3://artifacts/runs/r/evaluation/evaluation.json", "primary_metric": "bbox_AP",
         "val_images": 2, "challenger": {"metrics": {"bbox_AP": 0.6}}, "truncated": True,
         "left_out": ["errors.gallery.thumbnails", "pr_curves"], "full_report": links}).model_dump(mode="json")
    server, _, run = console
    with browser_page() as page:
        page.route(f"**/api/runs/{run.run_id}/evaluation",
                   lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(answer)))
        page.goto(f"{server.url}#run={run.run_id}")
        note = page.locator("#evaluation-truncated")
        note.wait_for(timeout=30_000)
        assert "left out: errors.gallery.thumbnails, pr_curves" in note.inner_text()
        anchors = note.locator("a")
        assert anchors.count() == 1 and anchors.first.inner_text() == "evaluation"
        assert anchors.first.get_attribute("href") == links[0]["url"]
        assert page.problems == []


def test_the_loss_curve_grows_while_the_run_trains_and_polling_stops_when_it_ends(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    """The Training panel draws training.progress and asks again while the run runs. The run's real answer,
    turned into a run in "Train model" whose job published 3, then 5 periods (shaped by the status API's own
    TrainingProgress model), then one that ended.

    Catches: a curve drawn once and never refreshed, points dropped or out of order, a curve not scaled to
    the run's iterations, time left not shown, a page that keeps asking after the run ended."""
    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    from status_api.models import TrainingProgress

    server, _, run = console
    losses = [2.0, 1.4, 1.1, 0.9, 0.8]

    def progress(periods: int) -> dict[str, Any]:
        return TrainingProgress(
            iteration=periods * 24, total_iterations=250, fraction=periods * 24 / 250, loss=losses[periods - 1],
            learning_rate=0.02, images_per_second=13.8, seconds_per_iteration=0.29,
            seconds_left=(250 - periods * 24) * 0.29, updated_at=f"2026-11-26T23:0{periods}:00+00:00",
            period_seconds=60, loss_series=[{"iteration": (i + 1) * 24, "loss": loss}
                                            for i, loss in enumerate(losses[:periods])]).model_dump(mode="json")

    asked: list[int] = []

    def training(route: Any) -> None:
        asked.append(len(asked))
        answer = route.fetch().json()
        if len(asked) <= 3:  # the first answer, then two polls: 3 periods, then 5
            job = {"job_name": "broken-v1-train", "status": "InProgress", "metrics": {},
                   "progress": progress(3 if len(asked) == 1 else 5)}
            answer.update(status="RUNNING", stopped_at=None, error=None, cause=None, current_state="Train model",
                          training=job)
        route.fulfill(json=answer)

    with browser_page() as page:
        page.goto(f"{server.url}#run={run.run_id}")  # the real rejected run: it never trained
        page.locator("#training p.muted").wait_for(timeout=30_000)
        assert page.locator("#training").inner_text() == "no training job (the run did not reach training)"

        page.route(f"**/api/runs/{run.run_id}", training)
        page.reload()  # the view opens again, its answers now routed
        page.locator('#loss-curve[data-points="3"]').wait_for(timeout=30_000)
        line = page.locator("#training-progress").inner_text()
        assert line == ("iter 72/250 (28%) · loss 1.100 · lr 0.0200 · 13.8 img/s · ~51.6 s left · "
                        "as of 2026-11-26T23:03:00+00:00"), line
        page.locator('#loss-curve[data-points="5"]').wait_for(timeout=30_000)  # the next poll, redrawn
        points = [tuple(map(float, p.split(","))) for p in
                  (page.locator("#loss-curve polyline.loss").get_attribute("points") or "").split()]
        assert len(points) == 5
        xs, ys = [x for x, _ in points], [y for _, y in points]
        assert xs == sorted(xs) and ys == sorted(ys)  # later iterations to the right; a falling loss lower
        frame = page.locator("#loss-curve rect").first
        right = float(frame.get_attribute("x") or 0) + float(frame.get_attribute("width") or 0)
        assert xs[-1] < right * 0.6  # iteration 120 of 250: the curve is less than half way across
        screenshot(page, "training-loss-curve")
        # The run ended (the next answer is the real one, FAILED): the view is drawn once more, then quiet.
        page.locator("#training p.muted").wait_for(timeout=30_000)
        page.wait_for_timeout(1_000)  # the view's one redraw asks once more
        settled = len(asked)
        page.wait_for_timeout(6_500)  # longer than a poll interval
        assert len(asked) == settled
        assert page.problems == []


def _with_review(rt: OfflineRuntime, run_id: str, evaluation: dict[str, Any]) -> Any:
    """The run's real answer as a run the gate sent to review: its evaluation says so, and its review is what the
    status API's own view (status_api.review.review_view) reads from the real review records in the runtime's S3."""
    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    from status_api.review import review_view

    def handle(route: Any) -> None:
        response = route.fetch()
        view = review_view(rt.client("s3"), rt.stack.artifacts_bucket, run_id, {"evaluation": evaluation}, "RUNNING")
        route.fulfill(response=response, json={**response.json(), "evaluation": evaluation,
                                               "review": view.model_dump(mode="json") if view else None})
    return handle


REVIEW_VERDICT = {"decision": "review", "review_because": ["uncertain"], "images_compared": 40, "images_excluded": 3,
                  "primary_metric": "bbox_AP", "challenger_value": 0.61, "has_champion": True, "champion_value": 0.63}


def test_a_run_waiting_for_review_is_approved_or_rejected_from_the_page(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    """The Review panel of a run waiting on a real task token (tests/fixtures/offline/review.py): why the gate
    asked, the images compared, the Approve / Reject pair; Reject without a reason asks for one and sends
    nothing; with one, the page's server posts to the status API's decision route, the wait completes with
    the decision, and the view shows who rejected it and why.

    Catches: buttons that post nowhere, a rejection sent without a reason, a view that does not show the
    decision afterwards, a decision the run never received."""
    from d2ops.offline.status_api_server import reviewer_session
    from tests.fixtures.offline.review import GATE_REASON, finished, waiting_run

    server, rt, run = console
    waiting = waiting_run(rt, run.run_id)
    posts: list[str] = []
    with browser_page() as page:
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        page.route(f"**/api/runs/{run.run_id}", _with_review(rt, run.run_id, REVIEW_VERDICT))
        page.goto(f"{server.url}#run={run.run_id}")
        page.locator('#review-status[data-status="waiting"]').wait_for(timeout=30_000)
        facts = dict(zip(page.locator("#review-facts dt").all_inner_texts(),
                         page.locator("#review-facts dd").all_inner_texts(), strict=True))
        assert facts["why"] == GATE_REASON and facts["because"] == "uncertain"
        assert facts["images compared"] == "40 held-out val images (3 left out: a model trained on them)"
        assert facts["refused unless decided by"] == waiting.request.expires_at.isoformat().replace("+00:00", "Z")
        screenshot(page, "review-waiting")

        page.locator("#review-reject").click()  # no reason yet
        assert "a rejection needs a reason" in page.locator("#review-message").inner_text()
        assert posts == [] and rt.client("stepfunctions").describe_execution(
            executionArn=waiting.execution_arn)["status"] == "RUNNING"

        page.locator("#review-reason").fill("the rare class 'disc' drops 19 points")
        page.locator("#review-reject").click()
        page.locator('#review-status[data-status="rejected"]').wait_for(timeout=30_000)
        who = reviewer_session(rt.stack, rt.credentials.access_key).user_arn
        facts = dict(zip(page.locator("#review-facts dt").all_inner_texts(),
                         page.locator("#review-facts dd").all_inner_texts(), strict=True))
        assert (facts["decided by"], facts["reason"]) == (who, "the rare class 'disc' drops 19 points")
        assert not page.locator("#review-form").count()  # decided: no buttons any more
        assert page.locator("#message").inner_text() == (
            f"run {run.run_id} rejected by {who}: the rare class 'disc' drops 19 points")
        screenshot(page, "review-decided")
        assert posts == [f"{server.url}api/runs/{run.run_id}/decision"]
        assert page.problems == []
    output = json.loads(finished(rt, waiting.execution_arn)["output"])["review"]  # the run received it
    assert (output["decision"], output["decided_by"]) == ("rejected", who)


def test_a_caller_who_may_not_decide_sees_the_status_api_s_refusal(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    from d2ops.offline.runtime import new_credentials
    from d2ops.offline.stack import ACCOUNT_ID
    from tests.fixtures.offline.review import waiting_run

    _, rt, run = console
    run_id = run.run_id.replace("_", "-", 1)[:70] + "-x"  # a run id of its own: the fixture's run was decided above
    waiting = waiting_run(rt, run_id)
    mallory = new_credentials()
    rt.status_api.add_caller(mallory, f"arn:aws:iam::{ACCOUNT_ID}:user/mallory")
    with Console(offline_status_api(rt.status_api.url, mallory), invoke_with(rt.client("sagemaker-runtime"))) as own, \
            browser_page() as page:
        page.route(f"**/api/runs/{run.run_id}", _with_review(rt, run_id, REVIEW_VERDICT))
        page.goto(f"{own.url}#run={run.run_id}")
        page.locator('#review-status[data-status="waiting"]').wait_for(timeout=30_000)
        page.route(f"**/api/runs/{run.run_id}/decision",  # her decision goes to the waiting run's route
                   lambda route: route.continue_(url=route.request.url.replace(run.run_id, run_id)))
        page.locator("#review-approve").click()
        page.locator("#review-message.error").wait_for(timeout=30_000)
        message = page.locator("#review-message").inner_text()
        assert message.startswith("not decided: only the stack's reviewer role") and "user/mallory" in message
        assert page.locator("#review-approve").is_enabled()  # nothing decided: she may still ask someone else
    assert rt.client("stepfunctions").describe_execution(executionArn=waiting.execution_arn)["status"] == "RUNNING"
    rt.client("stepfunctions").stop_execution(executionArn=waiting.execution_arn)


def test_the_console_server_passes_decisions_on_and_refuses_what_is_not_one(
        console: tuple[Console, OfflineRuntime, RunSummary]) -> None:
    server, _, _ = console
    base = server.url.rstrip("/")
    decision = f"{base}/api/runs/shapes_v9_nothingwaits/decision"
    headers = {"X-D2ops-Console": "1", "Content-Type": "application/json"}
    assert _request(decision, "POST", b'{"decision": "approve"}', {"Content-Type": "application/json"})[0] == 403
    status, answer = _request(decision, "POST", b'{"decision": "approve"}', headers)
    assert status == 404 and "is not waiting for a review" in answer["message"]  # the status API's own answer
    status, answer = _request(decision, "POST", b'{"decision": "reject"}', headers)
    assert status == 400 and "a rejection needs a reason" in answer["message"]
    assert _request(decision, "POST", b"{not json", headers)[0] == 400
    assert _request(decision, "POST", b'{"decision": "approve"}', {**headers, "Content-Type": "text/plain"})[0] == 415
    assert _request(decision, "POST", b"x" * 20_000, headers)[0] == 413
    assert _request(f"{base}/api/runs/bad%20id/decision", "POST", b"{}", headers)[0] == 404
