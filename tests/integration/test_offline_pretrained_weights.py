"""Fine-tuning by default, offline end to end (issue 20): the stack's PretrainedWeightsKey, the
prepare step's refusal of a run whose weights are missing, `d2ops weights upload`, the job's
`pretrained` channel, its log and the artifact's metadata.

The checkpoint is made here: the CPU profile's freshly built detectron2 model with an 80-class head
(a COCO head, as a model-zoo checkpoint has), saved in the model zoo's .pkl layout at the stack's
default key. The dataset has 3 classes, so the head's shapes differ and detectron2 must skip them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from d2ops.offline.pipeline import run_pipeline
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core import pretrained
from d2ops_core.s3_layout import parse_s3_uri
from tests.fixtures.frameworks import require_detectron2
from tests.fixtures.offline.support import tiny_dataset

require_detectron2()

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
COCO_CLASSES = 80
# Two iterations: the run only has to start from the weights, not learn; an unreachable gate then ends it
# after evaluation, before any endpoint (QualityGateFailed), so the test stays short.
TRAINING = {"max_iter": 2}
GATE = {"min_map": 0.99}


def zoo_checkpoint(path: Path) -> Path:
    """The CPU profile's freshly built model with a COCO-sized head, in MODEL_ZOO.md's .pkl layout."""
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    import model_code.training.detectron2_backbones  # noqa: F401  registers the CPU profile's backbone
    from model_code.training.detectron2_trainer import CPU_PROFILE, SHIPPED_CONFIG_DIR

    cfg = get_cfg()
    cfg.merge_from_file(str(SHIPPED_CONFIG_DIR / CPU_PROFILE))
    cfg.merge_from_list(["MODEL.ROI_HEADS.NUM_CLASSES", str(COCO_CLASSES), "MODEL.DEVICE", "cpu"])
    model = build_model(cfg)
    state = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    with path.open("wb") as f:
        pickle.dump({"model": state, "__author__": "d2ops tests"}, f)
    return path


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineRuntime]:
    root = tmp_path_factory.mktemp("pretrained")
    # InlineImageLimit 2: every run here checks its images on the Distributed Map (the real check_images
    # and summarize Lambdas in the runtime) before a real detectron2 job trains on the snapshot.
    with OfflineRuntime(root / "work", function_env={"PrepareTrainingFunction": {"FRAMEWORK": "detectron2"}},
                        parameters={"InlineImageLimit": "2", "LeaseWaitSeconds": "1"},
                        training_defaults={"num_workers": "0", "log_period": "1", "report_images": "0"}) as rt:
        yield rt


def test_a_run_without_the_weights_fails_in_the_prepare_step_with_the_fix(runtime: OfflineRuntime,
                                                                          tmp_path: Path) -> None:
    key = runtime.stack.parameters["PretrainedWeightsKey"]
    assert key == pretrained.DEFAULT_KEY  # the offline stack keeps the template's default
    started = time.monotonic()
    summary = run_pipeline(runtime, tiny_dataset(tmp_path, "shapes", "v1", training=TRAINING, gate=GATE),
                           out=lambda line: None, timeout=300)
    assert (summary.status, summary.error) == ("FAILED", "PreparationFailed")
    assert "Train model" not in summary.states_visited
    assert time.monotonic() - started < 60  # refused before any job, not after a training job's start-up
    cause = summary.output["failure"]["cause"]
    assert "\n" not in cause and "PretrainedWeightsMissing" in cause
    assert f"s3://{runtime.stack.data_bucket}/{key}" in cause
    assert "`d2ops weights upload FILE`" in cause  # the offline stack is addressed without --stack
    # the status API's view of the run carries the same line
    described = runtime.client("stepfunctions").describe_execution(executionArn=summary.execution_arn)
    assert f"s3://{runtime.stack.data_bucket}/{key}" in described["cause"]


def test_uploaded_weights_are_the_jobs_starting_point(runtime: OfflineRuntime, tmp_path: Path) -> None:
    weights = zoo_checkpoint(tmp_path / "model_final_coco.pkl")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    # the command in its own process, as a user runs it beside `d2ops run` (it finds the runtime's S3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "d2ops", "weights", "upload", str(weights), "--work-dir",
                           str(runtime.work_dir)], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout
    key = runtime.stack.parameters["PretrainedWeightsKey"]
    assert f"uploaded s3://{runtime.stack.data_bucket}/{key} (sha256 {digest})" in printed

    summary = run_pipeline(runtime, tiny_dataset(tmp_path, "shapes", "v2", training=TRAINING, gate=GATE),
                           out=lambda line: None, timeout=600)
    assert (summary.status, summary.error) == ("FAILED", "QualityGateFailed"), summary.output.get("failure")
    job_name = summary.output["plan"]["names"]["training_job"]
    job = runtime.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert channels["pretrained"] == f"s3://{runtime.stack.data_bucket}/{key}"

    log = runtime.sagemaker.job_log(job_name).read_text()
    name = Path(key).name
    assert f"/input/data/pretrained/{name} (sha256 {digest}," in log, log[-3000:]  # the job names path and hash
    # the 80-class head cannot load into a 3-class model: skipped (and said), the rest loaded
    assert "Skip loading parameter 'roi_heads.box_predictor.cls_score.weight'" in log
    assert "Some model parameters or buffers are not found in the checkpoint" in log

    bucket, artifact_key = parse_s3_uri(summary.output["plan"]["evaluation_job"]["ProcessingInputs"][0]["S3Input"]
                                        ["S3Uri"])
    archive = tmp_path / "model.tar.gz"
    runtime.client("s3").download_file(bucket, artifact_key, str(archive))
    with tarfile.open(archive) as tar:
        member = tar.extractfile("metadata.json")
        assert member is not None
        metadata: dict[str, Any] = json.loads(member.read())
    initial = metadata["initial_weights"]
    assert initial["sha256"] == digest and initial["path"].endswith(f"/input/data/pretrained/{name}")
    assert initial["bytes"] == weights.stat().st_size


def test_an_image_overwritten_after_validation_never_reaches_the_training_job(runtime: OfflineRuntime,
                                                                              tmp_path: Path) -> None:
    """The bytes the job trains on are the validated ones: the Map copied them by VersionId into the run's
    snapshot and the channels read the snapshot. Another run holds the endpoint lease, so this one waits
    after validation (as a real run may, for hours): the overwrite lands then, before any job exists."""
    import threading

    from d2ops.asl import StateMachine

    weights = zoo_checkpoint(tmp_path / "model_final_coco.pkl")
    s3, sfn = runtime.client("s3"), runtime.client("stepfunctions")
    s3.upload_file(str(weights), runtime.stack.data_bucket, runtime.stack.parameters["PretrainedWeightsKey"])
    dataset = tiny_dataset(tmp_path, "shapes", "v3", training=TRAINING, gate=GATE)
    victim = sorted(p for p in (dataset / "images").rglob("*") if p.is_file())[0]
    relative, validated = victim.relative_to(dataset).as_posix(), victim.read_bytes()
    overwritten: dict[str, float] = {}
    # The lease's holder: a running execution of another machine, stopped once the overwrite is done.
    holder_machine = StateMachine.from_definition(
        {"StartAt": "Hold", "States": {"Hold": {"Type": "Wait", "Seconds": 600, "End": True}}},
        name="lease-holder", region=runtime.machine.region, account_id=runtime.machine.account_id)
    runtime.sfn.add_state_machine(holder_machine)
    holder = sfn.start_execution(stateMachineArn=holder_machine.arn, name="holder")["executionArn"]
    subs = runtime.stack.substitutions
    runtime.client("dynamodb").put_item(TableName=subs["LeaseTableName"], Item={
        "endpoint_name": {"S": subs["EndpointName"]}, "holder": {"S": holder}, "run_id": {"S": "holder"},
        "acquired_at": {"S": "2026-01-01T00:00:00Z"}})

    def overwrite_while_the_run_waits_for_the_lease() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not overwritten:
            for ex in sfn.list_executions(stateMachineArn=runtime.stack.state_machine_arn)["executions"]:
                if not ex["name"].startswith("shapes_v3_"):
                    continue
                events = sfn.get_execution_history(executionArn=ex["executionArn"], maxResults=1000)["events"]
                if any(e.get("stateEnteredEventDetails", {}).get("name") == "Wait for endpoint lease" for e in events):
                    s3.put_object(Bucket=runtime.stack.data_bucket, Key=f"datasets/shapes/v3/{relative}",
                                  Body=b"not what was validated")
                    overwritten["at"] = time.time()
                    sfn.stop_execution(executionArn=holder)
                    return
            time.sleep(0.1)

    poller = threading.Thread(target=overwrite_while_the_run_waits_for_the_lease, daemon=True)
    poller.start()
    summary = run_pipeline(runtime, dataset, out=lambda line: None, timeout=600)
    poller.join(timeout=5)
    assert (summary.status, summary.error) == ("FAILED", "QualityGateFailed"), summary.output.get("failure")
    assert "at" in overwritten, summary.states_visited
    visited = summary.states_visited
    assert visited.index("Check images") < visited.index("Wait for endpoint lease") < visited.index("Train model")
    job_name = summary.output["plan"]["names"]["training_job"]
    job = runtime.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    assert job["CreationTime"].timestamp() > overwritten["at"]  # the overwrite came before the job existed
    snapshot = summary.output["validation"]["summary"]["snapshot_uri"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert channels["dataset"] == snapshot and not {"train", "val"} & set(channels)
    trained_on = runtime.sagemaker.job_dir(job_name) / "channels" / "dataset" / relative
    assert trained_on.read_bytes() == validated  # what the job read from its channel
    data = s3.get_object(Bucket=runtime.stack.data_bucket, Key=f"datasets/shapes/v3/{relative}")["Body"].read()
    assert data == b"not what was validated"

    # The artifact names the inventory it was trained from.
    bucket, artifact_key = parse_s3_uri(summary.output["plan"]["evaluation_job"]["ProcessingInputs"][0]["S3Input"]
                                        ["S3Uri"])
    archive = tmp_path / "model.tar.gz"
    s3.download_file(bucket, artifact_key, str(archive))
    with tarfile.open(archive) as tar:
        member = tar.extractfile("metadata.json")
        assert member is not None
        metadata: dict[str, Any] = json.loads(member.read())
    digest = summary.output["validation"]["summary"]["inventory_digest"]
    assert digest and metadata["dataset"]["inventory_digest"] == digest
    assert job["HyperParameters"]["inventory_digest"] == digest
