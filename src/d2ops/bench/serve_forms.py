"""Export time and CPU latency of each form of one detector, against its eager model (issue 33).

``make bench-serve`` calls :func:`measure`; run alone, ``python -m d2ops.bench.serve_forms`` prints
its JSON. One untrained torchvision Faster R-CNN resnet18-FPN (``model_size`` px) goes through the
export step's own writers (``export_torchvision`` for TorchScript, ``model_forms.write_forms`` for
``model.pt2`` and ``model.aoti.pt2``), and each form the artifact ends up holding runs through
``model_code.inference.predict`` on the same decoded images as the eager model, one image a call.
A form the export could not write is reported with its reason instead of figures (today: both
R-CNNs stop torch.export, docs/model-artifact.md "Forms"); so that the run still says what
torch.export and AOTInductor give, the part of the same detector that does export, its resnet18-FPN
backbone on the resized image, is timed eager, exported and AOTInductor-compiled (``backbone``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLASS_NAMES = ["square", "disc", "triangle"]


def _latency(call: Callable[[int], object], rounds: int, warmup: int = 2) -> dict[str, float]:
    for i in range(warmup):  # TorchScript's profiling executor specialises its graph on the first calls
        call(i)
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    times.sort()
    return {"p50_ms": round(statistics.median(times) * 1000, 2),
            "p99_ms": round(times[min(len(times) - 1, round(0.99 * (len(times) - 1)))] * 1000, 2)}


def _predicting(detector: Any, tensors: list[Any]) -> Callable[[int], object]:
    from model_code.inference import predict

    return lambda i: predict(detector, [tensors[i % len(tensors)]])


def _calling(run: Callable[[Any], object], x: Any) -> Callable[[int], object]:
    return lambda i: run(x)


def _torchvision(model_size: int) -> tuple[Any, Any, Any]:
    import torch
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    from model_code.training.torchvision_export import ExportedTorchvisionDetector, export_torchvision

    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    model = FasterRCNN(backbone, num_classes=len(CLASS_NAMES) + 1, min_size=model_size, max_size=model_size,
                       box_score_thresh=0.05).eval()
    eager = ExportedTorchvisionDetector(model, has_masks=False).eval()
    return eager, lambda: export_torchvision(model, has_masks=False), "fasterrcnn_resnet18_fpn"


def _backbone(eager: Any, model_size: int, rounds: int, aoti: bool) -> dict[str, Any]:
    """The detector's backbone + FPN on one resized image: eager, torch.export'ed, AOTInductor-compiled."""
    import torch

    class Backbone(torch.nn.Module):
        def __init__(self, body: torch.nn.Module) -> None:
            super().__init__()
            self.body = body

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return list(self.body(x[None]).values())

    module = Backbone(eager.model.backbone).eval()
    x = torch.rand(3, model_size, model_size, generator=torch.Generator().manual_seed(0))
    blocks = torch.export.Dim("blocks", min=1, max=512)  # FPN sizes are multiples of 32, as the detector pads
    out: dict[str, Any] = {"image_px": model_size}
    with torch.inference_mode():
        out["eager"] = _latency(lambda i: module(x), rounds)
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(module, (x,), dynamic_shapes=({1: 32 * blocks, 2: 32 * blocks},))
    out["exported"] = {"export_s": round(time.perf_counter() - start, 3)}
    runs: dict[str, Any] = {"exported": program.module()}
    if aoti:
        with tempfile.TemporaryDirectory(prefix="d2ops-bench-aoti-") as tmp:
            start = time.perf_counter()
            package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(tmp) / "bb.pt2"))
            out["aoti"] = {"export_s": round(time.perf_counter() - start, 3),
                           "package_mb": round(Path(package).stat().st_size / 1e6, 1)}
            runs["aoti"] = torch._inductor.aoti_load_package(package)
    for name, run in runs.items():
        with torch.inference_mode():
            figures = _latency(_calling(run, x), rounds)
        out[name] |= figures | {"p50_ratio": round(figures["p50_ms"] / out["eager"]["p50_ms"], 3)}
    return out


def measure(*, images: int = 8, rounds: int = 20,
            image_size: tuple[int, int] = (640, 480), model_size: int = 320, aoti: bool = True,
            threads: int | None = None, backbone: bool = True) -> dict[str, Any]:
    """Export each form of one detector and time it on CPU against the eager model, in one run.

    Returns ``{"framework", "model", "image_size", "threads", "rounds", "eager": {"p50_ms", "p99_ms"},
    "forms": {form: {"available": bool, "export_s": float, "p50_ms", "p99_ms", "p50_ratio", "p99_ratio"}
    | {"available": False, "export_s"?, "problem": str}}, "backbone": {"eager", "exported", "aoti"?}}``
    (``backbone`` with ``backbone=True``: export/compile seconds, p50/p99 and p50_ratio of the backbone
    alone); ratios are form over eager (below 1 is faster).
    """
    import numpy as np
    import torch

    from model_code import artifact, model_forms

    if threads is not None:
        torch.set_num_threads(threads)
    eager, script, name = _torchvision(model_size)
    rng = np.random.default_rng(0)
    width, height = image_size
    tensors = [torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)) for _ in range(images)]
    result: dict[str, Any] = {"framework": "torchvision", "model": name, "image_size": [width, height],
                              "threads": torch.get_num_threads(), "rounds": rounds, "forms": {}}
    with torch.inference_mode():
        result["eager"] = _latency(lambda i: eager([tensors[i % images]]), rounds)
    with tempfile.TemporaryDirectory(prefix="d2ops-bench-forms-") as tmp:
        directory = Path(tmp) / "model"
        directory.mkdir()
        start = time.perf_counter()
        module = script()
        script_s = round(time.perf_counter() - start, 3)
        outcome = model_forms.write_forms(directory, eager, tensors[0], aoti=aoti)
        meta = artifact.ArtifactMetadata(framework="torchvision", task="detection", model=name, class_names=CLASS_NAMES,
                                         category_ids=[1, 2, 3], forms=outcome.forms,
                                         export_problems=outcome.problems, aoti_device=outcome.aoti_device)
        artifact.save_artifact(directory, module, meta)
        seconds = {"torchscript": script_s, **outcome.seconds}
        for form in model_forms.FORMS:
            entry: dict[str, Any] = {"available": form in outcome.forms}
            if form in seconds:
                entry["export_s"] = seconds[form]
            if form not in outcome.forms:
                entry["problem"] = outcome.problems.get(form, "not built (set D2OPS_EXPORT_AOTI=1 / aoti=True)")
                result["forms"][form] = entry
                continue
            detector = artifact.load_artifact(directory, form=form)
            figures = _latency(_predicting(detector, tensors), rounds)
            entry |= figures | {"p50_ratio": round(figures["p50_ms"] / result["eager"]["p50_ms"], 3),
                                "p99_ratio": round(figures["p99_ms"] / result["eager"]["p99_ms"], 3)}
            result["forms"][form] = entry
    if backbone:
        result["backbone"] = _backbone(eager, model_size, rounds, aoti)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-aoti", dest="aoti", action="store_false")
    args = parser.parse_args(argv)
    print(json.dumps(measure(rounds=args.rounds, threads=args.threads, aoti=args.aoti)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
