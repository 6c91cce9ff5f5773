"""Detectron2 trainer (production): config composition, dataset registration, launch.

Everything that decides *what* detectron2 is asked to do is a pure function here and is
unit-tested without detectron2; detectron2 itself is imported only by :func:`run` (to build
the config and launch) and by :mod:`detectron2_worker`, which runs in every worker process.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from d2ops_core import pretrained
from d2ops_core.file_hash import file_sha256
from d2ops_core.gate import DEFAULT_MIN_CLASS_INSTANCES
from model_code.dataset_version import Categories, DatasetVersion, open_dataset_version, read_coco
from model_code.training.config import DATASET_CHANNEL, ConfigError, Hyperparameters, TrainingEnvironment
from model_code.training.detectron2_schedule import (
    Solver,
    SolverPlan,
    images_per_gpu_limit,
    plan_solver,
    solver_options,
)
from model_code.training.distributed import WorldPlan, communication_environment, plan_world

# One home with the stack's PretrainedWeightsKey default (d2ops_core.pretrained).
DEFAULT_CONFIGS = pretrained.DEFAULT_CONFIGS
# Without a GPU and without a `model` hyperparameter: this small config, not the cloud one (an R-50 at
# 800 px on a CPU grows to 14 GB and runs for hours). One file for boxes and masks (MODEL.MASK_ON).
CPU_PROFILE = "rcnn_R_18_FPN_cpu.yaml"
# Config files shipped with the package (package data of model_code.training): the same files in a
# checkout, an installed wheel and the training image.
SHIPPED_CONFIG_DIR = Path(str(importlib.resources.files("model_code.training") / "configs"))
TRAIN_DATASET = "d2ops_train"
VAL_DATASET = "d2ops_val"
PRETRAINED_CHANNEL = pretrained.CHANNEL
PRETRAINED_SUFFIXES = (".pkl", ".pth")
CHECKPOINTS_KEPT = 2  # the newest two periodic checkpoints (~330 MB each for an R-50)
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)*$")
_ZOO_NAME = re.compile(r"^[A-Za-z0-9_-]+/[A-Za-z0-9_.-]+\.(yaml|py)$")
# Keys the trainer owns: an override would silently break resume, the data or the batch rules.
RESERVED_KEYS = {
    "OUTPUT_DIR": "it is the checkpoint directory",
    "DATASETS.TRAIN": "it is the train channel", "DATASETS.TEST": "it is the val channel",
    "MODEL.ROI_HEADS.NUM_CLASSES": "it comes from the dataset's categories",
    "SOLVER.REFERENCE_WORLD_SIZE": "use the reference_world_size hyperparameter",
    "MODEL.WEIGHTS": "upload the weights file as the `pretrained` input channel (nothing is downloaded at train time; "
                     "`d2ops weights upload FILE --stack NAME`)",
    "SEED": "use the seed hyperparameter (data order and augmentation derive from it, so resume replays them)",
}
# Hyperparameter -> SOLVER key. For a model-zoo config these always apply (its own schedule is for
# COCO on 8 GPUs); a config shipped here carries its own defaults, overridden only by hyperparameters
# that were given.
_SOLVER_KEYS = {"ims_per_batch": "SOLVER.IMS_PER_BATCH", "base_lr": "SOLVER.BASE_LR", "max_iter": "SOLVER.MAX_ITER",
                "warmup_iters": "SOLVER.WARMUP_ITERS", "checkpoint_period": "SOLVER.CHECKPOINT_PERIOD",
                "momentum": "SOLVER.MOMENTUM", "weight_decay": "SOLVER.WEIGHT_DECAY",
                "eval_period": "TEST.EVAL_PERIOD"}


# What makes a config train from scratch, after detectron2's own configs/Misc/scratch_mask_rcnn_R_50_FPN_3x_gn.yaml
# (and its base mask_rcnn_R_50_FPN_3x_gn.yaml): nothing frozen, GroupNorm in the backbone, the FPN and
# the heads (GN needs no batch statistics, so it works at any batch per GPU, unlike BN), a 4-conv box
# head for that norm to act on. Applied only to a config that assumes pretrained weights.
SCRATCH_OPTIONS = {
    "MODEL.BACKBONE.FREEZE_AT": "0",
    "MODEL.RESNETS.NORM": "GN",
    "MODEL.RESNETS.STRIDE_IN_1X1": "False",
    "MODEL.FPN.NORM": "GN",
    "MODEL.ROI_BOX_HEAD.NAME": "FastRCNNConvFCHead",
    "MODEL.ROI_BOX_HEAD.NUM_CONV": "4",
    "MODEL.ROI_BOX_HEAD.NUM_FC": "1",
    "MODEL.ROI_BOX_HEAD.NORM": "GN",
    "MODEL.ROI_MASK_HEAD.NORM": "GN",
}


@dataclass(frozen=True)
class ConfigSource:
    kind: str  # "file" (shipped in the image) or "zoo" (detectron2 model zoo name)
    location: str


@dataclass(frozen=True)
class DatasetRegistration:
    """Arguments of detectron2's register_coco_instances plus the id mapping it must use."""

    name: str
    json_file: str
    image_root: str
    thing_classes: list[str]
    thing_dataset_id_to_contiguous_id: dict[int, int]


