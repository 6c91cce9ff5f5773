"""The detectron2 hooks and metric writer the training worker (:mod:`detectron2_worker`) installs.

Imports detectron2 at module level (the metric writer must subclass its ``EventWriter``:
``hooks.PeriodicWriter`` asserts it), so only the worker imports this module. Why each hook does
what it does (checkpoints kept, the SIGTERM stop, replayable steps): :mod:`detectron2_worker`.
"""

from __future__ import annotations

import itertools
import os
import re

import torch
import torch.distributed as dist
from detectron2.engine import HookBase, hooks
from detectron2.utils import comm
from detectron2.utils.events import EventWriter, get_event_storage

from d2ops_core import metrics as metric_lines
from model_code.training import detectron2_sampler
from model_code.training.torchvision_trainer import Interrupted, StopFlag

_CHECKPOINT = re.compile(r"^model_(\d{7})\.pth$")
_TRAIN_METRICS = (("train:loss", "total_loss"), ("train:lr", "lr"), ("train:iter_seconds", "time"),
                  ("train:images_per_second", "images_per_second"))  # the last: computed by the writer
_EVAL_METRICS = tuple((f"val:{kind}_{suffix}", f"{kind}/{suffix}")
                      for kind in ("bbox", "segm") for suffix in metric_lines.AP_SUFFIXES)


def log(message: str) -> None:
    print(message, flush=True)


class MetricLineWriter(EventWriter):
    """detectron2's latest scalars as d2ops metric lines (names and format: d2ops_core.metrics).

    ``train:iter_seconds`` is the mean of detectron2's per-step ``time`` over the steps since the
    previous line (one step's time is noisy), and ``train:images_per_second`` the global batch
    over it; training lines carry the run's total iterations, so a follower can tell progress
    and time left.
    """

    def __init__(self, max_iter: int | None = None, images_per_batch: int | None = None) -> None:
        self._written: dict[str, int] = {}
        self.max_iter = max_iter
        self.images_per_batch = images_per_batch
        self._timed_until = -1  # the last step whose time went into a printed mean

    def _mean_step_seconds(self) -> float | None:
        storage = get_event_storage()
        try:
            history = storage.history("time").values()  # detectron2's list itself, up to 1e6 steps: no copy
        except KeyError:  # detectron2 times no step before its warm-up ones are done
            return None
        # Only the steps since the last line, walked back from the newest: a write costs what is new,
        # not the whole run's history (on the training thread, every log period of a 90k-iteration run).
        steps = list(itertools.takewhile(lambda step: step[1] > self._timed_until, reversed(history)))
        if not steps:
            return None
        self._timed_until = int(steps[0][1])
        return sum(float(seconds) for seconds, _ in steps) / len(steps)

    def write(self) -> None:
        storage = get_event_storage()
        latest = dict(storage.latest())
        if "time" in latest and self._written.get("train:iter_seconds") != latest["time"][1]:
            mean = self._mean_step_seconds()
            if mean is not None:
                latest["time"] = (mean, latest["time"][1])
                if self.images_per_batch and mean > 0:
                    latest["images_per_second"] = (self.images_per_batch / mean, latest["time"][1])
        for ours, theirs in _TRAIN_METRICS + _EVAL_METRICS:
            if theirs not in latest:
                continue
            value, iteration = latest[theirs]
            if self._written.get(ours) == iteration:
                continue
            self._written[ours] = iteration
            # detectron2 reports AP in percent; ours are fractions, as in the evaluation report
            value = float(value) / 100 if ours.startswith("val:") else float(value)
            if value == value and abs(value) != float("inf"):  # COCO leaves undefined APs as NaN
                total = self.max_iter if ours.startswith("train:") and self.max_iter else None
                log(metric_lines.format_metric_line(ours, value, iteration + 1, total))


class NewestCheckpoints(hooks.PeriodicCheckpointer):
    """``PeriodicCheckpointer(max_to_keep=N)`` that also counts an earlier attempt's files and can save now."""

    def before_train(self) -> None:
        super().before_train()
        save_dir = self.checkpointer.save_dir
        existing = sorted(n for n in os.listdir(save_dir) if _CHECKPOINT.match(n)) if os.path.isdir(save_dir) else []
        self.recent_checkpoints = [os.path.join(save_dir, n) for n in existing]
        self._prune()

    def save_now(self, iteration: int) -> str:
        self.checkpointer.save(f"{self.file_prefix}_{iteration:07d}", iteration=iteration)
        path = self.checkpointer.get_checkpoint_file()
        if path not in self.recent_checkpoints:
            self.recent_checkpoints.append(path)
        self._prune()
        return str(path)

    def _prune(self) -> None:
        assert self.max_to_keep is not None
        while len(self.recent_checkpoints) > self.max_to_keep:
            old = self.recent_checkpoints.pop(0)
            if self.path_manager.exists(old):
                self.path_manager.rm(old)


def _all_agree(flag: bool) -> bool:
    if comm.get_world_size() == 1:
        return flag
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class StopOnSigterm(HookBase):
    """After each iteration: did any rank get SIGTERM? Then checkpoint on rank 0 and stop every rank."""

    def __init__(self, checkpoints: NewestCheckpoints | None) -> None:
        self.checkpoints = checkpoints

    def after_step(self) -> None:
        if not _all_agree(StopFlag.requested):
            return
        iteration = self.trainer.iter  # 0-based index of the iteration that just finished
        if self.checkpoints is not None:
            path = self.checkpoints.save_now(iteration)
            log(f"checkpoint saved: {path} (iteration {iteration + 1})")
        comm.synchronize()  # nobody exits while rank 0 is still writing
        self.trainer.stopping = True
        raise Interrupted(f"stopped by SIGTERM at iteration {iteration + 1}; the next start resumes from there")


class ReplayableSteps(HookBase):
    """Before each step: torch's RNG from (seed, rank, iteration), so RPN/RoI sampling does not depend on
    how many iterations this process ran before (detectron2's checkpoints hold no RNG state).
    After each logged step: which images (id@position) this rank trained on, the data audit line."""

    def __init__(self, seed: int, log_period: int) -> None:
        self.seed, self.log_period = seed, log_period

    def before_step(self) -> None:
        torch.manual_seed(detectron2_sampler.step_seed(self.seed, comm.get_rank(), self.trainer.iter))

    def after_step(self) -> None:
        if (self.trainer.iter + 1) % self.log_period:
            return
        loader = self.trainer._trainer.data_loader
        samples = " ".join(f"{image}@{position}" for image, position in getattr(loader, "last_batch", []))
        log(f"data iter={self.trainer.iter + 1} rank={comm.get_rank()} images={samples}")
