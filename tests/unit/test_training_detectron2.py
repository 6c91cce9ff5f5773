"""The detectron2 trainer's pure parts: config choice, options, pretrained weights, the batch rules.

None of this needs detectron2 (the planning runs before detectron2 is imported); the one test
that compares our scaling with detectron2's own ``auto_scale_workers`` skips without it.
"""

from __future__ import annotations

import ast
import itertools
import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from d2ops import synth
from model_code.dataset_version import Categories, open_dataset_version
from model_code.training import detectron2_trainer as d2
from model_code.training.config import ConfigError, load_environment, parse_hyperparameters
from model_code.training.detectron2_sampler import POSITION_KEY, PositionKeyedDataset, ResumableBatchSampler
from model_code.training.detectron2_schedule import Solver, images_per_gpu_limit, plan_solver, solver_options
from model_code.training.distributed import plan_world
from tests.fixtures.frameworks import require_detectron2


def options_dict(opts: list[str]) -> dict[str, str]:
    assert len(opts) % 2 == 0
    return dict(zip(opts[0::2], opts[1::2], strict=True))


def test_config_source_zoo_name_shipped_file_and_rejections(tmp_path: Path) -> None:
    assert d2.config_source(None, "detection") == d2.ConfigSource("zoo", "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml")
    # without a GPU the default is the shipped CPU profile, for boxes and masks alike
    for task in ("detection", "instance_segmentation"):
        cpu = d2.config_source(None, task, use_gpu=False)
        assert cpu.kind == "file" and Path(cpu.location).name == d2.CPU_PROFILE and Path(cpu.location).is_file()
    assert d2.config_source("COCO-Detection/retinanet_R_50_FPN_1x.yaml", "detection", use_gpu=False).kind == "zoo"
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
    ("MODEL.WEIGHTS detectron2://ImageNetPretrained/MSRA/R-50.pkl", "`pretrained` input channel"),
    ("SEED -1", "seed hyperparameter"),  # a random seed could not be replayed on resume
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
    return {"D2OPS_ML_ROOT": str(root), "SM_CHANNEL_DATASET": str(channel),
            "D2OPS_CHECKPOINT_DIR": "/opt/ml/checkpoints"}


def test_job_plan_composes_config_registration_and_launch(tmp_path: Path, channel: Path) -> None:
    hps = {"framework": "detectron2", "ims_per_batch": "16", "base_lr": "0.02", "max_iter": "1000",
           "reference_world_size": "8", "checkpoint_period": "200", "eval_period": "500", "dist_port": "29555",
           "overrides": "SOLVER.BASE_LR 0.01 TEST.DETECTIONS_PER_IMAGE 50", "min_class_instances": "12"}
    environ = sm_tree(tmp_path, channel, ["algo-2", "algo-1"], "algo-2", hps)
    env = load_environment(environ, gpu_count=8)
    job, plan = d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ)
    assert job.min_class_instances == 12  # the export's score-threshold support (the stack's MinClassInstances)

    opts = job.options
    values = options_dict(opts)
    assert values["OUTPUT_DIR"] == "/opt/ml/checkpoints"  # resume_or_load finds last_checkpoint there
    assert values["DATASETS.TRAIN"] == "('d2ops_train',)" and values["DATASETS.TEST"] == "('d2ops_val',)"
    assert values["MODEL.ROI_HEADS.NUM_CLASSES"] == "3" and values["MODEL.MASK_ON"] == "False"
    # the requested schedule (at reference_world_size); run() rescales it once the config is built
    assert "SOLVER.REFERENCE_WORLD_SIZE" not in values
    assert values["SOLVER.IMS_PER_BATCH"] == "16" and values["SOLVER.MAX_ITER"] == "1000"
    assert ast.literal_eval(values["SOLVER.STEPS"]) == (800,)
    assert values["MODEL.DEVICE"] == "cuda"
    assert values["MODEL.WEIGHTS"] == ""  # no pretrained channel: from scratch, nothing downloaded
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