def config_source(model: str | None, task: str, shipped_dir: Path = SHIPPED_CONFIG_DIR, *,
                  use_gpu: bool = True) -> ConfigSource:
    """The config named by ``model``; by default the cloud config on a GPU, the CPU profile without one."""
    name = model or (DEFAULT_CONFIGS[task] if use_gpu else CPU_PROFILE)
    if ".." in name.split("/") or name.startswith("/"):
        raise ConfigError(f"hyperparameter model={name!r}: must be a model-zoo name or a file in {shipped_dir}")
    shipped = shipped_dir / name
    if shipped.is_file():
        return ConfigSource("file", str(shipped))
    if _ZOO_NAME.match(name):
        return ConfigSource("zoo", name)
    raise ConfigError(f"hyperparameter model={name!r}: neither a config file shipped in {shipped_dir} nor a "
                      "model-zoo name like 'COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml'")


def parse_overrides(text: str) -> list[str]:
    """``overrides`` as detectron2's ``KEY VALUE`` list: a JSON object or ``KEY VALUE KEY VALUE ...``."""
    stripped = text.strip()
    if not stripped:
        return []
    pairs: list[tuple[str, str]]
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except ValueError as exc:
            raise ConfigError(f"hyperparameter overrides: invalid JSON: {exc}") from None
        # detectron2 parses each value with literal_eval; JSON lists and numbers are valid Python literals.
        pairs = [(str(k), v if isinstance(v, str) else json.dumps(v).replace("true", "True")
                  .replace("false", "False").replace("null", "None")) for k, v in document.items()]
    else:
        tokens = shlex.split(stripped)
        if len(tokens) % 2:
            raise ConfigError(f"hyperparameter overrides: expected KEY VALUE pairs, got an odd number of tokens "
                              f"({len(tokens)}): {stripped!r}")
        pairs = list(zip(tokens[0::2], tokens[1::2], strict=True))
    out: list[str] = []
    for key, value in pairs:
        if key in RESERVED_KEYS:
            raise ConfigError(f"hyperparameter overrides: {key} is set by the trainer and cannot be overridden "
                              f"({RESERVED_KEYS[key]})")
        if not _KEY.match(key):
            raise ConfigError(f"hyperparameter overrides: {key!r} is not a config key like SOLVER.BASE_LR")
        out += [key, value]
    return out


def pretrained_weights(channels: Mapping[str, Path]) -> str:
    """MODEL.WEIGHTS: the one .pkl/.pth file in the optional ``pretrained`` channel, else "" (from scratch)."""
    directory = channels.get(PRETRAINED_CHANNEL)
    if directory is None:
        return ""
    if not directory.is_dir():
        raise ConfigError(f"input channel {PRETRAINED_CHANNEL!r}: {directory} is not a directory")
    files = sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith("."))
    weights = [p for p in files if p.suffix in PRETRAINED_SUFFIXES]
    if len(weights) > 1:
        raise ConfigError(f"input channel {PRETRAINED_CHANNEL!r}: {len(weights)} weight files "
                          f"({', '.join(p.name for p in weights)}); upload exactly one .pkl or .pth file")
    if not weights and files:
        raise ConfigError(f"input channel {PRETRAINED_CHANNEL!r}: no .pkl or .pth file among "
                          f"{', '.join(p.name for p in files[:5])}; upload a detectron2 checkpoint "
                          "(e.g. model_final_280758.pkl from detectron2's MODEL_ZOO.md)")
    return str(weights[0]) if weights else ""


