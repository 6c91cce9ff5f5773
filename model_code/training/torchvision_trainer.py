"""torchvision Faster/Mask R-CNN trainer: DDP over gloo (CPU) or NCCL (GPU), checkpoints, SIGTERM-safe.

Runs offline and in tests. Hyperparameter names mean what they mean for detectron2 where
both have them (docs/training.md).
"""

from __future__ import annotations

import hashlib
import math
import re
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from d2ops_core import metrics as metric_lines
from model_code.artifact import write_json
from model_code.dataset_version import Categories, DatasetVersion, categories_of, read_coco
from model_code.training.checkpoints import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from model_code.training.coco_dataset import CocoDetectionSet, IterationBatchSampler, collate
from model_code.training.config import ConfigError, Hyperparameters
from model_code.training.distributed import learning_rate_factor
from model_code.training.run_context import RunContext

MODEL_PATTERN = re.compile(r"^(fasterrcnn|maskrcnn)_(resnet18|resnet34|resnet50|resnet101)_fpn$")
DEFAULT_MODELS = {"detection": "fasterrcnn_resnet50_fpn", "instance_segmentation": "maskrcnn_resnet50_fpn"}
FINAL_WEIGHTS = "model_final.pth"
TRAINING_CONFIG = "training_config.json"


class TrainingError(Exception):
    """Training itself went wrong (diverged loss, inconsistent data); the message says what to change."""


class Interrupted(Exception):
    """SIGTERM arrived; a checkpoint was written and the job should stop without a failure."""


def resolve_model(name: str | None, task: str) -> str:
    model = name or DEFAULT_MODELS[task]
    match = MODEL_PATTERN.match(model)
    if not match:
        raise ConfigError(f"hyperparameter model={model!r}: the torchvision trainer knows "
                          "(fasterrcnn|maskrcnn)_(resnet18|resnet34|resnet50|resnet101)_fpn")
    if task == "instance_segmentation" and match[1] != "maskrcnn":
        raise ConfigError(f"hyperparameter model={model!r} cannot segment; the dataset's task is "
                          "instance_segmentation: use a maskrcnn_* model")
    if task == "detection" and match[1] == "maskrcnn":
        raise ConfigError(f"hyperparameter model={model!r} needs masks; the dataset's task is detection: "
                          "use a fasterrcnn_* model (or set task: instance_segmentation in the manifest)")
    return model


def build_model(model_name: str, num_classes: int, hp: Hyperparameters) -> nn.Module:
    from torchvision.models.detection import FasterRCNN, MaskRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    match = MODEL_PATTERN.match(model_name)
    assert match is not None
    # Trained from scratch: no pretrained weights (the training job has no model-download step).
    # torchvision's default FrozenBatchNorm2d freezes statistics a pretrained backbone brings; from
    # scratch it is the identity, which leaves the ResNet unnormalised (12x the gradient norm at
    # init) and made lr 0.02 diverge after warm-up on some CPUs (docs/training.md, calibration).
    # GroupNorm normalises each image on its own: it works at 1-2 images per worker and computes
    # the same thing whatever the world size, unlike BatchNorm without synchronisation.
    backbone = resnet_fpn_backbone(backbone_name=match[2], weights=None, trainable_layers=5, norm_layer=group_norm)
    cls = MaskRCNN if match[1] == "maskrcnn" else FasterRCNN
    return cls(backbone, num_classes=num_classes + 1, min_size=hp.min_size, max_size=hp.max_size,
               rpn_pre_nms_top_n_train=hp.rpn_pre_nms_train, rpn_post_nms_top_n_train=hp.rpn_post_nms_train,
               rpn_pre_nms_top_n_test=hp.rpn_pre_nms_test, rpn_post_nms_top_n_test=hp.rpn_post_nms_test,
               box_batch_size_per_image=hp.roi_batch_size_per_image)


GROUP_NORM_GROUPS = 32  # every ResNet stage width (64..2048) divides by it


def group_norm(channels: int) -> nn.Module:
    return nn.GroupNorm(GROUP_NORM_GROUPS, channels)


class StopFlag:
    """Set by SIGTERM (spot interruption, StopTrainingJob); polled once per iteration."""

    requested = False

    @classmethod
    def install(cls) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            cls.requested = True
            print(f"received signal {signum}: checkpointing after this iteration", file=sys.stderr, flush=True)

        signal.signal(signal.SIGTERM, handler)


def log(message: str) -> None:
    print(message, flush=True)


