"""World layout (ranks, rendezvous, backend) and the batch/learning-rate scaling rule.

Pure functions, shared by the torchvision and detectron2 trainers, so both compute ranks
and schedules the same way. The host order is ``sorted(hosts)`` everywhere: the machine
rank, the master host and the rank-0 host all come from that one list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from model_code.training.config import ConfigError, Hyperparameters, TrainingEnvironment


@dataclass(frozen=True)
class WorldPlan:
    hosts: tuple[str, ...]  # sorted
    current_host: str
    machine_rank: int
    processes_per_host: int
    use_gpu: bool
    master_addr: str
    master_port: int
    timeout: timedelta
    network_interface: str | None

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.processes_per_host

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"

    @property
    def dist_url(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    def global_rank(self, local_rank: int) -> int:
        if not 0 <= local_rank < self.processes_per_host:
            raise ValueError(f"local rank {local_rank} outside [0, {self.processes_per_host})")
        return self.machine_rank * self.processes_per_host + local_rank

    @property
    def is_master_host(self) -> bool:
        return self.machine_rank == 0


def plan_world(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> WorldPlan:
    """GPUs per host when there are GPUs, else ``cpu_processes_per_host`` gloo processes.

    ``MASTER_ADDR``/``MASTER_PORT`` (torch's own variables) override the first host's name
    and the ``dist_port`` hyperparameter, for launchers whose host names do not resolve.
    """
    hosts = tuple(sorted(env.hosts))
    use_gpu = env.num_gpus > 0
    port_text = environ.get("MASTER_PORT")
    try:
        port = int(port_text) if port_text else hp.dist_port
    except ValueError:
        raise ConfigError(f"environment variable MASTER_PORT={port_text!r} is not a port number") from None
    return WorldPlan(hosts=hosts, current_host=env.current_host, machine_rank=hosts.index(env.current_host),
                     processes_per_host=env.num_gpus if use_gpu else hp.cpu_processes_per_host, use_gpu=use_gpu,
                     master_addr=environ.get("MASTER_ADDR") or hosts[0], master_port=port,
                     timeout=timedelta(minutes=hp.dist_timeout_minutes), network_interface=env.network_interface)


def communication_environment(plan: WorldPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """Variables NCCL and gloo read: the interface SageMaker names, error handling; user settings win."""
    wanted: dict[str, str] = {"MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.master_port)}
    if plan.network_interface:
        wanted["GLOO_SOCKET_IFNAME"] = plan.network_interface
        if plan.use_gpu:
            wanted["NCCL_SOCKET_IFNAME"] = plan.network_interface
    if plan.use_gpu:
        # Fail a hung collective after the process-group timeout instead of hanging the job forever.
        wanted["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        wanted["NCCL_DEBUG"] = "WARN"
    return {k: v for k, v in wanted.items() if k not in environ or k in ("MASTER_ADDR", "MASTER_PORT")}


@dataclass(frozen=True)
class Schedule:
    global_batch: int
    per_worker_batch: int
    base_lr: float
    max_iter: int
    warmup_iters: int
    steps: tuple[int, ...]
    checkpoint_period: int
    eval_period: int
    scale: float


def scaled_schedule(hp: Hyperparameters, world_size: int) -> Schedule:
    """The batch/LR rule (docs/training.md), the same as detectron2's ``REFERENCE_WORLD_SIZE``.

    ``reference_world_size = 0``: ``ims_per_batch`` is the global batch whatever the world
    size; it is split evenly over the workers and the learning rate stays as given.
    ``reference_world_size = R > 0``: the hyperparameters describe a run on R workers; on W
    workers the global batch and the learning rate are multiplied by W/R (linear scaling)
    and the iteration counts divided by it, so the run sees the same number of images.
    """
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    scale = 1.0 if hp.reference_world_size in (0, world_size) else world_size / hp.reference_world_size
    global_batch = round(hp.ims_per_batch * scale)
    if hp.reference_world_size and hp.ims_per_batch % hp.reference_world_size:
        raise ConfigError(f"hyperparameter ims_per_batch={hp.ims_per_batch} must be divisible by "
                          f"reference_world_size={hp.reference_world_size}")
    if global_batch % world_size:
        raise ConfigError(f"hyperparameter ims_per_batch={hp.ims_per_batch} gives a global batch of {global_batch}, "
                          f"which does not split evenly over {world_size} workers")
    max_iter = max(1, round(hp.max_iter / scale))
    steps = tuple(sorted({max(1, math.floor(max_iter * f)) for f in hp.lr_steps}))
    return Schedule(global_batch=global_batch, per_worker_batch=global_batch // world_size,
                    base_lr=hp.base_lr * scale, max_iter=max_iter,
                    warmup_iters=min(round(hp.warmup_iters / scale), max_iter),
                    steps=steps, checkpoint_period=max(1, round(hp.checkpoint_period / scale)),
                    eval_period=round(hp.eval_period / scale), scale=scale)


def learning_rate_factor(iteration: int, schedule: Schedule, warmup_factor: float = 0.001) -> float:
    """Linear warm-up from ``warmup_factor`` then x0.1 at each step."""
    factor = 0.1 ** sum(1 for s in schedule.steps if iteration >= s)
    if iteration < schedule.warmup_iters:
        alpha = iteration / schedule.warmup_iters
        factor *= warmup_factor * (1 - alpha) + alpha
    return factor
