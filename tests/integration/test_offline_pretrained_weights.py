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
from d2ops_core.runs import parse_s3_uri
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
    with OfflineRuntime(root / "work", function_env={"PrepareTrainingFunction": {"FRAMEWORK": "detectron2"}},
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
