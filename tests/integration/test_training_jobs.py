"""The real training entry point as local SageMaker-style jobs: accuracy, multi-host, spot resume, failures.

Timings and the calibration behind the numbers: docs/training.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from pathlib import Path

import pytest

from d2ops import synth
from d2ops.local.jobs import JobResult, ProcessingJobSpec, TrainingJobSpec, run_processing_job, run_training_job
from d2ops.offline.log_progress import ProgressParser
from d2ops_core.cpu_profile import CALIBRATION_DATA, TORCHVISION_CPU_PROFILE
from d2ops_core.documents.error_analysis import ErrorAnalysis
from d2ops_core.documents.evaluation import EvaluationReport, ModelEvaluation
from d2ops_core.documents.monitoring import MonitoringBaseline
from model_code.artifact import load_artifact
from model_code.inference import image_to_tensor, predict
from tests.fixtures.weights import saved_model_state, tensors_digest

# On an idle 2-core machine the calibrated run takes a few minutes; shared with other heavy work
# (load average 8-13) the same run took over 20, hence the generous limit.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

# The CPU profile on its calibration data (docs/training.md, "Calibration").
CALIBRATED = TORCHVISION_CPU_PROFILE | {"checkpoint_period": "50", "log_period": "25", "report_images": "3"}
MIN_AP50 = 0.6  # measured well above it on every seed tried (docs/training.md); margin for run-to-run variation
TINY = CALIBRATED | {"max_iter": "12", "warmup_iters": "2", "checkpoint_period": "3", "log_period": "1",
                     "min_size": "64", "max_size": "64"}
_LOSS_LINE = re.compile(r"iter (\d+)/\d+ loss ([\d.]+)")
_DIGEST = re.compile(r"^\[(algo-\d+)\] rank (\d+) final weights sha256 ([0-9a-f]+)$")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    synth.generate(root, **CALIBRATION_DATA)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    synth.generate(root, images=12, size=64, seed=2)
    return root


def job(tmp: Path, dataset: Path, hps: dict[str, str], hosts: int = 1, **kw) -> TrainingJobSpec:
    return TrainingJobSpec(job_name="test-job", channels=kw.pop("channels", {"dataset": dataset}),
                           work_dir=tmp / "hosts", output_dir=tmp / "out", hyperparameters=hps,
                           instance_count=hosts, **kw)


_FITTED = re.compile(r"score threshold '(\w+)': [01]\.\d{4}, F1 ")


def losses(lines: list[str]) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in map(_LOSS_LINE.search, lines) if m}


def check_artifact(result: JobResult) -> ModelEvaluation:
    assert result.status == "Completed", result.failure_reason
    assert result.model_artifact and result.output_artifact
    detector = load_artifact(result.model_artifact)
    assert detector.metadata.class_names == ["square", "disc", "triangle"]
    assert detector.metadata.category_ids == [1, 2, 3] and detector.metadata.framework == "torchvision"
    evaluation = detector.evaluation
    assert evaluation is not None and evaluation.primary_metric == "bbox_AP" and evaluation.val_images == 40
    # the metric lines SageMaker would scrape carry the same numbers as the artifact's evaluation
    assert result.metrics["val:bbox_AP50"] == pytest.approx(evaluation.metrics["bbox_AP50"], abs=1e-6)
    assert detector.metadata.metrics == evaluation.metrics
    # the export chose a score threshold for every class on the same val split (model_code/evaluation/thresholds.py)
    assert set(detector.metadata.score_thresholds) == {"square", "disc", "triangle"}
    assert all(0.0 <= t <= 1.0 for t in detector.metadata.score_thresholds.values())
    assert "train:loss" in result.metrics
    with tarfile.open(result.model_artifact) as tar:
        names = set(tar.getnames())
    # the served artifact is what serving loads, and what it trained on (docs/model-artifact.md)
    assert names == {"model.pt", "metadata.json", "evaluation.json", "training_images.txt"}
    # the fine-tuning checkpoint and the report travel in output.tar.gz, named by the metadata
    checkpoint = detector.metadata.checkpoint
    assert checkpoint is not None and checkpoint.archive == "output.tar.gz"
    assert "checkpoint/model_final.pth" in checkpoint.files
    with tarfile.open(result.output_artifact) as tar:
        out_names = set(tar.getnames())
    assert {"evaluation.json", "report/pr_curves.png", "report/index.html", *checkpoint.files} <= out_names
    # the report's error analysis counts detections at the thresholds the model ships with, not at 0.5
    with tarfile.open(result.output_artifact) as tar:
        member = tar.extractfile("report/errors.json")
        assert member is not None
        errors = ErrorAnalysis.model_validate_json(member.read())
    assert errors.models["challenger"].thresholds_from == "artifact"
    assert errors.models["challenger"].score_thresholds == detector.metadata.score_thresholds
    return evaluation


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory, shapes: Path) -> tuple[Path, JobResult, list[str]]:
    """The calibrated run on two hosts of one process each, meeting over gloo: the accuracy bar."""
    tmp = tmp_path_factory.mktemp("two-hosts")
    lines: list[str] = []
    result = run_training_job(job(tmp, shapes, CALIBRATED, hosts=2), log=lines.append)
    return tmp, result, lines


def test_two_hosts_train_one_model_together_and_reach_the_calibrated_ap50(
        two_hosts: tuple[Path, JobResult, list[str]]) -> None:
    tmp, result, lines = two_hosts
    evaluation = check_artifact(result)
    assert result.exit_codes == {"algo-1": 0, "algo-2": 0}
    assert any("world 2 (2 hosts x 1), global batch 4 (2/worker)" in line for line in lines)
    # Each host saw its own half of every batch, yet both end with the same weights: the gradients were
    # averaged every step. Only the master host saves weights (one model, one checkpoint prefix), so the
    # test hashes what it saved with its own code (every tensor, names and bytes) and holds each host's
    # printed digest of what it ended with to that hash: a host that trained apart (no DDP), or a digest
    # that stopped depending on the weights, fails here.
    checkpoints = tmp / "hosts" / "algo-1" / "checkpoints"
    saved = tensors_digest(saved_model_state(checkpoints / "model_final.pth"))
    digests = {m[1]: (int(m[2]), m[3]) for m in map(_DIGEST.match, lines) if m}
    assert digests == {"algo-1": (0, saved), "algo-2": (1, saved)}, (digests, saved)
    # the last checkpoint and the fine-tuning checkpoint the job delivered (output.tar.gz) hold them too
    assert tensors_digest(saved_model_state(checkpoints / f"model_{int(CALIBRATED['max_iter']):07d}.pth")) == saved
    with tarfile.open(result.output_artifact) as tar:
        delivered = tar.extractfile("checkpoint/model_final.pth")
        assert delivered is not None
        (tmp / "delivered.pth").write_bytes(delivered.read())
    assert tensors_digest(saved_model_state(tmp / "delivered.pth")) == saved
    assert evaluation.metrics["bbox_AP50"] >= MIN_AP50, evaluation.metrics
    assert set(evaluation.per_class) == {"square", "disc", "triangle"}
    # A model this good has detections that take boxes of every class: each threshold is fitted on val (the
    # job's log says with what F1), not the no-evidence default.
    fitted = {m[1] for m in map(_FITTED.search, lines) if m}
    assert fitted == {"square", "disc", "triangle"}, [line for line in lines if "score threshold" in line]
    # only the master host writes the artifact and checkpoints
    assert not any((tmp / "hosts" / "algo-2" / "model").iterdir())
    assert not any((tmp / "hosts" / "algo-2" / "checkpoints").iterdir())


def test_two_hosts_logs_read_as_training_progress(two_hosts: tuple[Path, JobResult, list[str]]) -> None:
    """What `d2ops run` prints while it trains comes from these lines, both hosts' interleaved."""
    _, result, lines = two_hosts
    progress = ProgressParser()
    seen = [progress.progress.iteration for line in lines if progress.feed(line) and progress.progress]
    total = int(CALIBRATED["max_iter"])
    assert seen[0] == int(CALIBRATED["log_period"]) and max(seen) == total  # from the first logged iteration
    assert progress.host == "algo-1" and progress.progress.total == total
    assert progress.progress.loss == pytest.approx(result.metrics["train:loss"])
    assert progress.progress.images_per_second == pytest.approx(
        int(CALIBRATED["ims_per_batch"]) / result.metrics["train:iter_seconds"], rel=1e-4)