def test_planning_does_not_import_detectron2(tmp_path: Path, channel: Path) -> None:
    # the launcher plans before it imports detectron2; checked in a fresh interpreter (other tests import it)
    environ = sm_tree(tmp_path, channel, ["algo-1"], "algo-1", {"framework": "detectron2"})
    code = ("import json, sys; from model_code.training import detectron2_trainer as d2; "
            "from model_code.training.config import load_environment, parse_hyperparameters; "
            f"environ = json.loads({json.dumps(json.dumps(environ))}); env = load_environment(environ, gpu_count=0); "
            "job, plan = d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ); "
            "assert job.source.location.endswith(d2.CPU_PROFILE), job.source; "
            "assert 'detectron2' not in sys.modules, 'planning imported detectron2'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_shipped_config_keeps_its_solver_unless_a_hyperparameter_is_given(tmp_path: Path, channel: Path) -> None:
    environ = sm_tree(tmp_path, channel, ["algo-1"], "algo-1", {"framework": "detectron2", "base_lr": "0.005"})
    env = load_environment(environ, gpu_count=0)
    job, _ = d2.plan_job(env, parse_hyperparameters(env.hyperparameters), environ)
    values = options_dict(job.options)
    assert values["SOLVER.BASE_LR"] == "0.005" and values["MODEL.DEVICE"] == "cpu"
    # the CPU profile's own batch and schedule stand: the hyperparameter defaults are for the cloud config
    assert not {"SOLVER.IMS_PER_BATCH", "SOLVER.MAX_ITER", "SOLVER.STEPS", "SOLVER.WARMUP_ITERS"} & set(values)

    hp = parse_hyperparameters({"framework": "detectron2", "max_iter": "300", "lr_steps": "0.5,0.75",
                                "clip_grad_norm": "2.5"})
    plan = plan_world(env, hp, environ)
    values = options_dict(d2.config_options(hp, plan, task="detection", num_classes=3, checkpoint_dir=tmp_path,
                                            source=d2.config_source(None, "detection", use_gpu=False)))
    assert values["SOLVER.MAX_ITER"] == "300" and ast.literal_eval(values["SOLVER.STEPS"]) == (150, 225)
    if "clip_grad_norm" in type(hp).model_fields:
        assert values["SOLVER.CLIP_GRADIENTS.CLIP_TYPE"] == "norm"
        assert values["SOLVER.CLIP_GRADIENTS.CLIP_VALUE"] == "2.5"


def test_pretrained_channel_gives_the_initial_weights(tmp_path: Path) -> None:
    assert d2.pretrained_weights({}) == ""
    folder = tmp_path / "pretrained"
    folder.mkdir()
    assert d2.pretrained_weights({"pretrained": folder}) == ""  # an empty channel: from scratch
    (folder / "model_final_280758.pkl").write_bytes(b"x")
    assert d2.pretrained_weights({"pretrained": folder}) == str(folder / "model_final_280758.pkl")
    (folder / "other.pth").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"2 weight files \(model_final_280758.pkl, other.pth\)"):
        d2.pretrained_weights({"pretrained": folder})
    readme = tmp_path / "readme-only"
    readme.mkdir()
    (readme / "README.txt").write_text("weights go here")
    with pytest.raises(ConfigError, match=r"no \.pkl or \.pth file among README\.txt"):
        d2.pretrained_weights({"pretrained": readme})
    with pytest.raises(ConfigError, match="is not a directory"):
        d2.pretrained_weights({"pretrained": tmp_path / "missing"})


def test_registration_maps_non_contiguous_category_ids(channel: Path) -> None:
    version = open_dataset_version(channel)
    regs = d2.dataset_registrations(version, version, Categories(ids=[3, 7, 42], names=["a", "b", "c"]))
    assert regs[0].thing_dataset_id_to_contiguous_id == {3: 0, 7: 1, 42: 2}


