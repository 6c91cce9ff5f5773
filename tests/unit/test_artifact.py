import io
import json
import tarfile

import pytest
import torch
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

from d2ops_core.dataset_identity import DatasetVersion
from d2ops_core.documents.evaluation import ModelEvaluation
from model_code import artifact, inference
from model_code.training.torchvision_export import export_torchvision


@pytest.fixture(scope="module")
def scripted():
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    # An untrained detector with a low score threshold still emits plenty of boxes to filter.
    model = FasterRCNN(backbone, num_classes=4, min_size=96, max_size=96, box_score_thresh=0.0)
    return export_torchvision(model, has_masks=False)


def metadata(**overrides):
    fields = {"framework": "torchvision", "task": "detection", "model": "fasterrcnn_resnet18_fpn",
              "class_names": ["square", "disc", "triangle"], "category_ids": [1, 2, 7]}
    return artifact.ArtifactMetadata(**(fields | overrides))


def test_round_trip_through_model_tar_gz(tmp_path, scripted):
    evaluation = ModelEvaluation(primary_metric="bbox_AP", val_images=4, metrics={"bbox_AP": 0.5},
                                 per_class={"disc": {"bbox_AP": 0.25}})
    artifact.save_artifact(tmp_path / "model", scripted, metadata(), evaluation=evaluation)
    tar = artifact.pack_artifact(tmp_path / "model", tmp_path / "model.tar.gz")
    with tarfile.open(tar) as t:
        assert sorted(t.getnames()) == ["evaluation.json", "metadata.json", "model.pt"]
    loaded = artifact.load_artifact(tar)
    assert loaded.metadata.category_ids == [1, 2, 7]
    assert loaded.evaluation == evaluation
    image = torch.randint(0, 256, (3, 80, 120), dtype=torch.uint8)
    small = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
    first, second = inference.predict(loaded, [image, small], score_threshold=0.0, max_detections=7)
    assert 0 < len(first) <= 7 and 0 < len(second) <= 7
    assert torch.all(first.scores[:-1] >= first.scores[1:])
    assert first.labels.min() >= 0 and first.labels.max() < 3
    # boxes come back in each image's own pixels, not the model's resized frame
    assert float(second.boxes[:, 2].max()) <= 50 + 1e-3 and float(second.boxes[:, 3].max()) <= 40 + 1e-3


def test_score_threshold_filters(tmp_path, scripted):
    artifact.save_artifact(tmp_path, scripted, metadata())
    loaded = artifact.load_artifact(tmp_path)
    image = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
    everything = inference.predict(loaded, [image], score_threshold=0.0)[0]
    cut = float(everything.scores.median())
    kept = inference.predict(loaded, [image], score_threshold=cut)[0]
    assert len(kept) < len(everything) and bool(torch.all(kept.scores >= cut))


@pytest.mark.parametrize(
    ("image", "message"),
    [(torch.zeros((3, 8, 8)), "uint8"), (torch.zeros((1, 8, 8), dtype=torch.uint8), "[3, H, W]"),
     (torch.zeros((3, 0, 8), dtype=torch.uint8), "zero size")],
)
def test_predict_rejects_bad_images(tmp_path, scripted, image, message):
    artifact.save_artifact(tmp_path, scripted, metadata())
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inference.predict(artifact.load_artifact(tmp_path), [image])


def test_metadata_must_line_up():
    with pytest.raises(ValueError, match="class_names has 3 entries but category_ids has 2"):
        metadata(category_ids=[1, 2])
    with pytest.raises(ValueError, match="unique"):
        metadata(category_ids=[1, 1, 2])


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(artifact.ArtifactError, match="no such model directory"):
        artifact.load_artifact(tmp_path / "absent")
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(artifact.ArtifactError, match="not a directory or a tar archive"):
        artifact.load_artifact(tmp_path / "junk.tar.gz")
    with pytest.raises(artifact.ArtifactError, match=r"metadata\.json: missing"):
        artifact.load_artifact(tmp_path)


@pytest.mark.parametrize(("content", "named"), [
    (b"{bad", r"metadata\.json: invalid metadata: the document: Invalid JSON: key must be a string"),
    (b"[" * 100_000 + b"]" * 100_000, r"invalid metadata: the document: Invalid JSON: recursion limit exceeded"),
    (b'{"schema_version": 1}', r"invalid metadata: framework: Field required; task: Field required"),
    (None, r"metadata\.json: cannot read it: Is a directory"),
])
def test_a_hostile_metadata_file_is_one_line_naming_it(tmp_path, content, named):
    """pydantic's multi-line report (with its input echoed, 200 KB of brackets) went into the start-up error."""
    if content is None:
        (tmp_path / "metadata.json").mkdir()
    else:
        (tmp_path / "metadata.json").write_bytes(content)
    with pytest.raises(artifact.ArtifactError, match=named) as info:
        artifact.read_metadata(tmp_path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


@pytest.mark.parametrize(
    ("document", "named"),
    [(b'{"primary_metric": "bbox_AP", "val_images": 4, "metrics": {"bbox_AP": 0.5', "Invalid JSON"),
     (b'{"primary_metric": "bbox_AP", "val_images": 4}', "metrics: Field required"),
     (b'{"primary_metric": "bbox_AP", "val_images": 0, "metrics": {"bbox_AP": "high"}}',
      r"metrics\.bbox_AP: Input should be a valid number.*; val_images: Input should be greater than or equal to 1"),
     (b'{"primary_metric": "accuracy", "val_images": 4, "metrics": {}}', "primary_metric: Input should be"),
     (b'[]', "the document: Input should be an object")],
)
def test_a_hand_edited_evaluation_is_refused_naming_the_file_and_field(tmp_path, scripted, document, named):
    artifact.save_artifact(tmp_path / "model", scripted, metadata())
    (tmp_path / "model" / artifact.EVALUATION_FILE).write_bytes(document)
    with pytest.raises(artifact.ArtifactError, match=r"evaluation\.json: not a model evaluation: .*" + named):
        artifact.load_artifact(tmp_path / "model")
    tar = artifact.pack_artifact(tmp_path / "model", tmp_path / "model.tar.gz")
    with pytest.raises(artifact.ArtifactError, match=named):
        artifact.load_artifact(tar)


def test_metadata_written_before_the_shared_dataset_model_still_loads(tmp_path, scripted):
    """Artifacts already in S3 carry ``dataset`` as the old artifact-only model wrote it (uri null)."""
    artifact.save_artifact(tmp_path, scripted, metadata())
    document = json.loads((tmp_path / artifact.METADATA_FILE).read_text())
    document["dataset"] = {"name": "shapes", "version": "v1", "uri": None}
    (tmp_path / artifact.METADATA_FILE).write_text(json.dumps(document))
    loaded = artifact.load_artifact(tmp_path)
    assert loaded.metadata.dataset == DatasetVersion(name="shapes", version="v1")
    assert loaded.evaluation is None  # an artifact without evaluation.json is still an artifact
    document["dataset"]["bucket"] = "data"  # a run's reference is not what an artifact records
    (tmp_path / artifact.METADATA_FILE).write_text(json.dumps(document))
    with pytest.raises(artifact.ArtifactError, match=r"dataset\.bucket"):
        artifact.load_artifact(tmp_path)


def test_tar_with_path_traversal_is_refused(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        payload = b"{}"
        info = tarfile.TarInfo("../escaped.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(artifact.ArtifactError, match="unsafe or corrupt archive"):
        artifact.load_artifact(evil)
    assert not (tmp_path.parent / "escaped.json").exists()