# The short one-host run: `d2ops train-local` below, and the uninterrupted reference of the SIGTERM test. The
# loss of every iteration logged; a checkpoint (about 220 MB with the optimizer state, fsynced) every 10.
SHORT = TINY | {"max_iter": "20", "checkpoint_period": "10"}


@pytest.fixture(scope="module")
def short_cli_run(tmp_path_factory: pytest.TempPathFactory, shapes: Path) -> tuple[Path, dict, list[str]]:
    """`d2ops train-local` as a user runs it, briefly: one host; its last line is the JSON summary."""
    out = tmp_path_factory.mktemp("cli")
    proc = subprocess.run([sys.executable, "-m", "d2ops", "train-local", str(shapes), str(out),
                           "--hyperparameters", json.dumps(SHORT)], capture_output=True, text=True, timeout=2300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[algo-1] iter 20/20" in proc.stderr
    return out, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr.splitlines()


def test_train_local_summarises_the_job_as_its_last_line(short_cli_run: tuple[Path, dict, list[str]],
                                                         shapes: Path) -> None:
    out, summary, _ = short_cli_run
    assert summary["status"] == "Completed" and summary["failure_reason"] is None
    detector = load_artifact(out / "model.tar.gz")
    assert detector.evaluation.metrics["bbox_AP50"] == pytest.approx(summary["bbox_AP50"], abs=1e-6)
    assert detector.metadata.model == "fasterrcnn_resnet18_fpn"
    # what it trained on, by content: exactly the train split's image files (the evaluation job holds them out)
    train = json.loads((shapes / "annotations" / "train.json").read_text())
    assert detector.training_images == {hashlib.sha256((shapes / "images" / im["file_name"]).read_bytes()).hexdigest()
                                        for im in train["images"]}


def test_evaluation_job_scores_challenger_and_champion_separately(
        tmp_path: Path, shapes: Path, two_hosts: tuple[Path, JobResult, list[str]],
        short_cli_run: tuple[Path, dict, list[str]]) -> None:
    _, trained, _ = two_hosts
    cli_out, _, _ = short_cli_run
    assert trained.model_artifact is not None
    champion_dir = tmp_path / "champion"
    champion_dir.mkdir()
    with tarfile.open(cli_out / "model.tar.gz") as tar:
        tar.extractall(champion_dir, filter="data")  # a model directory: the other accepted form
    result = run_processing_job(ProcessingJobSpec(
        job_name="eval", inputs={"challenger": trained.model_artifact, "champion": champion_dir, "dataset": shapes},
        work_dir=tmp_path / "root", output_dir=tmp_path / "eval-out"))
    assert result.status == "Completed", result.failure_reason
    report = json.loads((tmp_path / "eval-out" / "evaluation.json").read_text())
    assert report["primary_metric"] == "bbox_AP" and report["val_images"] == 40
    # The document the gate's Lambda reads (one model for writer and reader), with the val split's
    # instance counts the per-class gate needs.
    parsed = EvaluationReport.model_validate(report)
    val = json.loads((shapes / "annotations" / "val.json").read_text())
    names = {c["id"]: c["name"] for c in val["categories"]}
    counted = Counter(names[a["category_id"]] for a in val["annotations"] if not a.get("iscrowd"))
    assert parsed.class_instances == {name: counted[name] for name in names.values()}
    assert parsed.champion is not None and set(parsed.champion.per_class) <= set(parsed.class_instances)
    # Both models list the images they trained on, none of them in val: every val image is compared.
    assert parsed.held_out is not None and (parsed.held_out.compared, parsed.held_out.excluded,
                                            parsed.held_out.unverified) == (40, [], [])
    assert parsed.comparison is not None and parsed.comparison.val_images == 40
    # each model's numbers are its own: they match what its training job measured on the same split
    challenger_own = load_artifact(trained.model_artifact).evaluation.metrics
    champion_own = load_artifact(cli_out / "model.tar.gz").evaluation.metrics
    for name in ("bbox_AP", "bbox_AP50"):
        assert report["challenger"]["metrics"][name] == pytest.approx(challenger_own[name], abs=1e-6)
        assert report["champion"]["metrics"][name] == pytest.approx(champion_own[name], abs=1e-6)
    assert report["challenger"]["metrics"] != report["champion"]["metrics"]
    assert (tmp_path / "eval-out" / "report" / "pr_curves.png").stat().st_size > 1000
    # The monitor's baseline: the challenger's own answers on the same val images (docs/monitoring.md).
    baseline = MonitoringBaseline.model_validate_json((tmp_path / "eval-out" / "monitoring-baseline.json").read_text())
    assert baseline.images == 40 and baseline.class_names == load_artifact(trained.model_artifact).metadata.class_names
    assert len(baseline.distributions["brightness"]) == 40
    assert sum(baseline.distributions["boxes_per_image"]) == baseline.detections > 0
    assert (tmp_path / "eval-out" / "report" / "samples" / "champion_121.png").is_file()
    # The error analysis of both real models (report/errors.json): each class's matrix row holds its val
    # objects, AP by size is the report's own APs/APm/APl, the worst images are drawn for both models.
    errors = ErrorAnalysis.model_validate_json((tmp_path / "eval-out" / "report" / "errors.json").read_text())
    assert list(errors.models) == ["challenger", "champion"]
    for who, analysis in errors.models.items():
        rows = dict(zip(analysis.confusion.labels, analysis.confusion.counts, strict=True))
        assert {name: sum(rows[name]) for name in names.values()} == {n: counted[n] for n in names.values()}
        sizes = analysis.ap_by_size["bbox"]
        assert (sizes.small, sizes.medium, sizes.large) == tuple(
            report[who]["metrics"].get(f"bbox_AP{s}") for s in "sml")
        own = load_artifact(trained.model_artifact if who == "challenger" else cli_out / "model.tar.gz")
        assert analysis.thresholds_from == ("artifact" if getattr(own.metadata, "score_thresholds", None)
                                           else "default")
    for image in errors.gallery:
        assert all((tmp_path / "eval-out" / "report" / image.pictures[w]).is_file() for w in ("challenger", "champion"))

    missing = run_processing_job(ProcessingJobSpec(job_name="eval2", inputs={"dataset": shapes},
                                                   work_dir=tmp_path / "root2", output_dir=tmp_path / "o2"))
    assert missing.status == "Failed" and "challenger model is required" in (missing.failure_reason or "")


def test_sigterm_checkpoints_and_the_restart_continues_the_uninterrupted_run(
        tmp_path: Path, shapes: Path, short_cli_run: tuple[Path, dict, list[str]]) -> None:
    # the uninterrupted run: `d2ops train-local` with the same hyperparameters on the same data, one host
    reference_losses = losses(short_cli_run[2])
    assert sorted(reference_losses) == list(range(1, 21))

    stop = threading.Event()
    lines: list[str] = []

    def watch(line: str) -> None:
        lines.append(line)
        if "iter 3/20 " in line:
            stop.set()  # like a spot interruption: SIGTERM to every host, before any periodic checkpoint

    first = run_training_job(job(tmp_path, shapes, SHORT), stop=stop, log=watch)
    assert first.status == "Stopped" and first.exit_codes == {"algo-1": 143}
    stopped = [line for line in lines if "stopped by SIGTERM at iteration" in line]
    assert stopped, lines[-10:]
    at = int(stopped[0].split("iteration ")[1].split(";")[0])
    assert 3 <= at < 20
    checkpoints = tmp_path / "hosts" / "algo-1" / "checkpoints"
    assert (checkpoints / "last_checkpoint").read_text() == f"model_{at:07d}.pth"
    assert not (tmp_path / "hosts" / "algo-1" / "output" / "failure").exists()
    assert first.model_artifact is None
    first_losses = losses(lines)

    lines.clear()
    second = run_training_job(job(tmp_path, shapes, SHORT), log=lines.append)
    assert second.status == "Completed", second.failure_reason
    # the path as the job sees it: /opt/ml/checkpoints in its own mount namespace, else the remapped tree
    resumed = (f"checkpoints/model_{at:07d}.pth at iteration {at}")
    assert any("resuming from " in line and resumed in line for line in lines), lines[:10]
    assert any(f"iterations {at}..20" in line for line in lines)
    resumed_losses = losses(lines)
    assert sorted(resumed_losses) == list(range(at + 1, 21))  # nothing before the checkpoint is redone
    # Interrupted + resumed is the uninterrupted run: same images, flips, sampling and weights, so the
    # same loss at every iteration (a run that restarted its data order or RNG would drift at once).
    for iteration, loss in (first_losses | resumed_losses).items():
        assert loss == pytest.approx(reference_losses[iteration], rel=1e-3, abs=1e-4), iteration
    assert load_artifact(second.model_artifact).metadata.model == "fasterrcnn_resnet18_fpn"


def test_instance_segmentation_trains_on_the_synthetic_polygons(tmp_path: Path) -> None:
    dataset = tmp_path / "masks"
    synth.generate(dataset, images=12, size=64, seed=3)
    manifest = json.loads((dataset / "manifest.json").read_text())
    (dataset / "manifest.json").write_text(json.dumps(manifest | {"task": "instance_segmentation"}))
    # two iterations: Mask R-CNN trained on the polygons' masks, exported and evaluated (no accuracy bar here)
    hps = TINY | {"model": "maskrcnn_resnet18_fpn", "max_iter": "2", "checkpoint_period": "100"}
    result = run_training_job(job(tmp_path, dataset, hps))
    assert result.status == "Completed", result.failure_reason
    detector = load_artifact(result.model_artifact)
    assert detector.metadata.task == "instance_segmentation" and detector.metadata.model == "maskrcnn_resnet18_fpn"
    assert detector.evaluation.primary_metric == "segm_AP" and "segm_AP" in detector.evaluation.metrics
    from PIL import Image

    val = json.loads((dataset / "annotations" / "val.json").read_text())
    with Image.open(dataset / "images" / val["images"][0]["file_name"]) as image:
        detections = predict(detector, [image_to_tensor(image.convert("RGB"))])[0]
    assert detections.masks is not None and detections.masks.shape[1:] == (64, 64)


def failed(result: JobResult, tmp_path: Path, expected: str) -> str:
    assert result.status == "Failed" and result.exit_codes == {"algo-1": 1}
    failure = (tmp_path / "hosts" / "algo-1" / "output" / "failure").read_text()
    assert expected in failure and expected in (result.failure_reason or "")
    assert failure.count("\n") == 1  # one line, as SageMaker shows it
    assert result.model_artifact is None
    return failure


def test_bad_hyperparameters_fail_with_a_clear_reason(tmp_path: Path, tiny: Path) -> None:
    result = run_training_job(job(tmp_path, tiny, TINY | {"max_iters": "5", "base_lr": "fast"}))
    reason = failed(result, tmp_path, "unknown hyperparameter 'max_iters'")
    assert "hyperparameter base_lr='fast'" in reason


def test_missing_channel_fails_with_a_clear_reason(tmp_path: Path, tiny: Path) -> None:
    """A job given the old train/val channels (a custom request, say) is told the one channel it needs."""
    result = run_training_job(job(tmp_path, tiny, TINY, channels={"train": tiny, "val": tiny}))
    failed(result, tmp_path, "input channel 'dataset' is missing: the job has channels ['train', 'val']")


def test_corrupt_checkpoint_fails_with_a_clear_reason(tmp_path: Path, tiny: Path) -> None:
    checkpoints = tmp_path / "hosts" / "algo-1" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "model_0000006.pth").write_bytes(b"PK\x03\x04 truncated upload")
    (checkpoints / "last_checkpoint").write_text("model_0000006.pth")
    result = run_training_job(job(tmp_path, tiny, TINY))
    failed(result, tmp_path, "model_0000006.pth: corrupt or unreadable checkpoint")


def test_a_diverging_run_fails_with_what_to_change(tmp_path: Path, tiny: Path) -> None:
    # far past the stable range, unclipped and without warm-up: the loss or the gradient stops being finite
    hps = TINY | {"base_lr": "10", "clip_grad_norm": "0", "warmup_iters": "0", "momentum": "0.99"}
    result = run_training_job(job(tmp_path, tiny, hps))
    reason = failed(result, tmp_path, "TrainingError: ")
    assert re.search(r"(loss|gradient norm) is (nan|inf|-inf) at iteration \d+", reason), reason
    assert "lower base_lr (now 10)" in reason
