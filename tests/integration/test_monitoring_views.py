"""The monitor's windows where people read them, against the offline stack: the status API over HTTP (signed
like API Gateway's IAM auth), ``d2ops monitor`` in a process of its own, the console's Monitoring panel in a real
headless Chromium.

No pipeline runs: windows and a deployment are written into the offline S3 as the monitor and the state machine
write them (their document models are the contract), so the module costs the runtime's start (a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from d2ops.commands.console import Console, invoke_with
from d2ops.offline.client import offline_status_api
from d2ops.offline.runtime import OfflineRuntime, credentials_environment
from d2ops.offline.stack import REGION
from d2ops_core.champion import CHAMPION_KEY, ChampionRecord, GateDecision, history_prefix
from d2ops_core.dataset_identity import DatasetRef
from tests.fixtures.console import browser_page, screenshot
from tests.fixtures.monitoring_windows import hour, put, window

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RUN_V1, RUN_V2 = "shapes_v1_0123456789abcdef", "shapes_v2_fedcba9876543210"
HOURS = 6  # windows at -6 h .. -1 h; the one at -3 h drifted; v2 deployed at -4 h 30 min
DRIFTED_AT = -3


def champion(rt: OfflineRuntime, run_id: str, version: str, promoted_at: str) -> ChampionRecord:
    dataset = DatasetRef(bucket=rt.stack.data_bucket, prefix=f"datasets/shapes/{version}/", name="shapes",
                         version=version, manifest_key=f"datasets/shapes/{version}/manifest.json",
                         manifest_version="v")
    return ChampionRecord(
        run_id=run_id, dataset=dataset, model_package_arn=f"arn:aws:sagemaker:us-east-1:123456789012:model-package/"
        f"d2ops-models/{version[1:]}", model_name=f"m-{version}", model_data=f"s3://a/runs/{run_id}/model.tar.gz",
        endpoint_name=rt.stack.endpoint_name, endpoint_config_name=f"c-{version}", primary_metric="bbox_AP",
        primary_value=0.5, evaluation_uri=f"s3://a/runs/{run_id}/evaluation/evaluation.json",
        gate=GateDecision(decision="approved", approval_status="Approved", reason="better"), promoted_at=promoted_at)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineRuntime, list[Any]]]:
    root = tmp_path_factory.mktemp("monitoring")
    with OfflineRuntime(root / "work") as rt:
        s3, bucket, name = rt.client("s3"), rt.stack.artifacts_bucket, rt.stack.endpoint_name
        windows = [window(name, hour(-h), run_id=RUN_V1 if -h < -4 else RUN_V2,
                          drifted=("brightness", "class_rate:circle") if -h == DRIFTED_AT else ())
                   for h in range(HOURS, 0, -1)]
        for w in windows:
            put(s3, bucket, w)
        for run_id, version, at in ((RUN_V1, "v1", hour(-30)), (RUN_V2, "v2", hour(-5) + timedelta(minutes=30))):
            record = champion(rt, run_id, version, at.isoformat())
            s3.put_object(Bucket=bucket, Key=f"{history_prefix(name)}promoted-{run_id}.json",
                          Body=record.model_dump_json().encode())
        s3.put_object(Bucket=bucket, Key=CHAMPION_KEY, Body=record.model_dump_json().encode())
        yield rt, windows[::-1]  # newest first, as the API answers


def test_the_status_api_answers_the_windows_to_signed_callers_only(seeded: tuple[OfflineRuntime, list[Any]]) -> None:
    rt, windows = seeded
    path = f"/endpoints/{rt.stack.endpoint_name}/monitoring"
    answer = offline_status_api(rt.status_api.url).get(path + "?limit=4")
    assert [w["window_start"] for w in answer["windows"]] == [w.model_dump(mode="json")["window_start"]
                                                              for w in windows[:4]]
    assert answer["older_windows"] is True and answer["problems"] == []
    # catches: the route left out of template.yaml's events (the offline API serves exactly those), or served
    # without the IAM authorizer (an unsigned request must be API Gateway's 403)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rt.status_api.url + path, timeout=30)
    assert refused.value.code == 403


def d2ops(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own; ``env`` replaces the caller's AWS settings (profile, endpoint)."""
    base = {k: v for k, v in os.environ.items() if not (env and k in ("AWS_PROFILE", "AWS_ENDPOINT_URL"))}
    env = {**base, **(env or {}), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "d2ops", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_d2ops_monitor_prints_the_windows_of_the_running_offline_stack(
        seeded: tuple[OfflineRuntime, list[Any]]) -> None:
    rt, _ = seeded
    done = d2ops("monitor", "--state-dir", str(rt.work_dir), "--limit", "5")
    assert done.returncode == 0, done.stderr  # the newest window is ok
    lines = done.stdout.splitlines()
    assert lines[0] == f"endpoint {rt.stack.endpoint_name}: 5 window(s), newest first"
    rows = lines[2:7]
    assert [row.split()[3] for row in rows] == ["ok", "ok", "drifted", "ok", "ok"]  # newest first
    drifted = rows[-DRIFTED_AT - 1]
    # catches: a drifted statistic not named with its value and threshold, or one that did not drift listed
    assert drifted.endswith("brightness 0.500/0.200 (ks), class_rate:circle 0.625/0.250 (psi)"), drifted
    assert RUN_V2 in drifted and "low_confidence_fraction" not in drifted
    assert lines[-1] == "older windows exist: raise --limit to see them"
    # the newest window drifted: exit 1 (a cron job alerts on it); --json prints the API's answer
    put(rt.client("s3"), rt.stack.artifacts_bucket, window("another-endpoint", hour(-1), drifted=("brightness",)))
    done = d2ops("monitor", "--work-dir", str(rt.work_dir), "--endpoint", "another-endpoint", "--json")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert [w["verdict"] for w in json.loads(done.stdout)["windows"]] == ["drifted"]
    for bad in (["--endpoint", "bad_name"], ["--limit", "501"]):  # not an endpoint name; past the API's limit
        done = d2ops("monitor", "--work-dir", str(rt.work_dir), *bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "limit" in done.stderr


def test_d2ops_monitor_stack_reads_the_deployed_stacks_api_for_its_endpoint_and_signs(
        seeded: tuple[OfflineRuntime, list[Any]]) -> None:
    """``d2ops monitor --stack``: DescribeStacks (moto server) -> StatusApiUrl and EndpointName -> a SigV4-signed
    GET of that endpoint's windows. Catches: the offline API asked instead of the stack's, the endpoint taken from
    somewhere other than the stack's output, or a refused signature reaching the user as a traceback."""
    rt, windows = seeded
    cloudformation = rt.moto_client("cloudformation")
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {"StatusApiUrl": {"Value": rt.status_api.url},
                            "EndpointName": {"Value": rt.stack.endpoint_name}}}
    cloudformation.create_stack(StackName="d2ops-monitor-test", TemplateBody=json.dumps(template))
    env = {"AWS_ENDPOINT_URL_CLOUDFORMATION": rt.moto_url, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
           **credentials_environment(rt.credentials)}
    # a work dir with no runtime: had the command asked the offline API, it would have found nothing there
    done = d2ops("monitor", "--stack", "d2ops-monitor-test", "--limit", "3", "--work-dir", "/nonexistent", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"endpoint {rt.stack.endpoint_name}: 3 window(s), newest first"
    assert [row.split()[3] for row in lines[2:5]] == [w.verdict for w in windows[:3]]
    forged = d2ops("monitor", "--stack", "d2ops-monitor-test", env={**env, "AWS_SECRET_ACCESS_KEY": "forged"})
    assert forged.returncode == 2 and forged.stderr.count("\n") == 1, forged.stderr
    assert forged.stderr.startswith("d2ops monitor: error: --stack d2ops-monitor-test: ")
    assert "The request signature we calculated does not match" in forged.stderr


def test_the_console_plots_each_statistic_against_its_threshold_with_the_drifted_window_marked(
        seeded: tuple[OfflineRuntime, list[Any]]) -> None:
    rt, windows = seeded
    drifted_start = windows[-DRIFTED_AT - 1].model_dump(mode="json")["window_start"]
    with Console(offline_status_api(rt.status_api.url), invoke_with(rt.client("sagemaker-runtime"))) as server, \
            browser_page() as page:
        page.goto(server.url)
        page.locator("#endpoint-link a").click()  # the runs page links the champion's endpoint's monitoring
        panel = page.locator("#monitoring-page .monitoring-panel")
        panel.wait_for(timeout=30_000)
        charts = panel.locator("svg.monitoring-chart")
        names = [charts.nth(i).get_attribute("data-statistic") for i in range(charts.count())]
        # what moved first, then the rest in the monitor's order
        assert names == ["brightness", "class_rate:circle", "low_confidence_fraction"]
        brightness = panel.locator('svg.monitoring-chart[data-statistic="brightness"]')
        # catches: windows not plotted, or the drifted one not marked (or another one marked)
        assert brightness.locator("circle.point").count() == HOURS
        marked = brightness.locator("circle.point.drifted")
        assert marked.count() == 1 and marked.get_attribute("data-start") == drifted_start
        calm = panel.locator('svg.monitoring-chart[data-statistic="low_confidence_fraction"]')
        assert calm.locator("circle.point").count() == HOURS and calm.locator("circle.drifted").count() == 0
        assert panel.locator(f'rect.window.verdict-drifted[data-start="{drifted_start}"]').count() == 1
        # the threshold is drawn, and the drifted point is above it (the chart's y grows downwards)
        assert brightness.locator("polyline.threshold").count() == 1
        threshold_y = float(brightness.locator("polyline.threshold").get_attribute("points").split()[0].split(",")[1])
        assert float(marked.get_attribute("cy")) < threshold_y
        # v2's deployment falls inside the windows' time: one line in each chart and the verdict strip; v1's is
        # before the first window and is not drawn
        deployments = panel.locator("line.deployment")
        assert deployments.count() == len(names) + 1
        assert {deployments.nth(i).get_attribute("data-run") for i in range(deployments.count())} == {RUN_V2}
        assert "1 drifted" in panel.locator(".monitoring-summary").inner_text()
        screenshot(page, "monitoring")
        assert page.problems == []
