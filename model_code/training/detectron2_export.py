"""Export a trained detectron2 model to the artifact's framework-independent TorchScript signature.

The detectron2 model is traced with ``detectron2.export.TracingAdapter`` (the trace needs
only torch and torchvision ops at inference time) over ``model.inference(...,
do_postprocess=False)``. Everything detectron2's ``DefaultPredictor`` does outside that call
is the scripted :class:`Detectron2Signature` below, written to give the same answer:

- RGB -> the model's channel order (BGR for the model-zoo configs);
- ``ResizeShortestEdge(MIN_SIZE_TEST, MAX_SIZE_TEST)`` with detectron2's own output-shape
  arithmetic, resizing as PIL's bilinear filter does on uint8 images (antialiased when
  shrinking, rounded back to integers);
- ``detector_postprocess``: boxes scaled to the original size, clipped, empty boxes dropped,
  and each 28x28 mask pasted into the image with detectron2's ``grid_sample`` paste (not
  torchvision's, which places edges differently), thresholded at 0.5 by the shared
  inference code.

It runs and is tested without detectron2; tests/unit/test_detectron2_export.py and
tests/integration/test_detectron2_serving.py compare it with ``DefaultPredictor``.
"""

# No `from __future__ import annotations`: TorchScript reads the annotations at runtime.

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def resized_shape(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """detectron2's ``ResizeShortestEdge.get_output_shape``, operation for operation (its rounding included)."""
    size = float(min_size)
    scale = size / min(height, width)
    if height < width:
        new_h, new_w = size, scale * width
    else:
        new_h, new_w = scale * height, size
    if max(new_h, new_w) > max_size:
        scale = max_size * 1.0 / max(new_h, new_w)
        new_h = new_h * scale
        new_w = new_w * scale
    return int(new_h + 0.5), int(new_w + 0.5)


def paste_mask(mask: Tensor, box: Tensor, height: int, width: int) -> Tensor:
    """One [M, M] mask probability map pasted into a [height, width] image at ``box`` (xyxy).

    detectron2's ``_do_paste_mask``: every image pixel centre is mapped into the box's
    coordinates and sampled bilinearly from the mask (``grid_sample``, zeros outside). Only
    the box's own region (plus one pixel) is sampled, as detectron2 does on CPU.
    """
    out = torch.zeros(height, width, dtype=torch.float32, device=mask.device)
    x0_int = max(int(torch.floor(box[0]).item()) - 1, 0)
    y0_int = max(int(torch.floor(box[1]).item()) - 1, 0)
    x1_int = min(int(torch.ceil(box[2]).item()) + 1, width)
    y1_int = min(int(torch.ceil(box[3]).item()) + 1, height)
    if x1_int <= x0_int or y1_int <= y0_int:
        return out
    img_y = torch.arange(y0_int, y1_int, device=mask.device, dtype=torch.float32) + 0.5
    img_x = torch.arange(x0_int, x1_int, device=mask.device, dtype=torch.float32) + 0.5
    img_y = (img_y - box[1]) / (box[3] - box[1]) * 2 - 1
    img_x = (img_x - box[0]) / (box[2] - box[0]) * 2 - 1
    gx = img_x[None, :].expand(img_y.shape[0], img_x.shape[0])
    gy = img_y[:, None].expand(img_y.shape[0], img_x.shape[0])
    grid = torch.stack([gx, gy], dim=2)[None]
    sampled = F.grid_sample(mask[None, None].float(), grid, align_corners=False)
    out[y0_int:y1_int, x0_int:x1_int] = sampled[0, 0]
    return out


class Detectron2Signature(nn.Module):
    """uint8 RGB [3, H, W] images in; boxes/scores/labels(/masks) in original pixels out.

    ``inner`` takes one float [3, h, w] image in the model's channel order at the resized
    size and returns (boxes [N, 4] in that size, scores [N], classes [N] 0-based, and with
    masks, mask probabilities [N, 1, M, M] per box), the flattened output of TracingAdapter.
    """

    bgr: torch.jit.Final[bool]
    has_masks: torch.jit.Final[bool]
    min_size: torch.jit.Final[int]
    max_size: torch.jit.Final[int]

    def __init__(self, inner: nn.Module, *, bgr: bool, has_masks: bool, min_size: int, max_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.bgr = bgr
        self.has_masks = has_masks
        self.min_size = min_size
        self.max_size = max_size

    def resize(self, image: Tensor, new_h: int, new_w: int) -> Tensor:
        x = image.float()
        if self.bgr:
            x = x.flip(0)
        if new_h == image.shape[1] and new_w == image.shape[2]:
            return x
        # detectron2 resizes the uint8 image with PIL's bilinear filter: antialiased when shrinking, and
        # the model sees the rounded integers. torch's antialiased bilinear follows PIL's kernel.
        x = F.interpolate(x[None], size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)[0]
        return x.round().clamp(0, 255)

    def forward(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        results: list[dict[str, Tensor]] = []
        for image in images:
            height, width = image.shape[1], image.shape[2]
            new_h, new_w = resized_shape(height, width, self.min_size, self.max_size)
            outputs = self.inner(self.resize(image, new_h, new_w))
            boxes = outputs[0].clone()
            boxes[:, 0::2] = (boxes[:, 0::2] * (width / new_w)).clamp(0, width)
            boxes[:, 1::2] = (boxes[:, 1::2] * (height / new_h)).clamp(0, height)
            # detector_postprocess drops boxes that clipping left empty.
            keep = torch.nonzero((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).flatten()
            scores = outputs[1][keep]
            # detectron2 already returns them by descending score; a stable sort keeps its order on ties.
            order = keep[torch.argsort(scores, descending=True, stable=True)]
            out = {"boxes": boxes[order], "scores": outputs[1][order], "labels": outputs[2].long()[order]}
            if self.has_masks:
                probabilities = outputs[3][order][:, 0]
                masks = torch.zeros(order.shape[0], height, width, dtype=torch.float32, device=image.device)
                for i in range(order.shape[0]):
                    masks[i] = paste_mask(probabilities[i], out["boxes"][i], height, width)
                out["masks"] = masks
            results.append(out)
        return results


def _adapter(cfg: Any, model: nn.Module, *, has_masks: bool, device: str) -> tuple[nn.Module, Tensor]:
    """detectron2's TracingAdapter over ``model.inference(..., do_postprocess=False)``, and a blank image at the
    test size, on ``device`` (on CPU the model itself moves there; for another device a copy does)."""
    from detectron2.export import TracingAdapter

    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    model = model.eval().cpu() if device == "cpu" else copy.deepcopy(model).eval().to(device)
    sample = torch.zeros(3, int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MIN_SIZE_TEST), device=device)

    def inference(m: Any, inputs: list[dict[str, Tensor]]) -> Any:
        instances = m.inference(inputs, do_postprocess=False)[0]
        fields = [instances.pred_boxes.tensor, instances.scores, instances.pred_classes]
        return fields + ([instances.pred_masks] if has_masks else [])

    return TracingAdapter(model, [{"image": sample}], inference_func=inference), sample


def _signature(cfg: Any, inner: nn.Module, has_masks: bool) -> Detectron2Signature:
    return Detectron2Signature(inner, bgr=cfg.INPUT.FORMAT == "BGR", has_masks=has_masks,
                               min_size=int(cfg.INPUT.MIN_SIZE_TEST), max_size=int(cfg.INPUT.MAX_SIZE_TEST))


def eager_signature(cfg: Any, model: nn.Module, *, has_masks: bool) -> Detectron2Signature:
    """The artifact's signature around the eager model on CPU: what torch.export is given (model_forms)."""
    adapter, _ = _adapter(cfg, model, has_masks=has_masks, device="cpu")
    return _signature(cfg, adapter, has_masks).eval()


def export_detectron2(cfg: Any, model: nn.Module, *, has_masks: bool, device: str = "cpu"
                      ) -> torch.jit.ScriptModule:
    """Trace ``model`` (a detectron2 GeneralizedRCNN in eval mode) into the artifact signature.

    The trace is taken on a blank image at the test size: its control flow does not depend on
    the image's content or size (detectron2's tracing-aware code keeps shapes symbolic), which
    the export tests check on other sizes and real detections. It runs only on ``device``
    (artifact.CUDA_MODEL_FILE says why): on CPU the model itself moves there; for another
    device a copy is traced, so the CPU trace's weights stay where they are.
    """
    adapter, sample = _adapter(cfg, model, has_masks=has_masks, device=device)
    with torch.no_grad():
        traced = torch.jit.trace(adapter, (sample,), check_trace=False)
    return torch.jit.script(_signature(cfg, traced, has_masks))


def export_and_evaluate(cfg: Any, model: nn.Module, job: dict[str, Any]) -> None:
    """Trace the trained detectron2 model, write the artifact and evaluate it through the artifact."""
    from d2ops_core.dataset_identity import DatasetVersion
    from d2ops_core.gate import DEFAULT_MIN_CLASS_INSTANCES
    from d2ops_core.metrics import primary_metric
    from model_code import artifact, model_forms
    from model_code.dataset_version import annotated_image_sha256, read_coco
    from model_code.evaluation.coco import evaluate_detector, print_progress
    from model_code.evaluation.documents import model_evaluation_document
    from model_code.evaluation.report import write_report
    from model_code.evaluation.thresholds import REPORT_FILE as THRESHOLDS_REPORT
    from model_code.evaluation.thresholds import fit_for_artifact

    has_masks = job["task"] == "instance_segmentation"
    # Serving on a GPU needs a trace taken on one; the CPU trace is what evaluation and CPU hosts load.
    cuda_module = (export_detectron2(cfg, model, has_masks=has_masks, device=artifact.TRACED_CUDA_DEVICE)
                   if torch.cuda.is_available() else None)
    module = export_detectron2(cfg, model, has_masks=has_masks)
    model_dir = Path(job["model_dir"])
    model_dir.mkdir(parents=True, exist_ok=True)
    # torch.export / AOTInductor beside the trace, where they export (model_forms; the reason where not).
    forms = model_forms.write_forms(
        model_dir, eager_signature(cfg, model, has_masks=has_masks),
        torch.zeros(3, int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MIN_SIZE_TEST), dtype=torch.uint8),
        aoti=model_forms.aoti_requested())
    print(forms.summary(), flush=True)
    train_reg, val_reg = job["registrations"]
    # category_ids[label] must be the dataset id detectron2 mapped to that contiguous label.
    mapping = {int(k): int(v) for k, v in train_reg["thing_dataset_id_to_contiguous_id"].items()}
    ids = sorted(mapping, key=mapping.__getitem__)
    # The artifact holds only what serving loads; the native checkpoint (for fine-tuning) and the
    # report go to the output data directory, which SageMaker packs as the job's output.tar.gz.
    out = Path(job["output_data_dir"])
    out.mkdir(parents=True, exist_ok=True)
    final = Path(cfg.OUTPUT_DIR) / "model_final.pth"
    config_file = Path(cfg.OUTPUT_DIR) / "config.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(cfg.dump())
    checkpoint = artifact.copy_native_checkpoint(out, [p for p in (final, config_file) if p.is_file()])
    metadata = artifact.ArtifactMetadata(
        framework="detectron2", task=job["task"], model=job["source"]["location"],
        class_names=train_reg["thing_classes"], category_ids=ids, training_job=job["job_name"],
        dataset=DatasetVersion(name=job["dataset_name"], version=job["dataset_version"],
                               inventory_digest=job.get("inventory_digest")), checkpoint=checkpoint,
        initial_weights=job.get("initial_weights"), forms=forms.forms, export_problems=forms.problems,
        aoti_device=forms.aoti_device)
    artifact.save_artifact(model_dir, module, metadata, cuda_module=cuda_module)
    # What it trained on, by content: the evaluation job keeps these images out of the comparison.
    artifact.write_training_images(model_dir, annotated_image_sha256(Path(train_reg["json_file"]),
                                                                      Path(train_reg["image_root"])))
    detector = artifact.load_artifact(model_dir)  # evaluate the file that ships, not the module in memory
    gt = read_coco(Path(val_reg["json_file"]))
    evaluation = evaluate_detector(detector, gt, Path(val_reg["image_root"]), progress=print_progress("evaluating"))
    document = model_evaluation_document(evaluation, primary_metric(job["task"]))
    # The operating point ships with the model: each class's best-F1 score on this same val split (the pooled
    # one below MinClassInstances val objects), its F1 estimated out-of-fold.
    fits = fit_for_artifact(gt, evaluation.results, metadata.class_names, has_masks=has_masks,
                            min_class_instances=int(job.get("min_class_instances", DEFAULT_MIN_CLASS_INSTANCES)))
    thresholds = fits.score_thresholds()
    artifact.write_json(model_dir / artifact.EVALUATION_FILE, document)
    artifact.write_json(model_dir / artifact.METADATA_FILE,
                        metadata.model_copy(update={"metrics": evaluation.metrics, "score_thresholds": thresholds})
                        .model_dump(mode="json"))
    write_report(out / artifact.REPORT_DIR, {"challenger": evaluation}, gt, Path(val_reg["image_root"]),
                 sample_images=int(job.get("report_images", 6)), score_thresholds={"challenger": thresholds})
    artifact.write_json(out / artifact.REPORT_DIR / THRESHOLDS_REPORT, fits.model_dump(mode="json"))
    artifact.write_json(out / artifact.EVALUATION_FILE, document)
    from d2ops_core import metrics as metric_lines
    for name, value in sorted(evaluation.metrics.items()):
        print(metric_lines.format_metric_line(f"val:{name}", value), flush=True)