def _all_agree(flag: bool, world: int) -> bool:
    if world == 1:
        return flag
    value = torch.tensor([1 if flag else 0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _resume_state(ctx: RunContext, rank: int) -> dict[str, Any] | None:
    """Rank 0 reads the newest checkpoint and shares it (other hosts may not have the files)."""
    message: list[Any] = [None]
    if rank == 0:
        try:
            path = latest_checkpoint(ctx.env.checkpoint_dir)
            message = [("ok", load_checkpoint(path), str(path)) if path else ("none", None, None)]
        except CheckpointError as exc:
            message = [("error", str(exc), None)]
    if ctx.plan.world_size > 1:
        dist.broadcast_object_list(message, src=0)
    kind, payload, path = message[0]
    if kind == "error":
        raise CheckpointError(payload)
    if kind == "ok":
        log(f"resuming from {path} at iteration {payload['iteration']}")
    return payload if kind == "ok" else None


def train_worker(local_rank: int, ctx: RunContext) -> None:
    """One DDP worker. Rank 0 also writes checkpoints, the artifact and the evaluation."""
    torch.set_num_threads(ctx.threads)
    plan, schedule, hp = ctx.plan, ctx.schedule, ctx.hp
    rank, world = plan.global_rank(local_rank), plan.world_size
    if ctx.plan.processes_per_host > 1:
        StopFlag.install()
    if world > 1:
        dist.init_process_group(plan.backend, init_method=plan.dist_url, world_size=world, rank=rank,
                                timeout=plan.timeout)
    device = torch.device(f"cuda:{local_rank}" if plan.use_gpu else "cpu")
    if plan.use_gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(hp.seed)
    model = build_model(ctx.model_name, len(ctx.categories.ids), hp).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=schedule.base_lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: learning_rate_factor(it, schedule))

    start_iter = 0
    state = _resume_state(ctx, rank)
    if state is not None:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint at iteration {state['iteration']} does not fit this model "
                                  f"({ctx.model_name}, {len(ctx.categories.ids)} classes): {exc}") from None
        restore_rng(state["rng"])
        start_iter = int(state["iteration"])
        del state
    if start_iter == 0 or rank > 0:  # rank 0 continues its restored stream; the others get their own
        torch.manual_seed(hp.seed + rank + start_iter)

    train_doc = read_coco(ctx.dataset.train_json)
    dataset = CocoDetectionSet(train_doc, ctx.dataset.images_dir, ctx.categories, with_masks=ctx.has_masks,
                               horizontal_flip=hp.horizontal_flip, seed=hp.seed, source=str(ctx.dataset.train_json))
    sampler = IterationBatchSampler(len(dataset), global_batch=schedule.global_batch, rank=rank, world_size=world,
                                    seed=hp.seed, start=start_iter, stop=schedule.max_iter)
    # Its own generator: creating the iterator draws a worker seed, and from the global RNG that draw
    # would shift the restored stream of a resumed run (RPN/RoI sampling) against the uninterrupted one.
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=hp.num_workers, collate_fn=collate,
                        persistent_workers=False, generator=torch.Generator().manual_seed(hp.seed + rank))
    ddp: nn.Module = (nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if plan.use_gpu else None)
                      if world > 1 else model)
    ddp.train()

    if rank == 0:
        log(f"training {ctx.model_name} on {len(dataset)} images, {len(ctx.categories.ids)} classes: "
            f"world {world} ({len(plan.hosts)} hosts x {plan.processes_per_host}), global batch "
            f"{schedule.global_batch} ({schedule.per_worker_batch}/worker), lr {schedule.base_lr:g}, "
            f"iterations {start_iter}..{schedule.max_iter}")
    started, window_start, window_iters = time.monotonic(), time.monotonic(), 0
    iteration = start_iter
    for images, targets in loader:
        images = [i.to(device) for i in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        losses = ddp(images, targets)
        loss = sum(losses.values())
        assert isinstance(loss, torch.Tensor)
        if not math.isfinite(loss.item()):
            raise TrainingError(f"loss is {loss.item()} at iteration {iteration + 1} "
                                f"({ {k: round(v.item(), 4) for k, v in losses.items()} }); "
                                f"lower base_lr (now {schedule.base_lr:g}) or raise warmup_iters")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # DDP has averaged the gradients, so every rank computes the same norm and clips alike.
        grad_norm = float(nn.utils.clip_grad_norm_(params, hp.clip_grad_norm or math.inf))
        if not math.isfinite(grad_norm):
            raise TrainingError(f"gradient norm is {grad_norm} at iteration {iteration + 1}; "
                                f"lower base_lr (now {schedule.base_lr:g}) or raise warmup_iters")
        optimizer.step()
        scheduler.step()
        iteration += 1
        window_iters += 1
        if rank == 0 and (iteration % hp.log_period == 0 or iteration == schedule.max_iter):
            seconds = (time.monotonic() - window_start) / window_iters
            eta = seconds * (schedule.max_iter - iteration)
            lr = optimizer.param_groups[0]["lr"]
            log(f"iter {iteration}/{schedule.max_iter} loss {loss.item():.4f} lr {lr:.5f} "
                f"grad_norm {grad_norm:.2f} {seconds:.2f} s/iter, eta {eta:.0f} s")
            for name, value in (("train:loss", loss.item()), ("train:lr", lr), ("train:grad_norm", grad_norm),
                                ("train:iter_seconds", seconds),
                                ("train:images_per_second", schedule.global_batch / max(seconds, 1e-9))):
                log(metric_lines.format_metric_line(name, value, iteration, schedule.max_iter))
            window_start, window_iters = time.monotonic(), 0
        stop = _all_agree(StopFlag.requested, world)
        if rank == 0 and (stop or iteration % schedule.checkpoint_period == 0):
            path = save_checkpoint(ctx.env.checkpoint_dir, iteration, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state()})
            log(f"checkpoint saved: {path} (iteration {iteration})")
        if stop:
            if world > 1:
                dist.barrier()
            raise Interrupted(f"stopped by SIGTERM at iteration {iteration}; the next start resumes from there")
        if rank == 0 and schedule.eval_period and iteration % schedule.eval_period == 0 \
                and iteration < schedule.max_iter:
            _interim_evaluation(ctx, model, iteration)
            ddp.train()
        if world > 1 and schedule.eval_period and iteration % schedule.eval_period == 0:
            dist.barrier()
    # Every rank prints what it ended with: DDP keeps replicas identical, and the tests hold it to that.
    log(f"rank {rank} final weights sha256 {weights_digest(model)}")
    if rank == 0:
        log(f"training done: {schedule.max_iter - start_iter} iterations in {time.monotonic() - started:.1f} s")
        if iteration > start_iter and iteration % schedule.checkpoint_period:
            # an interruption during export or evaluation must not cost the training again
            save_checkpoint(ctx.env.checkpoint_dir, iteration, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state()})
        finish(ctx, model, schedule.max_iter)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _interim_evaluation(ctx: RunContext, model: nn.Module, iteration: int) -> None:
    import copy
    import tempfile

    from model_code.training.export import write_artifact

    with tempfile.TemporaryDirectory(prefix="d2ops-eval-") as tmp:
        evaluation = write_artifact(ctx, copy.deepcopy(model).cpu(), Path(tmp), iteration=iteration, report=False)
    for name, value in sorted(evaluation.metrics.items()):
        log(metric_lines.format_metric_line(f"val:{name}", value, iteration))


