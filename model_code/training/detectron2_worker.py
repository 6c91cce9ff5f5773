"""What runs inside each detectron2 worker process: the trainer (its hooks and metric writer are
:mod:`detectron2_hooks`), the config and dataset registration, resume, and the launch's failure mapping.

Imports detectron2 at module level (through :mod:`detectron2_hooks`), so only
:func:`detectron2_trainer.run` imports this module, in the training image or where ``make setup``
installed detectron2; ``launch`` spawns :func:`main` by its module path.

Choices, and why:

- Checkpoints: detectron2's ``PeriodicCheckpointer`` with ``max_to_keep`` (the newest
  ``checkpoints_kept``), counting files left by an earlier attempt too, so a spot-restarted
  job does not pile them up (~330 MB each for an R-50).
- SIGTERM (spot interruption, StopTrainingJob): every rank polls a flag after each
  iteration and all ranks agree with an all-reduce; rank 0 writes a checkpoint, all ranks
  meet at a barrier (so none exits while rank 0 still writes) and stop with
  :class:`Interrupted`, which the entry point turns into exit code 143.
- Evaluation: interim evaluations (``eval_period``) use detectron2's distributed
  ``inference_on_dataset``: every rank evaluates its share of val. The final evaluation
  is of the exported artifact, by rank 0 alone, *after* the process group is destroyed,
  so no rank waits for it at a collective and no NCCL timeout can fire during it.
- Resume: rank 0's newest checkpoint is what every rank resumes from; ranks on other
  hosts that lack the file get it from rank 0 before loading. The data stream
  (:mod:`detectron2_sampler`) then starts at the resumed iteration, and torch's RNG is
  seeded from (seed, rank, iteration) before every step, so a resumed run trains on the
  same images, flips and RPN/RoI samples as the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from detectron2.engine import DefaultTrainer, HookBase, defaults, hooks
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventWriter

from model_code.training import (
    detectron2_backbones,  # noqa: F401 (registers the CPU profile's backbone)
    detectron2_sampler,
)
from model_code.training.detectron2_hooks import (
    MetricLineWriter,
    NewestCheckpoints,
    ReplayableSteps,
    StopOnSigterm,
    log,
)
from model_code.training.detectron2_mapper import RuleDatasetMapper
from model_code.training.torchvision_trainer import Interrupted, StopFlag, TrainingError

EXIT_STOPPED = 143


class _QuietInterrupt(logging.Filter):
    """A spot stop is not an error: keep detectron2's "Exception during training" traceback out of the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Interrupted))


_create_ddp_model = defaults.create_ddp_model


