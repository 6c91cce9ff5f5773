"""The detectron2 trainer's glue, without detectron2 (it cannot be installed here)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from d2ops import synth
from model_code.dataset_version import Categories, open_dataset_version
from model_code.training import detectron2_trainer as d2
from model_code.training.config import ConfigError, load_environment, parse_hyperparameters
from model_code.training.detectron2_export import Detectron2Signature
from model_code.training.distributed import plan_world


def options_dict(opts: list[str]) -> dict[str, str]:
    assert len(opts) % 2 == 0
    return dict(zip(opts[0::2], opts[1::2], strict=True))


def test_config_source_zoo_name_shipped_file_and_rejections(tmp_path: Path) -> None:
    assert d2.config_source(None, "detection") == d2.ConfigSource("zoo", "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml")
    assert d2.config_source(None, "instance_segmentation").location.startswith("COCO-InstanceSegmentation/mask_rcnn")
    (tmp_path / "shapes.yaml").write_text("_BASE_: x\n")
    shipped = d2.config_source("shapes.yaml", "detection", tmp_path)
    assert shipped == d2.ConfigSource("file", str(tmp_path / "shapes.yaml"))
    for bad in ("../etc/passwd.yaml", "/abs.yaml", "not-a-config", "fasterrcnn_resnet18_fpn"):
        with pytest.raises(ConfigError, match="model="):
            d2.config_source(bad, "detection", tmp_path)


def test_overrides_as_key_value_pairs_or_json() -> None:
    assert d2.parse_overrides("SOLVER.AMP.ENABLED True  INPUT.MIN_SIZE_TRAIN '(640, 672)'") == [
        "SOLVER.AMP.ENABLED", "True", "INPUT.MIN_SIZE_TRAIN", "(640, 672)"]
    opts = d2.parse_overrides(json.dumps({"MODEL.RPN.NMS_THRESH": 0.6, "INPUT.MIN_SIZE_TRAIN": [640, 672],
                                          "SOLVER.AMP.ENABLED": True, "MODEL.BACKBONE.NAME": "build_resnet_fpn"}))
    values = options_dict(opts)
    # detectron2 reads each value with ast.literal_eval, so they must be Python literals
    assert ast.literal_eval(values["INPUT.MIN_SIZE_TRAIN"]) == [640, 672]
    assert ast.literal_eval(values["SOLVER.AMP.ENABLED"]) is True
    assert values["MODEL.BACKBONE.NAME"] == "build_resnet_fpn"
    assert d2.parse_overrides("  ") == []


@pytest.mark.parametrize(("text", "message"), [
    ("SOLVER.BASE_LR", "odd number of tokens"),
    ("solver.base_lr 0.1", "not a config key"),
    ("OUTPUT_DIR /tmp/x", "set by the trainer"),
    ('{"DATASETS.TRAIN": "x"}', "set by the trainer"),
    ("{not json", "invalid JSON"),
])
def test_bad_overrides_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        d2.parse_overrides(text)


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ds")
    synth.generate(root, images=8, size=64)
    return root


def sm_tree(root: Path, channel: Path, hosts: list[str], current: str, hps: dict[str, str]) -> dict[str, str]:
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": current, "hosts": hosts}))
    (config / "hyperparameters.json").write_text(json.dumps(hps))
    return {"D2OPS_ML_ROOT": str(root), "SM_CHANNEL_TRAIN": str(channel), "SM_CHANNEL_VAL": str(channel),
            "D2OPS_CHECKPOINT_DIR": "/opt/ml/checkpoints"}


def test_job_plan_composes_config_registration_and_launch(tmp_path: Path, channel: Path) -> None:
    hps = {"framework": "detectron2", "ims_per_batch": "16", "base_lr": "0.02", "max_iter": "1000",
           "reference_world_size": "8", "checkpoint_period": "200", "eval_period": "500", "dist_port": "29555",
           "overrides": "SOLVER.BASE_LR 0.01 TEST.DETECTIONS_PER_IMAGE 50"}
    environ = sm_tree(tmp_path, channel, ["algo-2", "algo-1"], "algo-2", hps)
    env = load_environment(environ, gpu_count=8)
    job, plan = d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ)

    opts = job.options
    values = options_dict(opts)
    assert values["OUTPUT_DIR"] == "/opt/ml/checkpoints"  # resume_or_load finds last_checkpoint there
    assert values["DATASETS.TRAIN"] == "('d2ops_train',)" and values["DATASETS.TEST"] == "('d2ops_val',)"
    assert values["MODEL.ROI_HEADS.NUM_CLASSES"] == "3" and values["MODEL.MASK_ON"] == "False"
    assert values["SOLVER.REFERENCE_WORLD_SIZE"] == "8"  # detectron2 itself rescales to the 16 workers
    assert values["SOLVER.IMS_PER_BATCH"] == "16" and values["SOLVER.MAX_ITER"] == "1000"
    assert ast.literal_eval(values["SOLVER.STEPS"]) == (800,)
    assert values["MODEL.DEVICE"] == "cuda"
    # user overrides come last, so they win over the trainer's values in merge_from_list
    assert opts[-4:] == ["SOLVER.BASE_LR", "0.01", "TEST.DETECTIONS_PER_IMAGE", "50"]
    assert opts.index("SOLVER.BASE_LR") < len(opts) - 4

    assert d2.launch_arguments(plan) == {"num_gpus_per_machine": 8, "num_machines": 2, "machine_rank": 1,
                                         "dist_url": "tcp://algo-1:29555", "timeout": plan.timeout}
    train_reg, val_reg = job.registrations
    assert (train_reg.name, val_reg.name) == ("d2ops_train", "d2ops_val")
    assert train_reg.json_file == str(channel / "annotations" / "train.json")
    assert val_reg.image_root == str(channel / "images")
    assert train_reg.thing_classes == ["square", "disc", "triangle"]
    assert job.source == d2.ConfigSource("zoo", "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml")
    assert "detectron2" not in sys.modules  # all of the above ran without it


def test_registration_maps_non_contiguous_category_ids(channel: Path) -> None:
    version = open_dataset_version(channel)
    regs = d2.dataset_registrations(version, version, Categories(ids=[3, 7, 42], names=["a", "b", "c"]))
    assert regs[0].thing_dataset_id_to_contiguous_id == {3: 0, 7: 1, 42: 2}


def test_world_size_that_cannot_split_the_batch_is_a_config_error(tmp_path: Path, channel: Path) -> None:
    environ = sm_tree(tmp_path, channel, ["algo-1"], "algo-1", {"framework": "detectron2", "ims_per_batch": "6"})
    env = load_environment(environ, gpu_count=4)
    hp = parse_hyperparameters(env.hyperparameters)
    with pytest.raises(ConfigError, match="does not split evenly over 4 workers"):
        d2.config_options(hp, plan_world(env, hp, environ), task="detection", num_classes=3,
                          checkpoint_dir=tmp_path)


class FakeInner(nn.Module):
    """Stands in for the traced detectron2 model: fixed detections in the resized frame."""

    def __init__(self, with_masks: bool) -> None:
        super().__init__()
        self.with_masks = with_masks

    def forward(self, x: Tensor) -> list[Tensor]:
        h, w = x.shape[1], x.shape[2]
        boxes = torch.tensor([[0.0, 0.0, w / 2, h / 2], [w / 4, h / 4, w * 1.0, h * 1.0]])
        out = [boxes, torch.tensor([0.3, 0.9]), torch.tensor([2, 0])]
        if self.with_masks:
            out.append(torch.ones(2, 1, 28, 28))
        return out


@pytest.mark.parametrize("with_masks", [False, True])
def test_exported_signature_resizes_and_maps_back_to_original_pixels(with_masks: bool) -> None:
    module = torch.jit.script(Detectron2Signature(FakeInner(with_masks), bgr=True, has_masks=with_masks,
                                                  min_size=200, max_size=300))
    image = torch.zeros(3, 100, 400, dtype=torch.uint8)
    image[0] = 255  # red in RGB: the model must see it in the last (BGR) channel
    (out,) = module([image])
    # short side 100 -> 200 would make the long side 800 > 300, so scale = 300/400: resized 75 x 300
    assert module.resized_shape(100, 400) == (75, 300)
    assert torch.allclose(out["scores"], torch.tensor([0.9, 0.3]))  # sorted descending
    assert out["labels"].tolist() == [0, 2] and out["labels"].dtype == torch.int64
    assert torch.allclose(out["boxes"], torch.tensor([[100.0, 25.0, 400.0, 100.0], [0.0, 0.0, 200.0, 50.0]]))
    if with_masks:
        assert out["masks"].shape == (2, 100, 400)
        assert out["masks"][1, 5:45, 10:190].min() > 0.5 and out["masks"][1, 60:, 250:].max() == 0
    else:
        assert "masks" not in out


def test_channel_order_follows_the_config() -> None:
    class Probe(nn.Module):
        def forward(self, x: Tensor) -> list[Tensor]:
            means = x.mean(dim=(1, 2))
            return [torch.zeros(1, 4), means[:1], torch.zeros(1, dtype=torch.int64)]

    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    image[0] = 200
    bgr = torch.jit.script(Detectron2Signature(Probe(), bgr=True, has_masks=False, min_size=32, max_size=32))
    rgb = torch.jit.script(Detectron2Signature(Probe(), bgr=False, has_masks=False, min_size=32, max_size=32))
    assert float(bgr([image])[0]["scores"][0]) == 0.0  # first channel seen is blue
    assert float(rgb([image])[0]["scores"][0]) == pytest.approx(200.0)
