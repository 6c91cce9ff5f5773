"""`d2ops doctor` against the offline runtime: the same checks, through the runtime's real APIs (moto's
server for CloudFormation, ECR, S3 and SNS; the gateway's Service Quotas and SageMaker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from d2ops import cli, doctor
from d2ops.commands.doctor import runtime_target
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core.platform import quota_name
from tests.fixtures.offline.endpoints import endpoint_config

GPU = "ml.g4dn.xlarge"


def test_doctor_against_the_offline_runtime_prints_one_line_per_check(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["doctor", "--work-dir", str(tmp_path / "work")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("d2ops doctor: stack d2ops (offline")
    checks = out[1:-1]
    names = [line[5:].partition(":")[0] for line in checks]
    assert names == ["training image", "serving image", "serving backend", "training quota", "evaluation quota",
                     "endpoint quota", "pretrained weights", "upload events", "notifications", "endpoint name"]
    by_name = dict(zip(names, checks, strict=True))
    # What the runtime creates from template.yaml, and the offline account's default quotas, pass.
    for name in ("training image", "serving image", "training quota", "evaluation quota", "endpoint quota",
                 "upload events", "endpoint name"):
        assert by_name[name].startswith("ok   "), by_name[name]
    assert by_name["notifications"].startswith("warn ")  # the offline stack subscribes no e-mail
    # The template's default server, TorchServe, is archived upstream: a warning naming the offline switch.
    assert by_name["serving backend"].startswith("warn serving backend: ServingBackend=torchserve")
    assert "`d2ops run --parameter ServingBackend=ray-serve`" in by_name["serving backend"]
    failed = [line for line in checks if line.startswith("FAIL")]
    assert status == (1 if failed else 0)
    assert out[-1] == (f"{len(failed)} check(s) failed" if failed else "no check failed (2 warning(s))")


def test_the_quotas_the_offline_sagemaker_enforces_are_the_ones_the_doctor_reads(tmp_path: Path) -> None:
    endpoint = quota_name(GPU, "endpoint")
    with OfflineRuntime(tmp_path / "work", parameters={"UseSpotTraining": "true"}, quotas={endpoint: 1}) as rt:
        clients, stack = runtime_target(rt)
        checks = {c.name: c for c in doctor.run_checks(clients, stack).checks}
        # An endpoint of the stack's name that another run deployed: the offline SageMaker keeps its tags.
        config = endpoint_config(rt, "elsewhere", b"not a model archive")
        rt.client("sagemaker").create_endpoint(EndpointName=stack.endpoint_name, EndpointConfigName=config,
                                               Tags=[{"Key": doctor.RUN_ID_TAG, "Value": "shapes-v1-elsewhere"}])
        owner = doctor.check_endpoint_owner(clients.cloudformation, clients.sagemaker, clients.stepfunctions,
                                            clients.s3, stack)
    assert owner.status == "FAIL" and "deployed by run shapes-v1-elsewhere, which is not one of this stack's" in (
        owner.found)
    assert checks["serving backend"].status == "warn"  # the template's default, TorchServe
    training = checks["training quota"]
    assert training.status == "FAIL"  # a new account's spot GPU training quota: 0, from the defaults
    assert training.found.startswith(f"'{quota_name(GPU, 'spot training')}' is 0 (the default)")
    assert checks["endpoint quota"].status == "FAIL"  # raised to 1: the first deployment only
    assert checks["endpoint quota"].found.startswith(f"'{endpoint}' is 1: the first deployment fits (1), but every "
                                                     f"update needs 2")
    assert checks["evaluation quota"].status == "ok"


HOLD_RUNTIME = """
import sys
from pathlib import Path
from d2ops.offline.runtime import OfflineRuntime
with OfflineRuntime(Path(sys.argv[1]), parameters={"EndpointInstanceCount": "3", "ServingBackend": "ray-serve"},
                    quotas={"ml.g4dn.xlarge for endpoint usage": 5}):
    print("ready", flush=True)
    sys.stdin.read()
"""


def test_doctor_asks_the_runtime_another_process_holds_about_that_runtimes_stack(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_RUNTIME, str(work)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert cli.main(["doctor", "--work-dir", str(work)]) == 1
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    out = capsys.readouterr().out.splitlines()
    endpoint = next(line for line in out if line.startswith("FAIL endpoint quota"))
    assert any(line.startswith("ok   serving backend: ServingBackend=ray-serve") for line in out)  # its server too
    # Its parameters (3 instances) and its quota table (5), not the template's defaults: the holder's APIs answered.
    assert f"'{quota_name(GPU, 'endpoint')}' is 5: the first deployment fits (3), but every update needs 6" in endpoint
