"""The artifact's forms (model_code/model_forms.py): TorchScript, a torch.export program, an AOTInductor package.

On a detector torch.export can export (tests/fixtures/exportable_detector.py), every form, loaded from a
packed model.tar.gz as evaluation and serving load it, answers through ``model_code.inference.predict``
exactly as the eager module does, on images of other sizes than the one it was exported on; the
metadata lists the forms; a form is chosen by the device, by ``form=`` or by $D2OPS_MODEL_FORM, and one
the artifact lacks is a one-line error with the reason. On the R-CNNs the trainers ship, torch.export
fails today: the export step records where and keeps TorchScript (the detectron2 side is in
tests/unit/test_detectron2_export.py and tests/integration/test_detectron2_serving.py).
"""

from __future__ import annotations

import json
import tarfile

import pytest
import torch
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

from model_code import artifact, inference, model_forms
from model_code.training.torchvision_export import ExportedTorchvisionDetector, export_torchvision
from tests.fixtures.exportable_detector import ExportableDetector

# Non-square, smaller and larger than the 64 px sample the program was exported on.
SIZES = [(50, 90), (120, 70), (64, 64)]


def _metadata(**fields) -> artifact.ArtifactMetadata:
    return artifact.ArtifactMetadata(**({"framework": "torchvision", "task": "instance_segmentation",
                                         "model": "exportable", "class_names": ["a", "b", "c"],
                                         "category_ids": [1, 2, 3]} | fields))


@pytest.fixture(scope="module")
def forms_artifact(tmp_path_factory):
    """The eager detector and its artifact with every form (one AOTInductor compile: ~15-30 s of CPU)."""
    eager = ExportableDetector(has_masks=True).eval()
    directory = tmp_path_factory.mktemp("forms") / "model"
    directory.mkdir()
    outcome = model_forms.write_forms(directory, eager, torch.zeros(3, 64, 64, dtype=torch.uint8), aoti=True)
    assert outcome.problems == {}, outcome.problems
    artifact.save_artifact(directory, torch.jit.script(eager), _metadata(
        forms=outcome.forms, export_problems=outcome.problems, aoti_device=outcome.aoti_device))
    return eager, directory, outcome


def _images(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in SIZES]


def test_the_export_lists_every_form_and_what_it_cost(forms_artifact):
    _, directory, outcome = forms_artifact
    meta = artifact.read_metadata(directory)
    assert meta.forms == ["torchscript", "exported", "aoti"] and meta.aoti_device == "cpu"
    assert sorted(p.name for p in directory.iterdir()) == ["metadata.json", "model.aoti.pt2", "model.pt",
                                                           "model.pt2"]  # no temporary file left behind
    assert outcome.seconds["exported"] > 0 and outcome.seconds["aoti"] > 0
    assert outcome.summary() == (f"model forms: torchscript, exported ({outcome.seconds['exported']} s), "
                                 f"aoti ({outcome.seconds['aoti']} s)")


@pytest.mark.parametrize("form", model_forms.FORMS)
def test_every_form_answers_as_the_eager_model_does(tmp_path, forms_artifact, form):
    """Catches a loader that runs another form than asked, drops or reorders a batch's images (the compiled
    forms run one image a call), or loses the masks; sizes differ from the export's sample."""
    eager, directory, _ = forms_artifact
    tar = artifact.pack_artifact(directory, tmp_path / "model.tar.gz")
    with tarfile.open(tar) as t:
        assert {"model.pt", "model.pt2", "model.aoti.pt2"} <= set(t.getnames())
    detector = artifact.load_artifact(tar, form=form)
    assert detector.form == form
    images = _images()
    got = inference.predict(detector, images, score_threshold=0.0)
    reference = inference.predict(artifact.LoadedDetector(module=eager, metadata=detector.metadata,
                                                          path=directory), images, score_threshold=0.0)
    assert len(got) == len(images)
    for ours, theirs, image in zip(got, reference, images, strict=True):
        assert len(ours) == len(theirs) == eager.k
        assert torch.allclose(ours.boxes, theirs.boxes, atol=1e-4) and torch.equal(ours.labels, theirs.labels)
        assert torch.allclose(ours.scores, theirs.scores, atol=1e-5)
        assert ours.masks is not None and ours.masks.shape == (eager.k, *image.shape[1:])
        assert theirs.masks is not None and bool((ours.masks != theirs.masks).float().mean() < 1e-3)


def test_the_device_picks_aoti_where_built_for_it_else_torchscript(forms_artifact, monkeypatch):
    _, directory, _ = forms_artifact
    monkeypatch.delenv(model_forms.FORM_ENV, raising=False)
    assert artifact.load_artifact(directory).form == "aoti"  # built for CPU: the compiled one
    # Built for CPU, asked for CUDA: refused with the reason before anything loads (no GPU needed to show it).
    with pytest.raises(artifact.ArtifactError, match="AOTInductor package was built for cpu, not cuda"):
        artifact.load_artifact(directory, device="cuda", form="aoti")
    assert model_forms.choose_form(["torchscript", "exported", "aoti"], "cpu", "cuda", None, {}) == "torchscript"