def create_ddp_model(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """detectron2's, but also for CPU workers (gloo): upstream always passes ``device_ids=[local_rank]``,
    which DistributedDataParallel rejects for a CPU module."""
    if not any(p.is_cuda for p in model.parameters()):
        kwargs.setdefault("device_ids", None)
    return _create_ddp_model(model, **kwargs)


defaults.create_ddp_model = create_ddp_model  # DefaultTrainer.__init__ looks the name up in that module


def data_seed(cfg: Any) -> int:
    """The job's seed (the trainer always sets SEED from the seed hyperparameter, never -1 = random)."""
    if cfg.SEED < 0:
        raise TrainingError(f"SEED={cfg.SEED}: a random seed cannot be replayed after a resume; set the seed "
                            "hyperparameter")
    return int(cfg.SEED)


class Trainer(DefaultTrainer):
    log_period = 20
    checkpoints_kept = 2
    stopping = False

    @classmethod
    def build_train_loader(cls, cfg: Any) -> detectron2_sampler.ResumableLoader:
        return detectron2_sampler.build_train_loader(cfg, rank=comm.get_rank(), world_size=comm.get_world_size(),
                                                     seed=data_seed(cfg))

    @classmethod
    def build_test_loader(cls, cfg: Any, dataset_name: str) -> Any:
        from detectron2.data import build_detection_test_loader

        # evaluation during training (TEST.EVAL_PERIOD) reads val images by the one image rule too
        return build_detection_test_loader(cfg, dataset_name, mapper=RuleDatasetMapper(cfg, False))

    def resume_or_load(self, resume: bool = True) -> None:
        super().resume_or_load(resume=resume)
        # detectron2 creates the loader's iterator at the first step, so the stream can still move
        self._trainer.data_loader.start_at(self.start_iter)

    def after_train(self) -> None:
        try:
            super().after_train()
        except Exception as exc:
            if not self.stopping:
                raise
            # e.g. a timing summary over no timed iterations: it must not turn a clean stop into a failure
            log(f"after SIGTERM, ignored in the end-of-training hooks: {type(exc).__name__}: {exc}")

    @classmethod
    def build_evaluator(cls, cfg: Any, dataset_name: str, output_folder: str | None = None) -> Any:
        from detectron2.evaluation import COCOEvaluator

        # distributed: each rank evaluates its shard, rank 0 gathers; nothing written to the checkpoint dir
        return COCOEvaluator(dataset_name, output_dir=None)

    def build_writers(self) -> list[EventWriter]:
        # No TensorBoard/JSON files: OUTPUT_DIR is the checkpoint directory, synced to S3.
        return [CommonMetricPrinter(self.max_iter),
                MetricLineWriter(self.max_iter, images_per_batch=int(self.cfg.SOLVER.IMS_PER_BATCH))]

    def build_hooks(self) -> list[HookBase]:
        built: list[HookBase] = []
        checkpoints: NewestCheckpoints | None = None
        for hook in super().build_hooks():
            if isinstance(hook, hooks.PeriodicCheckpointer):
                hook = checkpoints = NewestCheckpoints(self.checkpointer, self.cfg.SOLVER.CHECKPOINT_PERIOD,
                                                       max_to_keep=self.checkpoints_kept)
            elif isinstance(hook, hooks.EvalHook):
                if not self.cfg.TEST.EVAL_PERIOD:
                    continue  # the exported artifact is evaluated after training instead
                hook = hooks.EvalHook(self.cfg.TEST.EVAL_PERIOD, lambda: self.test(self.cfg, self.model),
                                      eval_after_train=False)
            elif isinstance(hook, hooks.PeriodicWriter):
                hook = hooks.PeriodicWriter(self.build_writers(), period=self.log_period)
            built.append(hook)
        built.insert(0, ReplayableSteps(data_seed(self.cfg), self.log_period))
        built.append(StopOnSigterm(checkpoints))
        return built


def build_config(job: dict[str, Any]) -> Any:
    from detectron2 import model_zoo
    from detectron2.config import get_cfg

    cfg = get_cfg()
    source = job["source"]
    path = source["location"] if source["kind"] == "file" else model_zoo.get_config_file(source["location"])
    cfg.merge_from_file(path)
    try:
        cfg.merge_from_list(job["options"])
    except (KeyError, ValueError, AssertionError) as exc:
        from model_code.training.config import ConfigError

        raise ConfigError(f"detectron2 config {source['location']}: {exc} (check the overrides hyperparameter)"
                          ) from None
    cfg.freeze()
    return cfg


def register(registrations: list[dict[str, Any]]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    for reg in registrations:
        if reg["name"] in DatasetCatalog.list():
            continue
        register_coco_instances(reg["name"], {}, reg["json_file"], reg["image_root"])
        MetadataCatalog.get(reg["name"]).set(
            thing_classes=reg["thing_classes"],
            thing_dataset_id_to_contiguous_id={int(k): v for k, v in reg["thing_dataset_id_to_contiguous_id"].items()})


def share_last_checkpoint(checkpointer: Any) -> None:
    """Make every rank resume from rank 0's newest checkpoint (other hosts may lack the files)."""
    if comm.get_world_size() == 1:
        return
    save_dir = Path(checkpointer.save_dir)
    mine = Path(checkpointer.get_checkpoint_file()).name if checkpointer.has_checkpoint() else None
    name = comm.all_gather(mine)[0]
    pointer = save_dir / "last_checkpoint"
    if name is None:
        pointer.unlink(missing_ok=True)  # rank 0 starts from scratch, so does everyone
        return
    have = mine == name and (save_dir / name).is_file()
    if all(comm.all_gather(have)):
        return
    payload = [(save_dir / name).read_bytes() if comm.is_main_process() else None]
    dist.broadcast_object_list(payload, src=0, group=comm._get_global_gloo_group())
    if not have:
        save_dir.mkdir(parents=True, exist_ok=True)
        tmp = save_dir / f".{name}.tmp"
        tmp.write_bytes(bytes(payload[0] or b""))
        tmp.replace(save_dir / name)
        pointer.write_text(name)


def weights_digest(model: torch.nn.Module) -> str:
    """A hash of the parameters (not BN running statistics, which DDP leaves per rank)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def install_sigterm_forwarding() -> None:
    """In the launching process: remember SIGTERM and pass it on to the spawned workers."""
    def forward(signum: int, frame: FrameType | None) -> None:
        StopFlag.requested = True
        for child in multiprocessing.active_children():
            if child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)


def worker_failure(exc: BaseException) -> BaseException:
    """The exception the entry point should see for what ``launch`` raised."""
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    if isinstance(exc, Interrupted):
        return exc
    if isinstance(exc, ProcessExitedException) and (exc.exit_code == EXIT_STOPPED or StopFlag.requested):
        return Interrupted("stopped by SIGTERM: rank 0 wrote a checkpoint; the next start resumes from there")
    if isinstance(exc, ProcessRaisedException):
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return TrainingError(f"a training worker failed: {lines[-1] if lines else exc}")
    return exc


def main(job: dict[str, Any]) -> None:
    """One worker (one GPU, or one CPU process): train, then rank 0 exports and evaluates."""
    from detectron2.utils.env import seed_all_rng
    from detectron2.utils.logger import setup_logger

    StopFlag.install()
    rank, world = comm.get_rank(), comm.get_world_size()
    setup_logger(distributed_rank=rank, name="fvcore")
    setup_logger(distributed_rank=rank)
    logging.getLogger("detectron2.engine.train_loop").addFilter(_QuietInterrupt())
    register(job["registrations"])
    cfg = build_config(job)
    seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)

    Trainer.log_period = int(job.get("log_period", 20))
    Trainer.checkpoints_kept = int(job.get("checkpoints_kept", 2))
    trainer = Trainer(cfg)
    share_last_checkpoint(trainer.checkpointer)
    resuming = trainer.checkpointer.has_checkpoint()
    # OUTPUT_DIR/last_checkpoint after a spot restart (never the pretrained weights over it), else MODEL.WEIGHTS.
    # Loading MODEL.WEIGHTS skips every tensor whose shape differs from the model's (a checkpoint's head for
    # another class count): fvcore logs each "Skip loading parameter ..." line, then the ones left random.
    if rank == 0 and not resuming and cfg.MODEL.WEIGHTS:
        log(f"loading pretrained weights {cfg.MODEL.WEIGHTS} (mismatched shapes, such as a head for another class "
            "count, are skipped and trained from random)")
    trainer.resume_or_load(resume=True)
    if resuming and rank == 0:
        log(f"resuming from {trainer.checkpointer.get_checkpoint_file()} at iteration {trainer.start_iter}"
            + (f"; the pretrained weights {cfg.MODEL.WEIGHTS} are not loaded again" if cfg.MODEL.WEIGHTS else ""))
    try:
        trainer.train()
    except Interrupted as exc:
        if world == 1:
            raise
        log(str(exc))
        sys.exit(EXIT_STOPPED)  # spawned worker: the launcher maps this exit code back to Interrupted
    except FloatingPointError as exc:
        raise TrainingError(f"{exc}; lower base_lr (now {cfg.SOLVER.BASE_LR:g}) or raise warmup_iters") from None
    log(f"final weights digest {weights_digest(trainer.model)} (rank {rank})")
    if world > 1:
        comm.synchronize()
        dist.destroy_process_group()  # nothing collective is pending while rank 0 exports and evaluates
    if rank == 0:
        from model_code.training.detectron2_export import export_and_evaluate

        export_and_evaluate(cfg, trainer.model, job)