def finish(ctx: RunContext, model: nn.Module, iteration: int) -> None:
    """Native weights, then the exported artifact, evaluated through the artifact itself."""
    from model_code.training.export import write_artifact

    native = ctx.env.checkpoint_dir / FINAL_WEIGHTS
    torch.save(model.state_dict(), native.with_name(native.name + ".tmp"))
    native.with_name(native.name + ".tmp").replace(native)
    config = ctx.env.checkpoint_dir / TRAINING_CONFIG
    write_json(config, {"model": ctx.model_name, "hyperparameters": ctx.hp.model_dump(mode="json"),
                        "class_names": ctx.categories.names, "category_ids": ctx.categories.ids,
                        "task": ctx.dataset.task})
    evaluation = write_artifact(ctx, model.cpu(), ctx.env.model_dir, iteration=iteration, report=True,
                                native_files=[native, config])
    for name, value in sorted(evaluation.metrics.items()):
        log(metric_lines.format_metric_line(f"val:{name}", value, iteration))


def categories_for(train: DatasetVersion, val: DatasetVersion) -> Categories:
    cats = categories_of(read_coco(train.train_json))
    val_cats = categories_of(read_coco(val.val_json))
    if val_cats.ids != cats.ids:
        raise TrainingError(f"val categories {val_cats.ids} ({val.val_json}) differ from train categories "
                            f"{cats.ids} ({train.train_json})")
    return cats
