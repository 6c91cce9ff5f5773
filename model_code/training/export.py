"""From a trained torchvision model to the artifact, evaluated through the artifact itself."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from d2ops_core.dataset_identity import DatasetVersion
from d2ops_core.metrics import primary_metric
from model_code import artifact, model_forms
from model_code.dataset_version import annotated_image_sha256, read_coco
from model_code.evaluation.coco import Evaluation, evaluate_detector, print_progress
from model_code.evaluation.documents import model_evaluation_document
from model_code.evaluation.thresholds import REPORT_FILE as THRESHOLDS_REPORT
from model_code.evaluation.thresholds import fit_for_artifact
from model_code.training.run_context import RunContext
from model_code.training.torchvision_export import ExportedTorchvisionDetector, export_torchvision


def write_artifact(ctx: RunContext, model: nn.Module, directory: Path, *, iteration: int, report: bool,
                   native_files: list[Path] | None = None) -> Evaluation:
    """Export, save, reload from disk, evaluate on val; what is evaluated is the file that ships.

    The artifact holds only what serving loads (model.pt, where they export model.pt2 / model.aoti.pt2,
    metadata.json, evaluation.json); the
    native checkpoint and the report go to the output data directory (the job's output.tar.gz).
    """
    out = ctx.env.output_data_dir
    checkpoint = artifact.copy_native_checkpoint(out, native_files) if native_files else None
    metadata = artifact.ArtifactMetadata(
        framework="torchvision", task=ctx.dataset.task, model=ctx.model_name, class_names=ctx.categories.names,
        category_ids=ctx.categories.ids, training_job=ctx.env.job_name,
        dataset=DatasetVersion(name=ctx.dataset.name, version=ctx.dataset.version,
                               inventory_digest=ctx.hp.inventory_digest), checkpoint=checkpoint)
    module = export_torchvision(model, ctx.has_masks)
    directory.mkdir(parents=True, exist_ok=True)
    # torch.export / AOTInductor beside the TorchScript file, where they export (model_forms; the reason where
    # not): for the artifact that ships (report), not for each periodic evaluation's throw-away copy.
    forms = model_forms.ExportOutcome()
    if report:
        forms = model_forms.write_forms(directory, ExportedTorchvisionDetector(model, ctx.has_masks).eval(),
                                        torch.zeros(3, 64, 64, dtype=torch.uint8), aoti=model_forms.aoti_requested())
        print(forms.summary(), flush=True)
    metadata = metadata.model_copy(update={"forms": forms.forms, "export_problems": forms.problems,
                                           "aoti_device": forms.aoti_device})
    artifact.save_artifact(directory, module, metadata)
    artifact.write_training_images(directory, training_images(ctx))
    detector = artifact.load_artifact(directory)
    gt = read_coco(ctx.val_dataset.val_json)
    evaluation = evaluate_detector(detector, gt, ctx.val_dataset.images_dir,
                                   progress=print_progress(f"evaluating iteration {iteration}"))
    document = model_evaluation_document(evaluation, primary_metric(ctx.dataset.task), iteration=iteration)
    # The operating point ships with the model: each class's best-F1 score on this same val split (the pooled
    # one below MinClassInstances val objects), its F1 estimated out-of-fold.
    fits = fit_for_artifact(gt, evaluation.results, metadata.class_names, has_masks=ctx.has_masks,
                            min_class_instances=ctx.hp.min_class_instances)
    thresholds = fits.score_thresholds()
    artifact.write_json(directory / artifact.EVALUATION_FILE,  document)
    artifact.write_json(directory / artifact.METADATA_FILE,
                        metadata.model_copy(update={"metrics": evaluation.metrics, "score_thresholds": thresholds})
                        .model_dump(mode="json"))
    if report:
        from model_code.evaluation.report import write_report

        out.mkdir(parents=True, exist_ok=True)
        write_report(out / artifact.REPORT_DIR, {"challenger": evaluation}, gt, ctx.val_dataset.images_dir,
                     sample_images=ctx.hp.report_images, score_thresholds={"challenger": thresholds})
        artifact.write_json(out / artifact.REPORT_DIR / THRESHOLDS_REPORT, fits.model_dump(mode="json"))
        artifact.write_json(out / artifact.EVALUATION_FILE, document)
    return evaluation


def training_images(ctx: RunContext) -> set[str]:
    """SHA-256 of each train image's bytes (artifact.TRAINING_IMAGES_FILE); a derived split's are hashed already.

    Periodic evaluations hash them again: a train image costs ~0.1 ms to hash (100 KB), a val image
    hundreds of times that to run through the detector.
    """
    return annotated_image_sha256(ctx.dataset.train_json, ctx.dataset.images_dir, known=ctx.dataset.image_sha256)