def solver(**kw: object) -> Solver:
    base = Solver(ims_per_batch=16, base_lr=0.02, max_iter=1000, steps=(800,), warmup_iters=100,
                  checkpoint_period=500, eval_period=0)
    return replace(base, **kw)


def test_world_size_that_cannot_split_the_batch_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="does not split evenly over 4 workers"):
        plan_solver(solver(ims_per_batch=6), reference_world_size=0, world_size=4)
    with pytest.raises(ConfigError, match="divisible by reference_world_size 8"):
        plan_solver(solver(ims_per_batch=12), reference_world_size=8, world_size=16)
    with pytest.raises(ConfigError, match=r"STEPS \(1200,\) must lie below SOLVER.MAX_ITER 1000"):
        plan_solver(solver(steps=(1200,)), reference_world_size=0, world_size=1)


@pytest.mark.parametrize(("reference", "world"), [(8, 16), (8, 4), (8, 8), (0, 4), (4, 1), (2, 6)])
def test_reference_world_size_rule_is_detectron2s_own(reference: int, world: int) -> None:
    defaults = require_detectron2("detectron2.engine.defaults")
    from detectron2.config import get_cfg

    requested = solver(steps=(700, 900), eval_period=250)
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.IMS_PER_BATCH", "16", "SOLVER.BASE_LR", "0.02", "SOLVER.MAX_ITER", "1000",
                         "SOLVER.STEPS", "(700, 900)", "SOLVER.WARMUP_ITERS", "100", "SOLVER.CHECKPOINT_PERIOD",
                         "500", "TEST.EVAL_PERIOD", "250", "SOLVER.REFERENCE_WORLD_SIZE", str(reference)])
    theirs = defaults.DefaultTrainer.auto_scale_workers(cfg, world)
    ours = plan_solver(requested, reference_world_size=reference, world_size=world).solver
    assert d2.requested_solver(theirs) == replace(ours, base_lr=pytest.approx(ours.base_lr))


def test_batch_per_gpu_never_exceeds_what_the_gpu_holds_and_lr_follows() -> None:
    # one 16 GB T4, R-50 FPN Mask R-CNN at COCO resolution: the default 16 images do not fit
    limit = images_per_gpu_limit(15.0, masks=True, train_pixels=800 * 1333)
    assert 2 <= limit < 16  # published: 3.4 GB at 2 images per GPU
    plan = plan_solver(solver(), reference_world_size=0, world_size=1, images_per_worker_limit=limit)
    s = plan.solver
    assert plan.per_worker == limit and s.ims_per_batch == limit
    k = limit / 16
    assert s.base_lr == pytest.approx(0.02 * k)  # linear scaling rule
    assert s.max_iter == round(1000 / k) and s.steps == (round(800 / k),) and s.warmup_iters == round(100 / k)
    assert any("do not fit" in note for note in plan.notes)

    # 8 GPUs of 80 GB hold 2 images each easily: nothing changes
    big = plan_solver(solver(), reference_world_size=0, world_size=8,
                      images_per_worker_limit=images_per_gpu_limit(80.0, masks=True, train_pixels=800 * 1333))
    assert big.solver == solver() and big.per_worker == 2 and big.notes == ()

    for memory in (8.0, 11.0, 15.0, 24.0, 40.0):
        for masks in (False, True):
            for world in (1, 2, 4, 8):
                limit = images_per_gpu_limit(memory, masks=masks, train_pixels=800 * 1333)
                plan = plan_solver(solver(ims_per_batch=64), reference_world_size=0, world_size=world,
                                   images_per_worker_limit=limit)
                assert 1 <= plan.per_worker <= limit
                assert plan.solver.base_lr / plan.solver.ims_per_batch == pytest.approx(0.02 / 64)


def test_memory_rule_scales_with_image_size_and_depth() -> None:
    full = images_per_gpu_limit(15.0, masks=False, train_pixels=800 * 1333)
    assert images_per_gpu_limit(15.0, masks=False, train_pixels=400 * 667) > full
    assert images_per_gpu_limit(15.0, masks=False, train_pixels=800 * 1333, depth=101) < full
    assert images_per_gpu_limit(15.0, masks=True, train_pixels=800 * 1333) <= full
    assert images_per_gpu_limit(0.5, masks=True, train_pixels=800 * 1333) == 1  # never zero
    with pytest.raises(ValueError, match="positive"):
        images_per_gpu_limit(0, masks=False, train_pixels=1)