def initial_weights(path: str) -> dict[str, Any] | None:
    """The artifact's ``initial_weights`` record (model_code.artifact.InitialWeights) of MODEL.WEIGHTS."""
    if not path:
        return None
    file = Path(path)
    return {"path": str(file), "sha256": file_sha256(file), "bytes": file.stat().st_size}


def pretrained_only(freeze_at: int, resnet_norm: str) -> list[str]:
    """What in a built config assumes pretrained weights (empty: it can train from scratch)."""
    reasons = []
    if freeze_at > 0:
        reasons.append(f"MODEL.BACKBONE.FREEZE_AT={freeze_at} (the stem{' and res2' if freeze_at > 1 else ''} "
                       "would stay at their random initialisation)")
    if resnet_norm == "FrozenBN":
        reasons.append("MODEL.RESNETS.NORM=FrozenBN (fixed statistics that only pretrained weights bring)")
    return reasons


def scratch_options(user_options: list[str]) -> list[str]:
    """SCRATCH_OPTIONS less the keys the user's ``overrides`` set (theirs win)."""
    mine = set(user_options[0::2])
    return [item for key, value in SCRATCH_OPTIONS.items() if key not in mine for item in (key, value)]


def dataset_registrations(train: DatasetVersion, val: DatasetVersion, categories: Categories
                          ) -> list[DatasetRegistration]:
    # Dataset category ids need not be contiguous; detectron2 maps them through this table both ways.
    mapping = {cid: i for i, cid in enumerate(categories.ids)}
    return [DatasetRegistration(TRAIN_DATASET, str(train.train_json), str(train.images_dir), categories.names,
                                mapping),
            DatasetRegistration(VAL_DATASET, str(val.val_json), str(val.images_dir), categories.names, mapping)]


def config_options(hp: Hyperparameters, plan: WorldPlan, *, task: str, num_classes: int, checkpoint_dir: Path,
                   source: ConfigSource | None = None, weights: str = "") -> list[str]:
    """The ``KEY VALUE`` list merged over the base config; user overrides come last.

    The SOLVER values here are the *requested* ones (at ``reference_world_size``); :func:`run`
    turns them into the schedule that runs (:mod:`detectron2_schedule`) once the config is built.
    """
    zoo = source is None or source.kind == "zoo"
    given = hp.model_fields_set
    opts: dict[str, str] = {
        "DATASETS.TRAIN": f"('{TRAIN_DATASET}',)",
        "DATASETS.TEST": f"('{VAL_DATASET}',)",
        "MODEL.ROI_HEADS.NUM_CLASSES": str(num_classes),
        "MODEL.MASK_ON": str(task == "instance_segmentation"),
        "MODEL.DEVICE": "cuda" if plan.use_gpu else "cpu",
        "MODEL.WEIGHTS": weights,
        "SEED": str(hp.seed),
        "DATALOADER.NUM_WORKERS": str(hp.num_workers),
        # Checkpoints (and last_checkpoint) land in the synced directory, so resume_or_load finds them.
        "OUTPUT_DIR": str(checkpoint_dir),
    }
    for name, key in _SOLVER_KEYS.items():
        if zoo or name in given:
            value = getattr(hp, name)
            opts[key] = repr(value) if isinstance(value, float) else str(value)
    if zoo or given & {"max_iter", "lr_steps"}:
        opts["SOLVER.STEPS"] = repr(tuple(int(hp.max_iter * f) for f in hp.lr_steps))
    clip = hp.model_dump().get("clip_grad_norm")
    if clip is not None and (zoo or "clip_grad_norm" in given):
        opts["SOLVER.CLIP_GRADIENTS.ENABLED"] = str(clip > 0)
        if clip > 0:
            opts.update({"SOLVER.CLIP_GRADIENTS.CLIP_TYPE": "norm", "SOLVER.CLIP_GRADIENTS.CLIP_VALUE": repr(clip)})
    flat = [item for pair in opts.items() for item in pair]
    return flat + parse_overrides(hp.overrides)


