"""The offline stack without training: the S3 trigger, the status API over HTTP, the CLI views.

A broken dataset version ends the real pipeline at validation, which exercises the trigger's
idempotency, the in-process Lambdas, the local Step Functions API, the API Gateway adapter and
the persisted records in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import Credentials

from d2ops.offline.client import offline_status_api
from d2ops.offline.pipeline import RunSummary, run_pipeline
from d2ops.offline.runtime import OfflineRuntime, credentials_environment
from d2ops.offline.stack import REGION
from d2ops.sigv4 import SignedStatusApi
from d2ops_core.s3_layout import parse_s3_uri
from tests.fixtures.offline.support import break_dataset, tiny_dataset

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _get(api: str, path: str) -> tuple[int, Any]:
    """A GET signed with the offline credentials (the status API checks SigV4 like API Gateway's IAM auth)."""
    status, data, _ = offline_status_api(api).request("GET", path)
    return status, json.loads(data)


def _post(api: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, data, _ = offline_status_api(api).request("POST", path, json.dumps(body).encode(),
                                                      {"Content-Type": "application/json"})
    return status, json.loads(data)


def _unsigned(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, str | None]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers.get("x-amzn-ErrorType")


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineRuntime, RunSummary]]:
    root = tmp_path_factory.mktemp("offline-status")
    dataset = tiny_dataset(root, "broken", "v1", images=10)
    break_dataset(dataset)
    lines: list[str] = []
    with OfflineRuntime(root / "work") as rt:
        summary = run_pipeline(rt, dataset, deliveries=5, out=lines.append, timeout=120)
        yield rt, summary


