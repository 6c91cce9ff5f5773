"""The SageMaker SDK against the offline stack: ``d2ops predict`` on a real TorchServe endpoint, and the
Estimator helper's training job run for real by the offline SageMaker (torchvision, tiny data).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from d2ops import sdk
from d2ops.commands.predict import EndpointFailed, invoke
from d2ops.offline.runtime import OfflineRuntime
from d2ops_core.cpu_profile import TORCHVISION_CPU_PROFILE
from d2ops_core.documents.detections import InvocationResponse
from tests.fixtures.offline.endpoints import endpoint_config
from tests.fixtures.offline.support import tiny_dataset
from tests.fixtures.serving.support import png_bytes
from tests.fixtures.serving.thresholds import artifact_with_thresholds, expected_by_default, split_thresholds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
# The CPU profile at 64 px with a schedule of a few iterations: the job runs the real trainer in seconds.
TINY_TRAINING = TORCHVISION_CPU_PROFILE | {"min_size": "64", "max_size": "64", "warmup_iters": "1",
                                           "checkpoint_period": "2", "log_period": "1", "report_images": "1"}


@pytest.fixture(scope="module")
def thresholds() -> dict[str, float]:
    return split_thresholds()


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, thresholds: dict[str, float]) -> Iterator[OfflineRuntime]:
    """A runtime serving the stack's endpoint with the session's exported test detector, its metadata carrying
    per-class score thresholds that split its own detections (tests/fixtures/serving/thresholds.py)."""
    model = artifact_with_thresholds(tmp_path_factory.mktemp("model"), thresholds, pack=True)
    with OfflineRuntime(tmp_path_factory.mktemp("predict") / "work", training_defaults=TINY_TRAINING) as rt:
        sm = rt.client("sagemaker")
        sm.create_endpoint(EndpointName=rt.stack.endpoint_name,
                           EndpointConfigName=endpoint_config(rt, "predict", model))
        deadline = time.monotonic() + 400
        while sm.describe_endpoint(EndpointName=rt.stack.endpoint_name)["EndpointStatus"] == "Creating":
            assert time.monotonic() < deadline, "the endpoint did not come up"
            time.sleep(1)
        assert sm.describe_endpoint(EndpointName=rt.stack.endpoint_name)["EndpointStatus"] == "InService"
        yield rt


def _predict(rt: OfflineRuntime, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The command in its own process, as a user runs it (it finds the runtime through runtime.json)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "d2ops", "predict", *args, "--offline", "--work-dir",
                           str(rt.work_dir)], input=stdin, capture_output=True, env=env, timeout=300, check=False)


def test_predict_prints_the_endpoints_detections_and_draws_them(runtime: OfflineRuntime, tmp_path: Path) -> None:
    image = tmp_path / "shapes.png"
    image.write_bytes(png_bytes())
    drawn = tmp_path / "drawn.png"
    done = _predict(runtime, str(image), "--score-threshold", "0", "--draw", str(drawn))
    assert done.returncode == 0, done.stderr.decode()
    answer: dict[str, Any] = json.loads(done.stdout)  # stdout is the answer and nothing else
    detections = InvocationResponse.model_validate(answer).detections
    assert answer["image"] == {"width": 160, "height": 120} and detections  # the test detector answers every box
    assert f"{len(detections)} detection(s) drawn on {drawn}" in done.stderr.decode()
    with Image.open(image) as original, Image.open(drawn) as out:
        assert out.size == original.size
        x1, y1, _, _ = (round(v) for v in detections[0].box)
        corner = (min(x1, 159), min(y1, 119))
        assert out.convert("RGB").getpixel(corner) != original.convert("RGB").getpixel(corner)


def test_without_a_threshold_predict_gets_the_model_s_per_class_default(runtime: OfflineRuntime, tmp_path: Path,
                                                                       thresholds: dict[str, float]) -> None:
    # d2ops predict sends no threshold unless asked, so it shows what the model answers by default: exactly
    # what the artifact's per-class thresholds keep (catches a command that sends its own, e.g. 0.5 or 0).
    image = tmp_path / "shapes.png"
    image.write_bytes(png_bytes())
    done = _predict(runtime, str(image))
    assert done.returncode == 0, done.stderr.decode()
    answer = json.loads(done.stdout)
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url=runtime.gateway.url)
    everything = invoke(session, runtime.stack.endpoint_name, png_bytes(), "image/png", score_threshold=0.0)
    expected = expected_by_default(everything["detections"], thresholds)
    assert 0 < len(expected) < len(everything["detections"])
    assert answer["detections"] == expected and answer["score_thresholds"]["source"] == "model"
    assert everything["score_thresholds"]["source"] == "request"


def test_an_unknown_endpoint_is_named(runtime: OfflineRuntime) -> None:
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url=runtime.gateway.url)
    # SageMaker Runtime's answer for a missing endpoint (ValidationError "Endpoint ... not found") -> exit 1.
    with pytest.raises(EndpointFailed, match="endpoint nobody-serves-this not found"):
        invoke(session, "nobody-serves-this", png_bytes(), "image/png")


def test_the_threshold_reaches_the_container_as_custom_attributes(runtime: OfflineRuntime) -> None:
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url=runtime.gateway.url)
    everything = invoke(session, runtime.stack.endpoint_name, png_bytes(), "image/png", score_threshold=0.0)
    assert everything["detections"]
    assert invoke(session, runtime.stack.endpoint_name, png_bytes(), "image/png", score_threshold=1.0)[
        "detections"] == []  # an untrained detector scores nothing 1.0


def test_the_containers_refusal_is_a_model_error(runtime: OfflineRuntime) -> None:
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url=runtime.gateway.url)
    # Bytes the command itself would refuse, sent past it: SageMaker wraps the container's 4xx as ModelError.
    with pytest.raises(EndpointFailed, match=r"refused the image \(4\d\d\)"):
        invoke(session, runtime.stack.endpoint_name, b"\x89PNG\r\n\x1a\nbroken", "image/png")


@pytest.mark.slow  # about 2 minutes on 2 shared cores; tests/unit/test_sdk.py checks the request it sends
def test_the_estimator_helper_runs_the_pipelines_training_job(runtime: OfflineRuntime, tmp_path: Path) -> None:
    dataset = tiny_dataset(tmp_path, "shapes", "v1", images=12, size=64)
    s3 = runtime.client("s3")
    prefix = "datasets/shapes/v1/"
    # Uploading is all: offline, only an explicitly delivered upload event starts a pipeline run.
    for path in sorted(p for p in dataset.rglob("*") if p.is_file()):
        s3.upload_file(str(path), runtime.stack.data_bucket, prefix + path.relative_to(dataset).as_posix())
    session = sdk.sagemaker_session(sdk.offline_boto_session(), endpoint_url=runtime.gateway.url,
                                    default_bucket=runtime.stack.artifacts_bucket)
    job = sdk.experiment_job(sdk.offline_settings(), f"s3://{runtime.stack.data_bucket}/{prefix}",
                             sagemaker_session=session, training={"max_iter": 2, "seed": 1})
    started = time.monotonic()
    job.fit(wait=True)
    described = runtime.client("sagemaker").describe_training_job(TrainingJobName=job.job_name)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert job.estimator.model_data == described["ModelArtifacts"]["S3ModelArtifacts"]
    bucket, _, key = job.estimator.model_data.removeprefix("s3://").partition("/")
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0
    # The metric definitions are the pipeline's: the job's log lines became its final metrics.
    assert "train:loss" in {m["MetricName"] for m in described["FinalMetricDataList"]}
    assert described["HyperParameters"]["max_iter"] == "2"
    print(f"estimator.fit(wait=True) through the offline gateway: {time.monotonic() - started:.1f} s")