def launch_arguments(plan: WorldPlan) -> dict[str, Any]:
    """Keyword arguments of detectron2.engine.launch for this host."""
    return {"num_gpus_per_machine": plan.processes_per_host, "num_machines": len(plan.hosts),
            "machine_rank": plan.machine_rank, "dist_url": plan.dist_url, "timeout": plan.timeout}


@dataclass(frozen=True)
class Detectron2Job:
    source: ConfigSource
    options: list[str]
    registrations: list[DatasetRegistration]
    task: str
    model_dir: str
    output_data_dir: str
    job_name: str | None
    dataset_name: str
    dataset_version: str
    log_period: int = 20
    checkpoints_kept: int = CHECKPOINTS_KEPT
    initial_weights: dict[str, Any] | None = None  # model_code.artifact.InitialWeights of MODEL.WEIGHTS
    inventory_digest: str | None = None  # the pipeline's validated inventory (hyperparameter), into the metadata
    min_class_instances: int = DEFAULT_MIN_CLASS_INSTANCES  # below it, a class's score threshold is the pooled one


def plan_job(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]
             ) -> tuple[Detectron2Job, WorldPlan]:
    from model_code.training.torchvision_trainer import categories_for

    train = val = open_dataset_version(env.channel(DATASET_CHANNEL))  # both splits, one channel
    categories = categories_for(train, val)
    from model_code.training.coco_dataset import check_image_files  # torch: imported where training starts

    # detectron2's loader opens file_name wherever it points; refuse what reaches outside the channel first.
    for split_file, images_dir in ((train.train_json, train.images_dir), (val.val_json, val.images_dir)):
        check_image_files(read_coco(split_file), images_dir, str(split_file))
    plan = plan_world(env, hp, environ)
    source = config_source(hp.model, train.task, use_gpu=plan.use_gpu)
    weights = pretrained_weights(env.channels)
    if weights and hp.weights == "scratch":
        raise ConfigError(f"hyperparameter weights=scratch, but the {PRETRAINED_CHANNEL!r} channel holds {weights}: "
                          "drop one of them")
    job = Detectron2Job(source=source,
                        options=config_options(hp, plan, task=train.task, num_classes=len(categories.ids),
                                               checkpoint_dir=env.checkpoint_dir, source=source,
                                               weights=weights),
                        initial_weights=initial_weights(weights),
                        registrations=dataset_registrations(train, val, categories), task=train.task,
                        model_dir=str(env.model_dir), output_data_dir=str(env.output_data_dir),
                        job_name=env.job_name, dataset_name=train.name, dataset_version=train.version,
                        log_period=hp.log_period, inventory_digest=hp.inventory_digest,
                        min_class_instances=hp.min_class_instances)
    return job, plan


def requested_solver(cfg: Any) -> Solver:
    """The SOLVER/TEST values of a built detectron2 config."""
    return Solver(ims_per_batch=int(cfg.SOLVER.IMS_PER_BATCH), base_lr=float(cfg.SOLVER.BASE_LR),
                  max_iter=int(cfg.SOLVER.MAX_ITER), steps=tuple(int(s) for s in cfg.SOLVER.STEPS),
                  warmup_iters=int(cfg.SOLVER.WARMUP_ITERS), checkpoint_period=int(cfg.SOLVER.CHECKPOINT_PERIOD),
                  eval_period=int(cfg.TEST.EVAL_PERIOD))


def train_pixels(cfg: Any) -> int:
    """The largest training image after detectron2's ResizeShortestEdge (an upper bound)."""
    sizes = cfg.INPUT.MIN_SIZE_TRAIN
    short = max(sizes) if isinstance(sizes, list | tuple) else int(sizes)
    return int(short * max(short, int(cfg.INPUT.MAX_SIZE_TRAIN)))


