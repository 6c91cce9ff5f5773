"""A traced artifact on another device: model.cuda.pt, and device constants that follow the weights.

``torch.jit.trace`` bakes the device of every tensor the traced code creates into the graph; a
detectron2 export traced on CPU fails on CUDA (measured on an H100, docs/benchmarks.md "GPU").
This machine has no GPU, so the move is shown on the ``meta`` device, which has the same
"all tensors on one device" rule; the CUDA load itself was run on the GPU machine.
"""

from __future__ import annotations

import io

import pytest
import torch

from model_code import artifact
from model_code.serving.launch import build_model_archive
from model_code.torchscript_device import device_constants, retarget


class _MakesTensors(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(x.shape[0], device=x.device, dtype=x.dtype)


def _traced_then_loaded(device: str) -> torch.jit.ScriptModule:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(_MakesTensors(), (torch.ones(3),)), buf)
    buf.seek(0)
    return torch.jit.load(buf, map_location=device)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_trace_fails_on_another_device_until_its_constants_follow() -> None:
    moved = _traced_then_loaded("meta")
    assert device_constants(moved) == ["cpu"]  # the trace remembers where arange ran
    with pytest.raises(RuntimeError):
        moved(torch.ones(3, device="meta"))

    moved = _traced_then_loaded("meta")
    assert retarget(moved, "cpu", "meta") == 1
    assert device_constants(moved) == ["meta"]
    assert moved(torch.ones(3, device="meta")).device.type == "meta"
    # Constants that name another device are left alone.
    assert retarget(moved, "cpu", "meta") == 0


def _metadata(framework: str) -> artifact.ArtifactMetadata:
    return artifact.ArtifactMetadata(framework=framework, task="detection", model="tiny", class_names=["a"],
                                     category_ids=[1])


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_cpu_only_detectron2_artifact_refuses_cuda_with_the_reason(tmp_path) -> None:
    module = torch.jit.script(_MakesTensors())
    directory = artifact.save_artifact(tmp_path / "model", module, _metadata("detectron2"))
    assert not (directory / artifact.CUDA_MODEL_FILE).exists()
    with pytest.raises(artifact.ArtifactError, match=r"no CUDA trace \(model\.cuda\.pt\).*serve it on CPU"):
        artifact.load_artifact(directory, device="cuda")
    assert artifact.load_artifact(directory, device="cpu").metadata.framework == "detectron2"


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_cuda_trace_ships_in_the_artifact_and_the_model_archive(tmp_path) -> None:
    module = torch.jit.script(_MakesTensors())
    directory = artifact.save_artifact(tmp_path / "model", module, _metadata("detectron2"), cuda_module=module)
    assert sorted(p.name for p in directory.iterdir()) == ["metadata.json", "model.cuda.pt", "model.pt"]
    packed = artifact.pack_artifact(directory, tmp_path / "model.tar.gz")
    unpacked, _ = artifact.open_artifact(packed, tmp_path / "unpacked")
    assert (unpacked / artifact.CUDA_MODEL_FILE).is_file()
    store = build_model_archive(unpacked, tmp_path / "store")
    assert (store / artifact.CUDA_MODEL_FILE).is_file()  # TorchServe's model_dir is what the handler loads