def test_solver_options_hand_detectron2_the_final_schedule() -> None:
    plan = plan_solver(solver(), reference_world_size=8, world_size=16)
    values = options_dict(solver_options(plan))
    assert values["SOLVER.REFERENCE_WORLD_SIZE"] == "0"  # already scaled: detectron2 must not scale again
    assert values["SOLVER.IMS_PER_BATCH"] == "32" and ast.literal_eval(values["SOLVER.BASE_LR"]) == 0.04
    assert values["SOLVER.MAX_ITER"] == "500" and ast.literal_eval(values["SOLVER.STEPS"]) == (400,)
    assert values["SOLVER.WARMUP_ITERS"] == "50" and values["SOLVER.CHECKPOINT_PERIOD"] == "250"

# The exported signature (resize, channel order, boxes and masks back to the image) is d2-export's:
# tests/unit/test_detectron2_export.py and tests/integration/test_detectron2_serving.py.


@pytest.fixture(scope="module")
def d2_hooks():  # type: ignore[no-untyped-def]
    require_detectron2()
    from model_code.training import detectron2_hooks

    return detectron2_hooks


@pytest.fixture(scope="module")
def d2_worker():  # type: ignore[no-untyped-def]
    require_detectron2()
    from model_code.training import detectron2_worker

    return detectron2_worker


def test_metric_writer_is_an_event_writer_and_prints_metric_lines(d2_hooks, capsys: pytest.CaptureFixture) -> None:
    from detectron2.engine import hooks
    from detectron2.utils.events import EventStorage

    from d2ops_core import metrics
    writer = d2_hooks.MetricLineWriter(max_iter=100, images_per_batch=4)
    hooks.PeriodicWriter([writer], period=1)  # asserts every writer is an EventWriter
    with EventStorage(start_iter=7) as storage:
        for seconds in (1.0, 2.0):  # steps 8 and 9, not logged
            storage.put_scalars(time=seconds)
            storage.step()
        storage.put_scalars(total_loss=0.75, lr=0.02, time=3.0)
        storage.put_scalar("bbox/AP50", 81.5, smoothing_hint=False)
        storage.put_scalar("bbox/APl", float("nan"), smoothing_hint=False)  # COCO's undefined AP: left out
        writer.write()
        writer.write()  # the same iteration is not printed twice
        storage.step()
        storage.put_scalars(total_loss=0.5, time=5.0)
        writer.write()  # the step time since the previous line only
    parsed = [metrics.parse_metric(line) for line in capsys.readouterr().out.splitlines()]
    # seconds per iteration: the mean of the steps since the last line (1, 2, 3); images/s: the batch over it
    assert parsed == [("train:loss", 0.75, 10, 100), ("train:lr", 0.02, 10, 100), ("train:iter_seconds", 2.0, 10, 100),
                      ("train:images_per_second", 2.0, 10, 100), ("val:bbox_AP50", 0.815, 10, None),
                      ("train:loss", 0.5, 11, 100), ("train:iter_seconds", 5.0, 11, 100),
                      ("train:images_per_second", 0.8, 11, 100)]


class _CountedSteps(list):
    """detectron2's step-time history (a list of (seconds, iteration)), counting the entries read from it."""

    read = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        item = super().__getitem__(index)
        self.read += len(item) if isinstance(index, slice) else 1
        return item

    def __iter__(self):  # type: ignore[no-untyped-def]
        for item in super().__iter__():
            self.read += 1
            yield item

    def __reversed__(self):  # type: ignore[no-untyped-def]
        for item in super().__reversed__():
            self.read += 1
            yield item