def gpu_memory_gib() -> float | None:
    """The smallest visible GPU's memory (SageMaker instances are homogeneous; be safe anyway)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 2**30


def log(message: str) -> None:
    print(message, flush=True)


def run(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> None:
    import os

    if hp.model is None and env.num_gpus == 0:
        # First thing the job says: which config it trains, and how to ask for another.
        log(f"no GPU and no `model` hyperparameter: training the CPU profile {CPU_PROFILE} (R-18 to res4 with an "
            "FPN, 128 px); set model= to a model-zoo name or a shipped config for another")
    job, plan = plan_job(env, hp, environ)
    from detectron2.engine import launch

    from model_code.training import detectron2_worker

    cfg = detectron2_worker.build_config(asdict(job))
    frozen = pretrained_only(int(cfg.MODEL.BACKBONE.FREEZE_AT), str(cfg.MODEL.RESNETS.NORM))
    if frozen and not cfg.MODEL.WEIGHTS:
        name = Path(job.source.location).name
        if hp.weights != "scratch":
            raise ConfigError(f"detectron2 config {name} expects pretrained weights ({'; '.join(frozen)}) and the job "
                              f"has no {PRETRAINED_CHANNEL!r} channel: give it one (`d2ops weights upload FILE` puts a "
                              "model-zoo checkpoint where the pipeline sends it) or set weights=scratch")
        extra = scratch_options(parse_overrides(hp.overrides))
        job = replace(job, options=job.options + extra)
        cfg = detectron2_worker.build_config(asdict(job))
        if plan.is_master_host:
            log(f"from scratch (weights=scratch): {name} was built for pretrained weights; training it with "
                f"{' '.join(f'{k}={v}' for k, v in zip(extra[0::2], extra[1::2], strict=True))}")
    memory = gpu_memory_gib() if plan.use_gpu else None
    limit = (images_per_gpu_limit(memory, masks=bool(cfg.MODEL.MASK_ON), train_pixels=train_pixels(cfg),
                                  depth=int(cfg.MODEL.RESNETS.DEPTH)) if memory else None)
    solver = plan_solver(requested_solver(cfg), reference_world_size=int(cfg.SOLVER.REFERENCE_WORLD_SIZE),
                         world_size=plan.world_size, images_per_worker_limit=limit)
    if plan.is_master_host:
        describe(job, plan, solver, memory, limit)
    # The final schedule comes last: it already includes the user's overrides, which were merged above.
    job = replace(job, options=job.options + solver_options(solver))
    os.environ.update(communication_environment(plan, environ))
    env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    detectron2_worker.install_sigterm_forwarding()  # a worker in this process (world 1) installs its own
    try:
        launch(detectron2_worker.main, args=(asdict(job),), **launch_arguments(plan))
    except Exception as exc:
        raise detectron2_worker.worker_failure(exc) from None


def describe(job: Detectron2Job, plan: WorldPlan, solver: SolverPlan, memory: float | None, limit: int | None
             ) -> None:
    s = solver.solver
    where = f"{memory:.1f} GiB GPUs (at most {limit} images each)" if memory else "CPU"
    log(f"detectron2 {Path(job.source.location).name} ({job.task}): world {plan.world_size} "
        f"({len(plan.hosts)} hosts x {plan.processes_per_host}) on {where}, global batch {s.ims_per_batch} "
        f"({solver.per_worker}/worker), lr {s.base_lr:g}, max_iter {s.max_iter}, steps {list(s.steps)}, "
        f"warmup {min(s.warmup_iters, s.max_iter)}")
    for note in solver.notes:
        log(f"batch rule: {note}")
    weights = job.initial_weights
    log(f"initial weights: {weights['path']} (sha256 {weights['sha256']}, {weights['bytes']} bytes); a resumed "
        "job continues from its checkpoint instead" if weights else
        "initial weights: none (from scratch; a `pretrained` channel with one .pkl/.pth file fine-tunes instead)")
    sys.stdout.flush()
