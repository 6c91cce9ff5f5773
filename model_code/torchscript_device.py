"""Move a CUDA trace to another GPU: its device constants must follow its weights.

``torch.jit.trace`` records the device of every tensor the traced code creates (anchors, grids,
empty results) as a constant in the graph. ``map_location`` moves the weights of a trace taken on
``cuda:0`` to ``cuda:1``, but not those constants; TorchServe gives each worker of a multi-GPU
instance its own GPU. Only constants naming the trace's device change: tensors the traced code
deliberately kept on the CPU (image sizes) stay there. Call it on a freshly loaded module, before
it runs (the graph executor compiles a graph on first use).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

_DEVICE_TYPE = "Device"
_TENSOR_TYPE = "Tensor"


def _graphs(module: torch.jit.ScriptModule) -> Iterator[Any]:  # torch.Graph; its stubs lack findAllNodes
    sub: Any
    for sub in module.modules():
        for name in sub._c._method_names():
            yield sub._c._get_method(name).graph


def device_constants(module: torch.jit.ScriptModule) -> list[str]:
    """The devices named by constants in every graph of ``module`` (e.g. ``["cuda:0", "cpu"]``)."""
    return [str(node.s("value")) for graph in _graphs(module) for node in graph.findAllNodes("prim::Constant")
            if str(node.output().type()) == _DEVICE_TYPE and "value" in node.attributeNames()]


def retarget(module: torch.jit.ScriptModule, source: str | torch.device, target: str | torch.device) -> int:
    """Point device constants naming ``source``, and move tensor constants on it, to ``target``.

    Returns how many constants changed.
    """
    old, new = torch.device(source), torch.device(target)
    changed = 0
    for graph in _graphs(module):
        for node in graph.findAllNodes("prim::Constant"):
            if "value" not in node.attributeNames():
                continue
            kind = str(node.output().type())
            if kind == _DEVICE_TYPE and torch.device(node.s("value")) == old:
                node.s_("value", str(new))
                changed += 1
            elif kind == _TENSOR_TYPE and node.kindOf("value") == "t" and node.t("value").device == old:
                node.t_("value", node.t("value").to(new))
                changed += 1
    return changed
