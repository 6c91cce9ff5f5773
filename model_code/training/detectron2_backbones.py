"""Backbones the detectron2 CPU profile uses beyond detectron2's own registry.

Imports detectron2 at module level; :mod:`detectron2_worker` imports it, so the names are
registered in every worker before a model is built (and when a checkpoint of the CPU profile
is fine-tuned). Serving never needs it: the artifact is a TorchScript trace.
"""

from __future__ import annotations

import math
from typing import Any

from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import FPN, Backbone
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.backbone.resnet import build_resnet_backbone


@BACKBONE_REGISTRY.register()
def build_truncated_resnet_fpn_backbone(cfg: Any, input_shape: ShapeSpec) -> Backbone:
    """detectron2's ``build_resnet_fpn_backbone`` for a ResNet that may end before res5.

    detectron2 builds ResNet stages only up to the last of ``RESNETS.OUT_FEATURES``, but its FPN
    builder always max-pools its extra top level from ``p5``. Here the extra level is pooled from
    whatever the last FPN level is (``p4`` when the ResNet ends at res4), so the pyramid keeps its
    coarse level without the stage that computes it. At 128 px res5 is a 4x4 map holding three
    quarters of an R-18's weights (docs/training.md, "detectron2 CPU profile").
    """
    bottom_up = build_resnet_backbone(cfg, input_shape)
    in_features = list(cfg.MODEL.FPN.IN_FEATURES)
    top_block = LastLevelMaxPool()
    top_block.in_feature = f"p{int(math.log2(bottom_up.output_shape()[in_features[-1]].stride))}"
    return FPN(bottom_up=bottom_up, in_features=in_features, out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
               norm=cfg.MODEL.FPN.NORM, top_block=top_block, fuse_type=cfg.MODEL.FPN.FUSE_TYPE)
