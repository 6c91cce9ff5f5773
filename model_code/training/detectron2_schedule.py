"""The detectron2 solver after the world-size and GPU-memory rules: pure functions, no detectron2.

Two rules change the batch, and both follow the linear scaling rule (Goyal et al., "ImageNet
in 1 hour"), with exactly the arithmetic of detectron2's ``DefaultTrainer.auto_scale_workers``:
a global batch multiplied by k gets the learning rate multiplied by k and every iteration
count (max_iter, steps, warm-up, checkpoint and eval periods) divided by k, so the run sees
the same number of images.

1. ``SOLVER.REFERENCE_WORLD_SIZE = R > 0``: the config describes R workers; on W, k = W / R.
2. A GPU holds only so many images: when the per-GPU share of the batch does not fit, the
   batch shrinks to what fits on every GPU (k < 1) instead of running out of memory.

The trainer applies both here and hands detectron2 the result with REFERENCE_WORLD_SIZE 0,
so detectron2 does not scale a second time and the log states the schedule that really runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from model_code.training.config import ConfigError

# detectron2's MODEL_ZOO.md "train mem" at 2 images per GPU, COCO resolution (short side up to
# 800, long side up to 1333): Faster R-CNN R50-FPN 3.0 GB, Mask R-CNN R50-FPN 3.4 GB; R101-FPN
# needs about 4.1 GB (Faster R-CNN). The whole figure is charged per image (weights, optimizer
# state and the CUDA context included), which overestimates and so errs on the side of fitting.
PUBLISHED_GB_AT_TWO_IMAGES = {False: 3.0, True: 3.4}
DEEP_BACKBONE_FACTOR = 4.1 / 3.0  # ResNet-101 and deeper
REFERENCE_PIXELS = 800 * 1333
GPU_MEMORY_HEADROOM = 0.85  # fragmentation, cudnn workspaces, evaluation on the same GPU
MIN_PIXEL_FRACTION = 1 / 16  # fixed costs do not shrink with the image


@dataclass(frozen=True)
class Solver:
    """The SOLVER/TEST values that the batch rules touch; ``ims_per_batch`` is the global batch."""

    ims_per_batch: int
    base_lr: float
    max_iter: int
    steps: tuple[int, ...]
    warmup_iters: int
    checkpoint_period: int
    eval_period: int

    def per_worker(self, world_size: int) -> int:
        return self.ims_per_batch // world_size


def rescale(solver: Solver, scale: float) -> Solver:
    """Linear scaling by ``scale`` with auto_scale_workers' rounding (round(...))."""
    if scale == 1:
        return solver
    return replace(
        solver,
        ims_per_batch=round(solver.ims_per_batch * scale),
        base_lr=solver.base_lr * scale,
        max_iter=max(1, round(solver.max_iter / scale)),
        steps=tuple(round(s / scale) for s in solver.steps),
        warmup_iters=round(solver.warmup_iters / scale),
        # detectron2 would let these reach 0 (a zero checkpoint period divides by zero); we stop at 1
        checkpoint_period=max(1, round(solver.checkpoint_period / scale)),
        eval_period=round(solver.eval_period / scale),
    )


def auto_scale(solver: Solver, reference_world_size: int, world_size: int) -> Solver:
    """detectron2's ``DefaultTrainer.auto_scale_workers`` on these values."""
    if reference_world_size in (0, world_size):
        return solver
    if solver.ims_per_batch % reference_world_size:
        raise ConfigError(f"SOLVER.IMS_PER_BATCH {solver.ims_per_batch} must be divisible by "
                          f"reference_world_size {reference_world_size}")
    return rescale(solver, world_size / reference_world_size)


def images_per_gpu_limit(gpu_memory_gib: float, *, masks: bool, train_pixels: int, depth: int = 50) -> int:
    """How many training images one GPU holds for an R-CNN FPN model (at least 1).

    ``train_pixels`` is the largest training image after resizing (MIN_SIZE_TRAIN max x
    MAX_SIZE_TRAIN); memory is charged in proportion to it, from the published R50-FPN figure.
    """
    if gpu_memory_gib <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_memory_gib}")
    per_image = PUBLISHED_GB_AT_TWO_IMAGES[masks] / 2
    if depth >= 101:
        per_image *= DEEP_BACKBONE_FACTOR
    per_image *= max(train_pixels / REFERENCE_PIXELS, MIN_PIXEL_FRACTION)
    return max(1, math.floor(gpu_memory_gib * GPU_MEMORY_HEADROOM / per_image))


@dataclass(frozen=True)
class SolverPlan:
    solver: Solver
    world_size: int
    notes: tuple[str, ...]  # what was changed and why, for the job log

    @property
    def per_worker(self) -> int:
        return self.solver.per_worker(self.world_size)


def plan_solver(requested: Solver, *, reference_world_size: int, world_size: int,
                images_per_worker_limit: int | None = None) -> SolverPlan:
    """The solver that runs on ``world_size`` workers, each holding at most ``images_per_worker_limit``."""
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    notes: list[str] = []
    solver = auto_scale(requested, reference_world_size, world_size)
    if solver is not requested:
        notes.append(f"reference_world_size {reference_world_size} -> {world_size} workers: batch "
                     f"{requested.ims_per_batch} -> {solver.ims_per_batch}, lr {requested.base_lr:g} -> "
                     f"{solver.base_lr:g}, max_iter {requested.max_iter} -> {solver.max_iter}")
    if solver.ims_per_batch % world_size or solver.ims_per_batch < world_size:
        raise ConfigError(f"a global batch of {solver.ims_per_batch} images (ims_per_batch) does not split evenly "
                          f"over {world_size} workers")
    per_worker = solver.per_worker(world_size)
    if images_per_worker_limit is not None and per_worker > images_per_worker_limit:
        before = solver
        solver = rescale(solver, images_per_worker_limit * world_size / solver.ims_per_batch)
        notes.append(f"{per_worker} images per GPU do not fit in its memory (at most {images_per_worker_limit}): "
                     f"batch {before.ims_per_batch} -> {solver.ims_per_batch}, lr {before.base_lr:g} -> "
                     f"{solver.base_lr:g}, max_iter {before.max_iter} -> {solver.max_iter} (linear scaling)")
    if solver.steps and max(solver.steps) >= solver.max_iter:
        raise ConfigError(f"SOLVER.STEPS {solver.steps} must lie below SOLVER.MAX_ITER {solver.max_iter} "
                          "(lr_steps are fractions of max_iter in (0, 1))")
    return SolverPlan(solver=solver, world_size=world_size, notes=tuple(notes))


def solver_options(plan: SolverPlan) -> list[str]:
    """``KEY VALUE`` pairs for detectron2; REFERENCE_WORLD_SIZE 0 because the scaling is done."""
    s = plan.solver
    return ["SOLVER.IMS_PER_BATCH", str(s.ims_per_batch), "SOLVER.BASE_LR", repr(s.base_lr),
            "SOLVER.MAX_ITER", str(s.max_iter), "SOLVER.STEPS", repr(tuple(s.steps)),
            "SOLVER.WARMUP_ITERS", str(min(s.warmup_iters, s.max_iter)),
            "SOLVER.CHECKPOINT_PERIOD", str(s.checkpoint_period), "TEST.EVAL_PERIOD", str(s.eval_period),
            "SOLVER.REFERENCE_WORLD_SIZE", "0"]