def test_each_metric_line_reads_only_the_step_times_since_the_previous_one(d2_hooks, capsys) -> None:
    from detectron2.utils.events import EventStorage

    from d2ops_core import metrics
    writer = d2_hooks.MetricLineWriter(max_iter=90_000, images_per_batch=4)
    with EventStorage() as storage:
        for _ in range(5000):  # a long run's history: the writer reads it at most once
            storage.put_scalars(time=1.0)
            storage.step()
        storage.put_scalars(total_loss=0.5, time=1.0)
        writer.write()
        history = storage.history("time")
        history._data = steps = _CountedSteps(history.values())
        for seconds in (2.0, 3.0, 4.0):
            storage.step()
            storage.put_scalars(total_loss=0.5, time=seconds)
        steps.read = 0
        writer.write()
    # the three new steps and the one before them that says where to stop, however long the run
    assert steps.read <= 4
    parsed = [metrics.parse_metric(line) for line in capsys.readouterr().out.splitlines()]
    assert parsed[-2:] == [("train:iter_seconds", 3.0, 5004, 90_000),
                           ("train:images_per_second", 1.333333, 5004, 90_000)]


def test_checkpointer_keeps_the_newest_across_restarts(d2_hooks, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from detectron2.checkpoint import DetectionCheckpointer
    from torch import nn

    for old in (9, 19, 29):  # left by an earlier attempt of the job
        (tmp_path / f"model_{old:07d}.pth").write_bytes(b"old")
    hook = d2_hooks.NewestCheckpoints(DetectionCheckpointer(nn.Linear(2, 2), str(tmp_path)), 10, max_to_keep=2)
    hook.trainer = SimpleNamespace(max_iter=100)
    hook.before_train()
    assert sorted(p.name for p in tmp_path.glob("model_*")) == ["model_0000019.pth", "model_0000029.pth"]
    hook.step(39)  # the periodic save
    hook.save_now(44)  # SIGTERM
    assert sorted(p.name for p in tmp_path.glob("model_*")) == ["model_0000039.pth", "model_0000044.pth"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000044.pth"


def test_the_cpu_profile_builds_a_resnet_that_ends_at_res4_and_trains(d2_worker) -> None:
    import torch
    from detectron2.config import get_cfg
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import BACKBONE_REGISTRY, build_model
    from detectron2.modeling.backbone.fpn import build_resnet_fpn_backbone
    from detectron2.structures import Boxes, Instances
    from detectron2.utils.events import EventStorage

    cfg = get_cfg()
    cfg.merge_from_file(str(d2.SHIPPED_CONFIG_DIR / d2.CPU_PROFILE))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.ROI_HEADS.NUM_CLASSES", "3"])
    model = build_model(cfg)
    assert [name for name, _ in model.backbone.bottom_up.named_children()] == ["stem", "res2", "res3", "res4"]
    assert {k: v.stride for k, v in model.backbone.output_shape().items()} == {"p2": 4, "p3": 8, "p4": 16, "p5": 32}

    def sample() -> dict:
        instances = Instances((128, 128), gt_boxes=Boxes(torch.tensor([[20.0, 30.0, 60.0, 70.0]])),
                              gt_classes=torch.tensor([1]))
        return {"image": torch.rand(3, 128, 128) * 255, "instances": instances, "height": 128, "width": 128}

    torch.manual_seed(0)
    model.train()
    with EventStorage():
        losses = model([sample(), sample()])
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())
    assert all(p.grad is not None for p in model.backbone.parameters())  # every stage and FPN level learns

    # With res5 it is detectron2's own builder: same levels, same weights (a checkpoint of one loads into the other).
    full = cfg.clone()
    full.merge_from_list(["MODEL.RESNETS.OUT_FEATURES", '["res2", "res3", "res4", "res5"]',
                          "MODEL.FPN.IN_FEATURES", '["res2", "res3", "res4", "res5"]'])
    ours = BACKBONE_REGISTRY.get("build_truncated_resnet_fpn_backbone")(full, ShapeSpec(channels=3))
    theirs = build_resnet_fpn_backbone(full, ShapeSpec(channels=3))
    assert ours.output_shape() == theirs.output_shape() and set(ours.output_shape()) == {"p2", "p3", "p4", "p5", "p6"}
    assert ({n: p.shape for n, p in ours.state_dict().items()} == {n: p.shape for n, p in theirs.state_dict().items()})


def test_worker_failures_map_to_the_entry_points_exceptions(d2_worker) -> None:
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from model_code.training.torchvision_trainer import Interrupted, TrainingError

    stopped = d2_worker.worker_failure(ProcessExitedException("exited", 0, 123, 143))
    assert isinstance(stopped, Interrupted)
    failed = d2_worker.worker_failure(ProcessRaisedException(
        "Traceback (most recent call last):\n  File x\nFloatingPointError: Loss became infinite or NaN\n", 1, 124))
    assert isinstance(failed, TrainingError) and str(failed).endswith("FloatingPointError: Loss became infinite or NaN")
    other = ValueError("x")
    assert d2_worker.worker_failure(other) is other


# The resumable data stream (model_code/training/detectron2_sampler.py): pure, no detectron2 needed.

def stream(sampler: ResumableBatchSampler, iterations: int) -> list[list[tuple[int, int]]]:
    return list(itertools.islice(iter(sampler), iterations))


def test_sampler_started_at_an_iteration_continues_the_uninterrupted_stream() -> None:
    whole = stream(ResumableBatchSampler(10, images_per_rank=4, rank=0, world_size=1, seed=3), 12)
    for start in (1, 2, 5, 11):
        resumed = ResumableBatchSampler(10, images_per_rank=4, rank=0, world_size=1, seed=3)
        resumed.start_at(start)
        assert stream(resumed, 12 - start) == whole[start:]
    # iteration i covers positions [4i, 4i+4): the offset is start_iter * global batch
    assert [p for _, p in whole[5]] == [20, 21, 22, 23]
    assert whole == stream(ResumableBatchSampler(10, images_per_rank=4, rank=0, world_size=1, seed=3), 12)
    assert whole != stream(ResumableBatchSampler(10, images_per_rank=4, rank=0, world_size=1, seed=4), 12)


def test_sampler_shows_every_image_once_per_epoch_in_a_fresh_order() -> None:
    sampler = ResumableBatchSampler(12, images_per_rank=3, rank=0, world_size=1, seed=0)
    epochs = [[sampler.index_at(p) for p in range(e * 12, (e + 1) * 12)] for e in range(3)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3  # shuffled again each epoch
    # random access: the same position gives the same image, whatever was asked before
    assert [sampler.index_at(p) for p in (30, 2, 30)] == [epochs[2][6], epochs[0][2], epochs[2][6]]


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_take_disjoint_strides_that_make_up_the_global_batch(world: int) -> None:
    per_rank = 8 // world
    ranks = [ResumableBatchSampler(20, images_per_rank=per_rank, rank=r, world_size=world, seed=1)
             for r in range(world)]
    single = stream(ResumableBatchSampler(20, images_per_rank=8, rank=0, world_size=1, seed=1), 6)
    shards = [stream(r, 6) for r in ranks]
    for it in range(6):
        positions = [p for shard in shards for _, p in shard[it]]
        assert len(positions) == len(set(positions)) == 8  # no position twice across ranks
        # the same images at the same positions as one worker taking the whole batch: world size does not
        # change the data order
        assert sorted(pair for shard in shards for pair in shard[it]) == sorted(single[it])
    assert [p for _, p in shards[1][0]] == list(range(1, 8, world))  # detectron2's stride sharding


def test_aspect_ratio_grouping_batches_by_orientation_and_replays_on_resume() -> None:
    orientations = [0, 1, 1, 0, 1, 1, 1, 0, 1]
    grouped = ResumableBatchSampler(9, images_per_rank=2, rank=1, world_size=2, seed=5, orientations=orientations)
    whole = stream(grouped, 15)
    assert all(len({orientations[i] for i, _ in batch}) == 1 for batch in whole)
    assert all(p % 2 == 1 for batch in whole for _, p in batch)  # rank 1's stride
    resumed = ResumableBatchSampler(9, images_per_rank=2, rank=1, world_size=2, seed=5, orientations=orientations)
    resumed.start_at(7)
    assert stream(resumed, 8) == whole[7:]
    # one orientation for every image: grouping changes nothing
    flat = ResumableBatchSampler(9, images_per_rank=2, rank=1, world_size=2, seed=5, orientations=[1] * 9)
    assert stream(flat, 5) == stream(ResumableBatchSampler(9, images_per_rank=2, rank=1, world_size=2, seed=5), 5)


def test_sampler_rejects_what_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="no images"):
        ResumableBatchSampler(0, images_per_rank=1, rank=0, world_size=1, seed=0)
    with pytest.raises(ValueError, match="rank=2"):
        ResumableBatchSampler(4, images_per_rank=1, rank=2, world_size=2, seed=0)
    with pytest.raises(ValueError, match="start iteration -1"):
        ResumableBatchSampler(4, images_per_rank=1, rank=0, world_size=1, seed=0).start_at(-1)


def test_augmentation_randomness_is_keyed_by_position_and_leaves_the_global_rngs_alone() -> None:
    def mapper(record: dict) -> dict:  # what detectron2's transforms draw from
        return {"flip": float(np.random.uniform()), "size": random.random(), **record}

    dataset = PositionKeyedDataset([{"image_id": 7}], mapper, seed=2)
    np.random.seed(0)
    first = dataset[(0, 41)]
    after = np.random.uniform()
    np.random.seed(0)
    random.random()  # whatever else drew before must not matter
    assert dataset[(0, 41)] == first and first[POSITION_KEY] == 41
    assert np.random.uniform() == after  # the global stream continued as if the sample was never drawn
    assert dataset[(0, 42)]["flip"] != first["flip"]


def test_the_trainer_resumes_the_real_loader_where_the_checkpoint_left_off(d2_worker, tmp_path: Path,
                                                                          channel: Path) -> None:
    import torch

    version = open_dataset_version(channel)
    categories = Categories(ids=[1, 2, 3], names=["square", "disc", "triangle"])
    registrations = d2.dataset_registrations(version, version, categories)
    d2_worker.register([vars(r) for r in registrations])
    job = {"source": vars(d2.config_source(None, "detection", use_gpu=False)),
           "options": ["DATASETS.TRAIN", f"('{d2.TRAIN_DATASET}',)", "MODEL.ROI_HEADS.NUM_CLASSES", "3",
                       "MODEL.DEVICE", "cpu", "SEED", "4", "DATALOADER.NUM_WORKERS", "0",
                       "SOLVER.IMS_PER_BATCH", "3", "OUTPUT_DIR", str(tmp_path)]}
    cfg = d2_worker.build_config(job)

    def batches(trainer, n: int) -> list[list[tuple[int, torch.Tensor]]]:
        it = iter(trainer._trainer.data_loader)
        out = []
        for _ in range(n):
            np.random.uniform(size=5)  # the model or anything else drawing between steps changes nothing
            out.append([(s["image_id"], s["image"]) for s in next(it)])
        return out

    first = d2_worker.Trainer(cfg)
    first.resume_or_load(resume=True)  # nothing to resume: from the start
    whole = batches(first, 5)
    first.iter = 2  # the trainer's state in the checkpoint: as PeriodicCheckpointer saves after 3 iterations
    first.checkpointer.save("model_0000002", iteration=2)

    resumed = d2_worker.Trainer(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 3
    for want, got in zip(whole[3:], batches(resumed, 2), strict=True):
        assert [i for i, _ in want] == [i for i, _ in got]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(want, got, strict=True))  # same pixels: same flips
    with pytest.raises(RuntimeError, match="already iterating"):
        resumed._trainer.data_loader.start_at(0)
