"""The detectron2 trainer and pretrained weights (issue 20): a config built for pretrained weights is
refused without them, made scratch-capable with weights=scratch, and the CPU profile needs neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from d2ops import synth
from d2ops_core import pretrained
from model_code.training import detectron2_trainer as d2
from model_code.training.config import ConfigError, load_environment, parse_hyperparameters
from tests.fixtures.frameworks import require_detectron2

ZOO = pretrained.DEFAULT_CONFIGS["detection"]


def test_the_trainers_default_configs_are_the_ones_the_stack_keys_name() -> None:
    assert d2.DEFAULT_CONFIGS is pretrained.DEFAULT_CONFIGS
    assert pretrained.weights_key(d2.DEFAULT_CONFIGS["detection"]) == pretrained.DEFAULT_KEY


def test_what_assumes_pretrained_weights_is_named() -> None:
    assert d2.pretrained_only(0, "BN") == [] and d2.pretrained_only(0, "GN") == []
    reasons = d2.pretrained_only(2, "FrozenBN")
    assert len(reasons) == 2 and "FREEZE_AT=2" in reasons[0] and "FrozenBN" in reasons[1]
    assert d2.pretrained_only(1, "SyncBN") == [d2.pretrained_only(1, "BN")[0]]


def test_scratch_options_leave_the_users_overrides_alone() -> None:
    options = dict(zip(*[iter(d2.scratch_options([]))] * 2, strict=True))
    assert options["MODEL.BACKBONE.FREEZE_AT"] == "0" and options["MODEL.RESNETS.NORM"] == "GN"
    mine = d2.scratch_options(["MODEL.RESNETS.NORM", "SyncBN"])
    assert "MODEL.RESNETS.NORM" not in mine[0::2] and "MODEL.BACKBONE.FREEZE_AT" in mine[0::2]


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ds")
    synth.generate(root, images=8, size=64)
    return root


def _env(tmp_path: Path, channel: Path, hps: dict[str, str], pretrained_dir: Path | None = None) -> dict[str, str]:
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    import json

    (config / "hyperparameters.json").write_text(json.dumps(hps))
    environ = {"D2OPS_ML_ROOT": str(tmp_path), "SM_CHANNEL_DATASET": str(channel),
               "D2OPS_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    if pretrained_dir is not None:
        environ["SM_CHANNEL_PRETRAINED"] = str(pretrained_dir)
    return environ


def _run(environ: dict[str, str]) -> None:
    env = load_environment(environ, gpu_count=0)
    d2.run(env, parse_hyperparameters(env.hyperparameters), environ)


def test_a_config_built_for_pretrained_weights_is_refused_without_them(tmp_path: Path, channel: Path) -> None:
    require_detectron2()
    with pytest.raises(ConfigError) as raised:  # before any worker starts
        _run(_env(tmp_path, channel, {"framework": "detectron2", "model": ZOO}))
    line = str(raised.value)
    assert "faster_rcnn_R_50_FPN_3x.yaml expects pretrained weights" in line and "FREEZE_AT=2" in line
    assert "weights=scratch" in line and "\n" not in line


def test_scratch_and_a_pretrained_channel_contradict(tmp_path: Path, channel: Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.pkl").write_bytes(b"x")
    environ = _env(tmp_path, channel, {"framework": "detectron2", "weights": "scratch"}, folder)
    env = load_environment(environ, gpu_count=0)
    with pytest.raises(ConfigError, match="weights=scratch, but the 'pretrained' channel holds"):
        d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ)


def _built(options: list[str]) -> Any:
    from model_code.training import detectron2_worker

    job = {"source": {"kind": "zoo", "location": ZOO}, "options": ["MODEL.DEVICE", "cpu", *options]}
    return detectron2_worker.build_config(job)


def test_scratch_makes_the_default_config_trainable_from_random_weights() -> None:
    require_detectron2()
    import torch
    from detectron2.layers import FrozenBatchNorm2d
    from detectron2.modeling import build_model

    assert d2.pretrained_only(int(_built([]).MODEL.BACKBONE.FREEZE_AT), str(_built([]).MODEL.RESNETS.NORM))
    cfg = _built(d2.scratch_options([]))
    assert d2.pretrained_only(int(cfg.MODEL.BACKBONE.FREEZE_AT), str(cfg.MODEL.RESNETS.NORM)) == []
    model = build_model(cfg)
    assert not [n for n, m in model.named_modules() if isinstance(m, FrozenBatchNorm2d)]
    assert all(p.requires_grad for p in model.parameters())  # the stem and res2 learn too
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.roi_heads.box_head.modules())


def test_the_cpu_profile_trains_from_scratch_as_it_is() -> None:
    require_detectron2()
    from model_code.training import detectron2_worker

    job = {"source": {"kind": "file", "location": str(d2.SHIPPED_CONFIG_DIR / d2.CPU_PROFILE)}, "options": []}
    cfg = detectron2_worker.build_config(job)
    # nothing to change, so weights=scratch (the demo's PretrainedWeightsKey=none) leaves it exactly as measured
    assert d2.pretrained_only(int(cfg.MODEL.BACKBONE.FREEZE_AT), str(cfg.MODEL.RESNETS.NORM)) == []


def test_a_restart_resumes_its_checkpoint_not_the_pretrained_weights(tmp_path: Path, channel: Path) -> None:
    """A spot restart of a fine-tuning job: OUTPUT_DIR (/opt/ml/checkpoints) wins over MODEL.WEIGHTS."""
    require_detectron2()
    import torch

    from model_code.dataset_version import Categories, open_dataset_version
    from model_code.training import detectron2_worker

    version = open_dataset_version(channel)
    registrations = d2.dataset_registrations(version, version, Categories(ids=[1, 2, 3],
                                                                          names=["square", "disc", "triangle"]))
    detectron2_worker.register([vars(r) for r in registrations])
    weights = tmp_path / "pretrained" / "model.pth"
    weights.parent.mkdir()

    def cfg(initial: str) -> Any:
        return detectron2_worker.build_config({
            "source": vars(d2.config_source(None, "detection", use_gpu=False)),
            "options": ["DATASETS.TRAIN", f"('{d2.TRAIN_DATASET}',)", "MODEL.ROI_HEADS.NUM_CLASSES", "3",
                        "MODEL.DEVICE", "cpu", "SEED", "1", "DATALOADER.NUM_WORKERS", "0", "MODEL.WEIGHTS", initial,
                        "OUTPUT_DIR", str(tmp_path / "checkpoints")]})

    def stem(trainer: Any) -> torch.Tensor:
        return trainer.model.backbone.bottom_up.stem.conv1.weight

    maker = detectron2_worker.Trainer(cfg(""))
    with torch.no_grad():
        stem(maker).fill_(1.0)
    torch.save({"model": maker.model.state_dict()}, weights)

    first = detectron2_worker.Trainer(cfg(str(weights)))
    assert not first.checkpointer.has_checkpoint()
    first.resume_or_load(resume=True)
    assert first.start_iter == 0 and bool((stem(first) == 1.0).all())  # fine-tuning starts from the file
    with torch.no_grad():
        stem(first).fill_(2.0)  # what training made of it
    first.iter = 4
    (tmp_path / "checkpoints").mkdir()  # the entry point creates it (detectron2_trainer.run)
    first.checkpointer.save("model_0000004", iteration=4)

    restarted = detectron2_worker.Trainer(cfg(str(weights)))
    assert restarted.checkpointer.has_checkpoint()  # what main() tells the log by
    restarted.resume_or_load(resume=True)
    assert restarted.start_iter == 5 and bool((stem(restarted) == 2.0).all())  # not the pretrained 1.0
