"""Why the CPU profile converges on every machine: normalisation, gradient clipping, the CPU profile.

The full-training evidence (learning-rate margin, several seeds) is `make bench-calibrate`
(docs/training.md, "Calibration"); these checks are the cheap, machine-independent part.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from d2ops_core.cpu_profile import TORCHVISION_CPU_PROFILE, torchvision_cpu_profile
from model_code.training.config import CLIP_GRAD_NORM, parse_hyperparameters
from model_code.training.torchvision_launch import with_cpu_profile
from model_code.training.torchvision_trainer import build_model


def _backbone_grad_norm(model: nn.Module, images: torch.Tensor) -> float:
    features = model.backbone(images)
    sum(f.pow(2).mean() for f in features.values()).backward()
    grads = [p.grad.pow(2).sum() for p in model.backbone.parameters() if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt())


def test_the_backbone_is_normalised_when_trained_from_scratch() -> None:
    hp = parse_hyperparameters(TORCHVISION_CPU_PROFILE)
    torch.manual_seed(0)
    model = build_model("fasterrcnn_resnet18_fpn", 3, hp)
    norms = [m for m in model.backbone.body.modules() if isinstance(m, nn.GroupNorm | FrozenBatchNorm2d)]
    assert norms and all(isinstance(m, nn.GroupNorm) for m in norms)
    assert all(p.requires_grad for m in norms for p in m.parameters())

    # The identity "normalisation" a from-scratch FrozenBatchNorm2d amounts to lets activations and
    # gradients grow with depth; GroupNorm keeps every stage near unit scale. Compare the two on the
    # same input: a ratio, not one CPU's absolute numbers.
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    images = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    frozen = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    unnormalised = _backbone_grad_norm(_Holder(frozen), images)
    normalised = _backbone_grad_norm(model, images)
    assert unnormalised > 4 * normalised
    stages = []
    x = images
    with torch.no_grad():
        for name, layer in model.backbone.body.named_children():
            x = layer(x)
            if name.startswith("layer"):
                stages.append(float(x.std()))
    assert all(0.3 < s < 3 for s in stages), stages


class _Holder(nn.Module):
    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone


def test_gradient_clipping_is_on_by_default_and_can_be_switched_off() -> None:
    assert parse_hyperparameters({}).clip_grad_norm == CLIP_GRAD_NORM > 0
    assert parse_hyperparameters({"clip_grad_norm": "0"}).clip_grad_norm == 0
    with pytest.raises(Exception, match="clip_grad_norm"):
        parse_hyperparameters({"clip_grad_norm": "-1"})


def test_without_a_gpu_the_cpu_profile_fills_what_the_user_left_unset() -> None:
    hp, notice = with_cpu_profile(parse_hyperparameters({"max_iter": "40"}), use_gpu=False)
    assert notice and notice.startswith("no GPU and no `model` hyperparameter: training the CPU profile")
    assert hp.model == "fasterrcnn_resnet18_fpn" and hp.min_size == 128 and hp.ims_per_batch == 4
    assert hp.max_iter == 40  # the user's value wins
    assert hp.base_lr == float(TORCHVISION_CPU_PROFILE["base_lr"])


@pytest.mark.parametrize(("raw", "use_gpu"), [({"model": "fasterrcnn_resnet50_fpn"}, False), ({}, True)])
def test_a_chosen_model_or_a_gpu_keeps_the_configuration_as_given(raw: dict[str, str], use_gpu: bool) -> None:
    given = parse_hyperparameters(raw)
    hp, notice = with_cpu_profile(given, use_gpu=use_gpu)
    assert hp is given and notice is None


def test_the_profile_follows_the_image_size_and_parses() -> None:
    hp = parse_hyperparameters(torchvision_cpu_profile(64))
    assert (hp.min_size, hp.max_size) == (64, 64) and hp.clip_grad_norm > 0