def test_the_environment_forces_a_form_and_a_missing_one_is_one_line(forms_artifact, monkeypatch, tmp_path):
    _, directory, _ = forms_artifact
    monkeypatch.setenv(model_forms.FORM_ENV, "exported")
    assert artifact.load_artifact(directory).form == "exported"
    monkeypatch.setenv(model_forms.FORM_ENV, "onnx")
    with pytest.raises(artifact.ArtifactError, match=r"D2OPS_MODEL_FORM='onnx' is not a model form") as info:
        artifact.load_artifact(directory)
    assert "\n" not in str(info.value)
    # An artifact whose export failed says why when the form is asked for.
    only = tmp_path / "model"
    artifact.save_artifact(only, torch.jit.script(ExportableDetector()), _metadata(
        task="detection", export_problems={"exported": "torchvision/ops/boxes.py:86 in batched_nms: data-dependent"}))
    monkeypatch.setenv(model_forms.FORM_ENV, "exported")
    with pytest.raises(artifact.ArtifactError,
                       match=r"holds no exported form, only torchscript: torchvision/ops/boxes\.py:86") as info:
        artifact.load_artifact(only)
    assert "\n" not in str(info.value)
    monkeypatch.setenv(model_forms.FORM_ENV, "torchscript")
    assert artifact.load_artifact(only).form == "torchscript"


def test_an_artifact_from_before_the_forms_loads_as_torchscript(tmp_path, monkeypatch):
    monkeypatch.delenv(model_forms.FORM_ENV, raising=False)
    directory = artifact.save_artifact(tmp_path / "model", torch.jit.script(ExportableDetector()),
                                       _metadata(task="detection"))
    document = json.loads((directory / artifact.METADATA_FILE).read_text())
    for name in ("forms", "export_problems", "aoti_device"):
        del document[name]
    (directory / artifact.METADATA_FILE).write_text(json.dumps(document))
    loaded = artifact.load_artifact(directory)
    assert loaded.form == "torchscript" and loaded.metadata.forms == ["torchscript"]
    assert isinstance(loaded.module, torch.jit.ScriptModule)
    with pytest.raises(artifact.ArtifactError, match=r"holds no aoti form, only torchscript \(exported before"):
        artifact.load_artifact(directory, form="aoti")


def test_forms_metadata_must_be_consistent():
    with pytest.raises(ValueError, match="forms must hold torchscript"):
        _metadata(forms=["exported"])
    with pytest.raises(ValueError, match="aoti_device names"):
        _metadata(forms=["torchscript", "aoti"])
    with pytest.raises(ValueError, match="aoti_device names"):
        _metadata(aoti_device="cpu")


def test_a_truncated_program_is_one_line_naming_the_file(forms_artifact, tmp_path):
    _, directory, _ = forms_artifact
    broken = tmp_path / "model"
    broken.mkdir()
    for name in ("metadata.json", "model.pt"):
        (broken / name).write_bytes((directory / name).read_bytes())
    (broken / "model.pt2").write_bytes((directory / "model.pt2").read_bytes()[:2000])
    with pytest.raises(artifact.ArtifactError, match=r"model\.pt2: not a loadable exported program") as info:
        artifact.load_artifact(broken, form="exported")
    assert "\n" not in str(info.value)
    with pytest.raises(artifact.ArtifactError, match=r"model\.aoti\.pt2: missing, though metadata\.json lists"):
        artifact.load_artifact(broken, form="aoti")


@pytest.mark.parametrize("masks", [False, True], ids=["faster_rcnn", "mask_rcnn"])
def test_torchvision_rcnn_does_not_export_and_the_step_says_where(tmp_path, masks):
    """torchvision's R-CNNs stop torch.export at batched_nms's data-dependent branch (torch 2.14.1); the step
    keeps TorchScript, names the call, leaves no file behind. When a torch or torchvision release exports
    them this fails: then the exported form needs its parity test against the eager model here."""
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    model = (MaskRCNN if masks else FasterRCNN)(backbone, num_classes=4, min_size=64, max_size=64).eval()
    eager = ExportedTorchvisionDetector(model, masks).eval()
    outcome = model_forms.write_forms(tmp_path, eager, torch.zeros(3, 64, 64, dtype=torch.uint8), aoti=True)
    assert outcome.forms == ["torchscript"] and outcome.aoti_device is None
    assert outcome.problems["exported"].startswith("torchvision/ops/boxes.py:")
    assert "in batched_nms" in outcome.problems["exported"] and "\n" not in outcome.problems["exported"]
    assert outcome.problems["aoti"] == "needs the exported program, which failed"
    assert outcome.summary().startswith("model forms: torchscript; no exported: torchvision/ops/boxes.py:")
    assert list(tmp_path.iterdir()) == []
    # What torch.export was given is the TorchScript signature's own code, eagerly: same answers.
    image = torch.randint(0, 256, (3, 48, 80), dtype=torch.uint8)
    with torch.no_grad():
        ours, theirs = eager([image])[0], export_torchvision(model, masks)([image])[0]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_aoti_is_opt_in_for_a_named_device():
    """Catches an export step that compiles by default (a minute of CPU per model) or ignores the device asked."""
    assert model_forms.aoti_requested({}) is None and model_forms.aoti_requested({"D2OPS_EXPORT_AOTI": "0"}) is None
    assert model_forms.aoti_requested({"D2OPS_EXPORT_AOTI": "1"}) == "cpu"
    assert model_forms.aoti_requested({"D2OPS_EXPORT_AOTI": "CUDA"}) == "cuda"
    with pytest.raises(ValueError, match="D2OPS_EXPORT_AOTI='gpu': expected cpu"):
        model_forms.aoti_requested({"D2OPS_EXPORT_AOTI": "gpu"})
