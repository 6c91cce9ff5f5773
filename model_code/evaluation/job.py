"""The evaluation processing job: challenger (and champion) on the same val split, one report.

``python -m model_code.evaluation.job`` with SageMaker processing's layout::

    <root>/processing/input/challenger/   model directory, or a directory holding model.tar.gz
    <root>/processing/input/champion/     optional, same forms
    <root>/processing/input/dataset/      dataset version (manifest.json, annotations/, images/); the val split is read
    <root>/processing/output/evaluation.json   the report the quality gate reads
    <root>/processing/output/report/           PR curves and sample predictions of both models

``<root>`` is ``$D2OPS_ML_ROOT`` (default ``/opt/ml``). On failure the reason goes to
``<root>/output/message`` and the exit code is 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from pathlib import Path

from d2ops_core import images as rule
from d2ops_core.gate import GateSettingError, read_job_environment
from d2ops_core.metrics import primary_metric
from d2ops_core.s3_layout import EVALUATION_REPORT_NAME
from model_code.artifact import ArtifactError, LoadedDetector, load_artifact, write_json
from model_code.dataset_version import DatasetError, open_dataset_version, read_coco
from model_code.evaluation.coco import Evaluation, evaluate_detector, print_progress
from model_code.evaluation.comparison import comparison_html, evaluation_report
from model_code.evaluation.held_out import held_out
from model_code.evaluation.monitoring_baseline import write_monitoring_baseline

MAX_MESSAGE = 1000
# The processing input holding the snapshot, named as the training job's channel (prepare_training's
# DATASET_CHANNEL): the whole dataset version, downloaded once; the job reads its val split.
DATASET_INPUT = "dataset"


class EvaluationError(Exception):
    """The inputs do not fit together (no challenger, classes the val split does not have)."""


def find_model(directory: Path) -> Path:
    """A model directory as given, or the single model.tar.gz (or *.tar.gz) inside it."""
    if (directory / "metadata.json").is_file():
        return directory
    archives = sorted(directory.glob("*.tar.gz"))
    if len(archives) == 1:
        return archives[0]
    if not archives:
        raise EvaluationError(f"{directory}: neither a model directory (metadata.json) nor a model.tar.gz")
    raise EvaluationError(f"{directory}: several archives {[a.name for a in archives]}; expected one model.tar.gz")


def load_model(root: Path, name: str) -> LoadedDetector | None:
    directory = root / "processing" / "input" / name
    if not directory.exists():
        return None
    return load_artifact(find_model(directory))


def evaluate(root: Path, sample_images: int = 6) -> dict[str, object]:
    try:  # the job's Environment (MaxImagePixels): a bad limit fails the job at once, naming the variable
        rule.max_pixels()
        gate = read_job_environment(os.environ)  # GATE_*: the plan's gate settings for the bootstrap
    except (rule.PixelLimitError, GateSettingError) as exc:
        raise EvaluationError(str(exc)) from None
    challenger = load_model(root, "challenger")
    if challenger is None:
        raise EvaluationError(f"{root / 'processing/input/challenger'}: missing; the challenger model is required")
    champion = load_model(root, "champion")
    dataset = open_dataset_version(root / "processing" / "input" / DATASET_INPUT)
    gt = read_coco(dataset.val_json)
    gt_ids = {int(c["id"]) for c in gt["categories"]}
    for who, model in (("challenger", challenger), ("champion", champion)):
        if model is not None and not set(model.metadata.category_ids) <= gt_ids:
            raise EvaluationError(f"{who} predicts category ids {model.metadata.category_ids} but the val split "
                                  f"{dataset.val_json} has {sorted(gt_ids)}")
    results: dict[str, Evaluation] = {}
    for who, model in (("challenger", challenger), ("champion", champion)):
        if model is not None:
            print(f"evaluating the {who} ({model.metadata.model}, {model.metadata.framework}) on "
                  f"{len(gt['images'])} images", flush=True)
            results[who] = evaluate_detector(model, gt, dataset.images_dir, progress=print_progress(who))
    primary = primary_metric(challenger.metadata.task)
    compared = held = None
    if champion is not None:
        # Only val images neither model was trained on (by content) can tell them apart fairly: a champion
        # scored on images it learned from looks better than it is.
        compared, held = held_out(gt, dataset.images_dir, {"challenger": challenger.training_images,
                                                           "champion": champion.training_images})
        print(f"gate: {held.compared} of {len(gt['images'])} val images held out from both models"
              + "".join(f"; {e.images} left out: {e.reason.replace('_', ' ')}" for e in held.excluded)
              + "".join(f"; the {who} does not list its training images" for who in held.unverified), flush=True)
    # The challenger's thresholds travel to the Model Registry entry through the summarize Lambda.
    report = evaluation_report(gt, results["challenger"], results.get("champion"), primary, gate, compared=compared,
                               held=held, score_thresholds=challenger.metadata.score_thresholds)
    output = root / "processing" / "output"
    output.mkdir(parents=True, exist_ok=True)
    from model_code.evaluation.report import write_report

    # errors.json counts detections at each class's threshold: the artifact's score_thresholds (older
    # artifacts have none: getattr) so the matrix shows what the endpoint will answer
    thresholds = {who: getattr(m.metadata, "score_thresholds", None)
                  for who, m in (("challenger", challenger), ("champion", champion)) if m is not None}
    write_report(output / "report", results, gt, dataset.images_dir, sample_images=sample_images,
                 score_thresholds=thresholds,
                 comparison_section=comparison_html(report.comparison, report.held_out, gate))
    # The monitor's baseline, from the challenger's answers just made: once it is deployed, every window of
    # captured traffic is compared with this (docs/monitoring.md).
    write_monitoring_baseline(output, gt, dataset.images_dir, results["challenger"].results, challenger.metadata)
    document = report.model_dump(mode="json")
    write_json(output / EVALUATION_REPORT_NAME, document)  # last: its presence means the job's work is complete
    for who, ev in results.items():
        print(f"{who}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(ev.metrics.items())), flush=True)
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_code.evaluation.job", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.environ.get("D2OPS_ML_ROOT", "/opt/ml"), help="the /opt/ml root")
    parser.add_argument("--sample-images", type=int, default=6)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
    root = Path(args.root)
    message = root / "output" / "message"
    message.unlink(missing_ok=True)
    try:
        evaluate(root, args.sample_images)
        return 0
    except (EvaluationError, ArtifactError, DatasetError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}"
    print(f"evaluation failed: {reason}", file=sys.stderr, flush=True)
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_text(" ".join(reason.split())[:MAX_MESSAGE] + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
