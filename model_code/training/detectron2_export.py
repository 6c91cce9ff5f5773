"""Export a trained detectron2 model to the artifact's framework-independent TorchScript signature.

The detectron2 model is traced with ``detectron2.export.TracingAdapter`` (the trace needs
only torch and torchvision ops at inference time) on one preprocessed image; everything
around it, which detectron2 does outside the model (shortest-edge resize, RGB->BGR,
boxes back to the original size, masks pasted into the image), is the scripted
:class:`Detectron2Signature` below, which runs and is tested without detectron2.
"""

# No `from __future__ import annotations`: TorchScript reads the annotations at runtime.

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.roi_heads import paste_masks_in_image


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

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        # detectron2's ResizeShortestEdge: the short side to min_size unless the long side passes max_size.
        scale = self.min_size / min(height, width)
        if max(height, width) * scale > self.max_size:
            scale = self.max_size / max(height, width)
        return int(height * scale + 0.5), int(width * scale + 0.5)

    def forward(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        results: list[dict[str, Tensor]] = []
        for image in images:
            height, width = image.shape[1], image.shape[2]
            new_h, new_w = self.resized_shape(height, width)
            x = image.float()
            if self.bgr:
                x = x.flip(0)
            x = F.interpolate(x[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
            outputs = self.inner(x)
            boxes = outputs[0].clone()
            boxes[:, 0::2] = (boxes[:, 0::2] * (width / new_w)).clamp(0, width)
            boxes[:, 1::2] = (boxes[:, 1::2] * (height / new_h)).clamp(0, height)
            scores = outputs[1]
            order = torch.argsort(scores, descending=True)
            out = {"boxes": boxes[order], "scores": scores[order], "labels": outputs[2].long()[order]}
            if self.has_masks:
                masks = paste_masks_in_image(outputs[3][order], boxes[order], (height, width))
                out["masks"] = masks[:, 0]
            results.append(out)
        return results


def export_and_evaluate(cfg: Any, model: nn.Module, job: dict[str, Any]) -> None:  # pragma: no cover
    """Trace the trained detectron2 model, write the artifact and evaluate it through the artifact."""
    from detectron2.export import TracingAdapter

    from model_code import artifact
    from model_code.dataset_version import read_coco
    from model_code.evaluation.coco import evaluate_detector, print_progress
    from model_code.evaluation.documents import model_evaluation_document, primary_metric_for
    from model_code.evaluation.report import write_report

    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    model.eval().cpu()
    has_masks = job["task"] == "instance_segmentation"
    sample = torch.zeros(3, cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST)

    def inference(m: Any, inputs: list[dict[str, Tensor]]) -> Any:
        instances = m.inference(inputs, do_postprocess=False)[0]
        fields = [instances.pred_boxes.tensor, instances.scores, instances.pred_classes]
        return fields + ([instances.pred_masks] if has_masks else [])

    adapter = TracingAdapter(model, [{"image": sample}], inference_func=inference)
    traced = torch.jit.trace(adapter, (sample,))
    module = torch.jit.script(Detectron2Signature(
        traced, bgr=cfg.INPUT.FORMAT == "BGR", has_masks=has_masks,
        min_size=int(cfg.INPUT.MIN_SIZE_TEST), max_size=int(cfg.INPUT.MAX_SIZE_TEST)))
    train_reg, val_reg = job["registrations"]
    ids = sorted(int(k) for k in train_reg["thing_dataset_id_to_contiguous_id"])
    metadata = artifact.ArtifactMetadata(
        framework="detectron2", task=job["task"], model=job["source"]["location"],
        class_names=train_reg["thing_classes"], category_ids=ids, training_job=job["job_name"],
        dataset=artifact.DatasetRef(name=job["dataset_name"], version=job["dataset_version"]))
    model_dir = Path(job["model_dir"])
    artifact.save_artifact(model_dir, module, metadata)
    final = Path(cfg.OUTPUT_DIR) / "model_final.pth"
    config_file = Path(cfg.OUTPUT_DIR) / "config.yaml"
    config_file.write_text(cfg.dump())
    artifact.copy_native_checkpoint(model_dir, [p for p in (final, config_file) if p.is_file()])
    detector = artifact.load_artifact(model_dir)
    gt = read_coco(Path(val_reg["json_file"]))
    evaluation = evaluate_detector(detector, gt, Path(val_reg["image_root"]), progress=print_progress("evaluating"))
    document = model_evaluation_document(evaluation, primary_metric_for(job["task"]))
    artifact.write_json(model_dir / artifact.EVALUATION_FILE, document)
    artifact.write_json(model_dir / artifact.METADATA_FILE,
                        metadata.model_copy(update={"metrics": evaluation.metrics}).model_dump(mode="json"))
    write_report(model_dir / artifact.REPORT_DIR, {"challenger": evaluation}, gt, Path(val_reg["image_root"]))
    out = Path(job["output_data_dir"])
    out.mkdir(parents=True, exist_ok=True)
    artifact.write_json(out / artifact.EVALUATION_FILE, document)
    from d2ops import metrics as metric_lines

    for name, value in sorted(evaluation.metrics.items()):
        print(metric_lines.format_metric_line(f"val:{name}", value), flush=True)