def test_five_deliveries_start_one_run_that_ends_dataset_rejected(rejected: tuple[OfflineRuntime, RunSummary]) -> None:
    rt, summary = rejected
    assert [r["run_id"] for r in summary.trigger_results] == [summary.run_id] * 5
    executions = rt.client("stepfunctions").list_executions(stateMachineArn=rt.stack.state_machine_arn)["executions"]
    assert [e["name"] for e in executions] == [summary.run_id]
    assert (summary.status, summary.error) == ("FAILED", "DatasetRejected")
    assert "Train model" not in summary.states_visited and "Dataset rejected" in summary.states_visited
    failure = summary.output["failure"]
    assert failure["first_errors"][0]["code"] == "BBOX_OUTSIDE_IMAGE"
    bucket, key = parse_s3_uri(failure["report_uri"])
    report = json.loads(rt.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    assert report["valid"] is False and any(e["code"] == "BBOX_OUTSIDE_IMAGE" for e in report["errors"])


def test_a_repeated_event_after_the_run_ended_starts_nothing(rejected: tuple[OfflineRuntime, RunSummary]) -> None:
    rt, summary = rejected
    key = summary.output["dataset"]["manifest_key"]
    result = rt.deliver_event(rt.upload_event(rt.stack.data_bucket, key))
    assert result is not None and (result["action"], result["run_id"]) == ("already-started", summary.run_id)
    other = rt.upload_event(rt.stack.data_bucket, key)
    other["detail"]["object"]["key"] = "datasets/broken/v1/images/x.png"
    assert rt.deliver_event(other) is None  # the template's rule pattern does not match


def test_status_api_routes_over_http(rejected: tuple[OfflineRuntime, RunSummary]) -> None:
    rt, summary = rejected
    api = rt.status_api.url
    status, listing = _get(api, "/runs?status=FAILED")
    assert status == 200 and [r["run_id"] for r in listing["runs"]] == [summary.run_id]
    status, listing = _get(api, "/runs?status=SUCCEEDED")
    assert status == 200 and listing["runs"] == []
    status, run = _get(api, f"/runs/{summary.run_id}")
    assert status == 200 and run["status"] == "FAILED" and run["error"] == "DatasetRejected"
    assert run["validation"]["valid"] is False
    assert [s["name"] for s in run["timeline"][:2]] == ["Validate", "Validate dataset"]  # the stage, then its work
    assert _get(api, "/runs/no_such_run")[0] == 404
    assert _get(api, "/nowhere") == (404, {"message": "Not Found"})
    status, models = _get(api, "/models")
    assert status == 200 and models["versions"] == [] and models["champion"] is None
    uri = f"s3://{rt.stack.data_bucket}/{summary.output['dataset']['prefix']}"
    status, started = _post(api, "/runs", {"dataset_uri": uri})
    assert status == 200 and started["run_id"] == summary.run_id and started["already_started"] is True
    assert _post(api, "/runs", {"dataset_uri": "s3://elsewhere/datasets/x/v1/"})[0] == 400


def test_cli_status_and_graph_read_the_recorded_run(rejected: tuple[OfflineRuntime, RunSummary],
                                                    tmp_path: Path) -> None:
    rt, summary = rejected
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    # While this runtime holds the work dir, the CLI reads its status API (runtime.json).
    out = subprocess.run([sys.executable, "-m", "d2ops", "status", summary.run_id, "--json", "--work-dir",
                          str(rt.work_dir)], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert json.loads(out.stdout)["error"] == "DatasetRejected"
    svg = tmp_path / "run.svg"
    subprocess.run([sys.executable, "-m", "d2ops", "graph", summary.run_id, "-o", str(svg), "--work-dir",
                    str(rt.work_dir)], capture_output=True, text=True, env=env, timeout=120, check=True)
    text = svg.read_text()
    assert "<title>Dataset rejected (Fail): failed</title>" in text
    assert "<title>Train model (Task): not reached</title>" in text
    assert "<title>Validate dataset (Task): succeeded</title>" in text
    missing = subprocess.run([sys.executable, "-m", "d2ops", "status", "nope_v1_0", "--work-dir",
                              str(rt.work_dir)], capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 2 and "no run 'nope_v1_0'" in missing.stderr


def test_status_api_refuses_unsigned_and_badly_signed_requests(rejected: tuple[OfflineRuntime, RunSummary]) -> None:
    rt, summary = rejected
    api = rt.status_api.url
    assert _unsigned(f"{api}/runs") == (403, {"message": "Missing Authentication Token"},
                                        "MissingAuthenticationTokenException")
    # Signed for another path, replayed on this one: the recomputed signature differs.
    other = offline_status_api(api).signed_headers("GET", f"{api}/models")
    status, body, kind = _unsigned(f"{api}/runs/{summary.run_id}", other)
    assert (status, kind) == (403, "InvalidSignatureException")
    assert body["message"].startswith("The request signature we calculated does not match")
    wrong = SignedStatusApi(api, Credentials("offline", "not-the-secret", "offline"), REGION)
    assert wrong.request("GET", "/runs")[0] == 403
    stranger = SignedStatusApi(api, Credentials("AKIASTRANGER", "offline"), REGION)
    status, data, _ = stranger.request("GET", "/runs")
    assert (status, json.loads(data)) == (403, {"message": "The security token included in the request is invalid."})
    # A correctly signed request still reaches the function (and unknown routes stay API Gateway's 404).
    assert _get(api, f"/runs/{summary.run_id}")[0] == 200
    assert _unsigned(f"{api}/nowhere")[0] == 404


def test_cli_status_reads_a_stack_by_its_outputs_and_signs(rejected: tuple[OfflineRuntime, RunSummary]) -> None:
    """``d2ops status --stack``: DescribeStacks (moto server) -> StatusApiUrl -> SigV4-signed GETs."""
    rt, summary = rejected
    cloudformation = rt.moto_client("cloudformation")
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {"StatusApiUrl": {"Value": rt.status_api.url}}}
    cloudformation.create_stack(StackName="d2ops-status-test", TemplateBody=json.dumps(template))
    cloudformation.create_stack(StackName="not-d2ops", TemplateBody=json.dumps({"Resources": template["Resources"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
           "AWS_ENDPOINT_URL_CLOUDFORMATION": rt.moto_url, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
           **credentials_environment(rt.credentials)}
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        env.pop(key, None)

    def status(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "d2ops", "status", *args], capture_output=True, text=True,
                              env={**env, **extra}, timeout=120)

    listing = status("--stack", "d2ops-status-test")
    assert listing.returncode == 0, listing.stderr
    assert summary.run_id in listing.stdout and "FAILED" in listing.stdout
    one = status(summary.run_id, "--json", "--stack", "d2ops-status-test")
    assert one.returncode == 0 and json.loads(one.stdout)["error"] == "DatasetRejected"
    # A forged secret is refused at its first request, DescribeStacks, as CloudFormation refuses it (moto's port
    # answers only the runtime's signature); the status API's own refusal of it is asserted above.
    forged = status("--stack", "d2ops-status-test", AWS_SECRET_ACCESS_KEY="forged")
    assert forged.returncode == 2
    assert "stack 'd2ops-status-test': The request signature we calculated does not match" in forged.stderr
    missing = status("--stack", "no-such-stack")
    assert missing.returncode == 2 and "no-such-stack" in missing.stderr and "Traceback" not in missing.stderr
    foreign = status("--stack", "not-d2ops")
    assert foreign.returncode == 2 and "has no StatusApiUrl output" in foreign.stderr
