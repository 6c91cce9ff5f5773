"""Export a torchvision detector to the artifact's framework-independent TorchScript signature."""

# No `from __future__ import annotations` here: TorchScript reads the annotations at runtime.


import torch
from torch import Tensor, nn


class ExportedTorchvisionDetector(nn.Module):
    """Wraps a torchvision (Mask|Faster) R-CNN: uint8 RGB images in, 0-based labels out.

    torchvision models reserve label 0 for the background and expect floats in [0, 1];
    the artifact's signature takes uint8 images and numbers classes from 0.
    """

    has_masks: torch.jit.Final[bool]

    def __init__(self, model: nn.Module, has_masks: bool) -> None:
        super().__init__()
        self.model = model
        self.has_masks = has_masks

    def forward(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        floats = [image.float() / 255.0 for image in images]
        if torch.jit.is_scripting():
            _, detections = self.model(floats)  # scripted torchvision detectors return (losses, detections)
        else:
            detections = self.model(floats)  # eager ones in eval mode only the detections (what torch.export runs)
        results: list[dict[str, Tensor]] = []
        for det in detections:
            out = {"boxes": det["boxes"], "scores": det["scores"], "labels": det["labels"] - 1}
            if self.has_masks:
                out["masks"] = det["masks"][:, 0]
            results.append(out)
        return results


def export_torchvision(model: nn.Module, has_masks: bool) -> torch.jit.ScriptModule:
    model = model.eval().cpu()
    return torch.jit.script(ExportedTorchvisionDetector(model, has_masks))
