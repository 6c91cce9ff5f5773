"""Detectron2 trainer (production): config composition, dataset registration, launch, export.

Everything that decides *what* detectron2 is asked to do is a pure function here and is
unit-tested without detectron2 (it cannot be installed on the development machine);
detectron2 itself is imported lazily, only inside the functions that drive it in the
training image.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from model_code.dataset_version import Categories, DatasetVersion, open_dataset_version
from model_code.training.config import ConfigError, Hyperparameters, TrainingEnvironment
from model_code.training.distributed import WorldPlan, communication_environment, plan_world, scaled_schedule

DEFAULT_CONFIGS = {"detection": "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml",
                   "instance_segmentation": "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml"}
# Config files shipped in the training image (containers/training/configs is copied here).
SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TRAIN_DATASET = "d2ops_train"
VAL_DATASET = "d2ops_val"
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)*$")
_ZOO_NAME = re.compile(r"^[A-Za-z0-9_-]+/[A-Za-z0-9_.-]+\.(yaml|py)$")
# Keys the trainer owns: an override would silently break resume, the data or the world-size rule.
RESERVED_KEYS = ("OUTPUT_DIR", "DATASETS.TRAIN", "DATASETS.TEST", "MODEL.ROI_HEADS.NUM_CLASSES",
                 "SOLVER.REFERENCE_WORLD_SIZE")


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


def config_source(model: str | None, task: str, shipped_dir: Path = SHIPPED_CONFIG_DIR) -> ConfigSource:
    name = model or DEFAULT_CONFIGS[task]
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
            raise ConfigError(f"hyperparameter overrides: {key} is set by the trainer and cannot be overridden")
        if not _KEY.match(key):
            raise ConfigError(f"hyperparameter overrides: {key!r} is not a config key like SOLVER.BASE_LR")
        out += [key, value]
    return out


def dataset_registrations(train: DatasetVersion, val: DatasetVersion, categories: Categories
                          ) -> list[DatasetRegistration]:
    # Dataset category ids need not be contiguous; detectron2 maps them through this table both ways.
    mapping = {cid: i for i, cid in enumerate(categories.ids)}
    return [DatasetRegistration(TRAIN_DATASET, str(train.train_json), str(train.images_dir), categories.names,
                                mapping),
            DatasetRegistration(VAL_DATASET, str(val.val_json), str(val.images_dir), categories.names, mapping)]


def config_options(hp: Hyperparameters, plan: WorldPlan, *, task: str, num_classes: int,
                   checkpoint_dir: Path) -> list[str]:
    """The ``KEY VALUE`` list merged over the base config; user overrides come last."""
    scaled_schedule(hp, plan.world_size)  # the same divisibility checks, with our error messages
    opts = {
        "DATASETS.TRAIN": f"('{TRAIN_DATASET}',)",
        "DATASETS.TEST": f"('{VAL_DATASET}',)",
        "MODEL.ROI_HEADS.NUM_CLASSES": str(num_classes),
        "MODEL.MASK_ON": str(task == "instance_segmentation"),
        "MODEL.DEVICE": "cuda" if plan.use_gpu else "cpu",
        # detectron2 rescales these itself (DefaultTrainer.auto_scale_workers) from REFERENCE_WORLD_SIZE.
        "SOLVER.IMS_PER_BATCH": str(hp.ims_per_batch),
        "SOLVER.BASE_LR": repr(hp.base_lr),
        "SOLVER.MAX_ITER": str(hp.max_iter),
        "SOLVER.STEPS": repr(tuple(int(hp.max_iter * f) for f in hp.lr_steps)),
        "SOLVER.WARMUP_ITERS": str(min(hp.warmup_iters, hp.max_iter)),
        "SOLVER.CHECKPOINT_PERIOD": str(hp.checkpoint_period),
        "SOLVER.REFERENCE_WORLD_SIZE": str(hp.reference_world_size),
        "SOLVER.MOMENTUM": repr(hp.momentum),
        "SOLVER.WEIGHT_DECAY": repr(hp.weight_decay),
        "TEST.EVAL_PERIOD": str(hp.eval_period),
        "SEED": str(hp.seed),
        "DATALOADER.NUM_WORKERS": str(hp.num_workers),
        # Checkpoints (and last_checkpoint) land in the synced directory, so resume_or_load finds them.
        "OUTPUT_DIR": str(checkpoint_dir),
    }
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


def plan_job(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]
             ) -> tuple[Detectron2Job, WorldPlan]:
    from model_code.training.torchvision_trainer import categories_for

    train = open_dataset_version(env.channel("train"))
    val = open_dataset_version(env.channel("val"))
    categories = categories_for(train, val)
    plan = plan_world(env, hp, environ)
    job = Detectron2Job(source=config_source(hp.model, train.task),
                        options=config_options(hp, plan, task=train.task, num_classes=len(categories.ids),
                                               checkpoint_dir=env.checkpoint_dir),
                        registrations=dataset_registrations(train, val, categories), task=train.task,
                        model_dir=str(env.model_dir), output_data_dir=str(env.output_data_dir),
                        job_name=env.job_name, dataset_name=train.name, dataset_version=train.version)
    return job, plan


def run(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> None:  # pragma: no cover
    import os

    from detectron2.engine import launch

    job, plan = plan_job(env, hp, environ)
    os.environ.update(communication_environment(plan, environ))
    env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    launch(_main, args=(asdict(job),), **launch_arguments(plan))


def _register(registrations: list[dict[str, Any]]) -> None:  # pragma: no cover - needs detectron2
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    for reg in registrations:
        if reg["name"] in DatasetCatalog.list():
            continue
        register_coco_instances(reg["name"], {}, reg["json_file"], reg["image_root"])
        MetadataCatalog.get(reg["name"]).set(
            thing_classes=reg["thing_classes"],
            thing_dataset_id_to_contiguous_id={int(k): v for k, v in reg["thing_dataset_id_to_contiguous_id"].items()})


def _build_config(job: dict[str, Any]) -> Any:  # pragma: no cover - needs detectron2
    from detectron2 import model_zoo
    from detectron2.config import get_cfg

    cfg = get_cfg()
    source = job["source"]
    path = source["location"] if source["kind"] == "file" else model_zoo.get_config_file(source["location"])
    cfg.merge_from_file(path)
    cfg.merge_from_list(job["options"])
    cfg.freeze()
    return cfg


def _main(job: dict[str, Any]) -> None:  # pragma: no cover - needs detectron2
    import detectron2.utils.comm as comm
    from detectron2.engine import DefaultTrainer, default_setup, hooks
    from detectron2.evaluation import COCOEvaluator

    from d2ops import metrics as metric_lines

    _register(job["registrations"])
    cfg = _build_config(job)
    default_setup(cfg, None)

    class Trainer(DefaultTrainer):
        @classmethod
        def build_evaluator(cls, cfg: Any, dataset_name: str, output_folder: str | None = None) -> Any:
            return COCOEvaluator(dataset_name, output_dir=output_folder or f"{cfg.OUTPUT_DIR}/inference")

    trainer = Trainer(cfg)
    trainer.register_hooks([hooks.PeriodicWriter([_MetricLineWriter(metric_lines)], period=20)])
    trainer.resume_or_load(resume=True)  # continues from OUTPUT_DIR/last_checkpoint after a spot restart
    trainer.train()
    if comm.is_main_process():
        from model_code.training.detectron2_export import export_and_evaluate

        export_and_evaluate(cfg, trainer.model, job)
    comm.synchronize()


class _MetricLineWriter:  # pragma: no cover - needs detectron2's EventStorage
    """Prints detectron2's scalars as d2ops metric lines (the regexes in d2ops.metrics)."""

    def __init__(self, metric_lines: Any) -> None:
        self.lines = metric_lines

    def write(self) -> None:
        from detectron2.utils.events import get_event_storage

        storage = get_event_storage()
        latest = storage.latest()
        for ours, theirs in (("train:loss", "total_loss"), ("train:lr", "lr"), ("train:iter_seconds", "time")):
            if theirs in latest:
                print(self.lines.format_metric_line(ours, float(latest[theirs][0]), storage.iter + 1), flush=True)

    def close(self) -> None:
        return None
