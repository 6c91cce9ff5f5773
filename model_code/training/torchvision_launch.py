"""Start the torchvision trainer's workers on this host: inline for one, spawned for several."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from types import FrameType

from d2ops_core.cpu_profile import TORCHVISION_CPU_PROFILE, unset_profile_values
from model_code.dataset_version import open_dataset_version
from model_code.training.config import DATASET_CHANNEL, Hyperparameters, TrainingEnvironment
from model_code.training.distributed import communication_environment, plan_world, scaled_schedule
from model_code.training.torchvision_trainer import (
    Interrupted,
    RunContext,
    StopFlag,
    TrainingError,
    categories_for,
    resolve_model,
    train_worker,
)

_QUALIFIER = re.compile(r"^[\w.]+\.(?=\w+:)")  # "model_code.x.TrainingError: ..." -> "TrainingError: ..."


def with_cpu_profile(hp: Hyperparameters, *, use_gpu: bool) -> tuple[Hyperparameters, str | None]:
    """Without a GPU and without a chosen ``model``, the CPU profile fills what the job left unset.

    The cloud defaults (R-50 FPN, 800 px, 16 images per batch) would take hours and over 10 GB on a
    CPU; the user's own hyperparameters still win. Returns the notice to print first, if any.
    """
    if use_gpu or "model" in hp.model_fields_set:
        return hp, None
    filled = unset_profile_values(TORCHVISION_CPU_PROFILE, hp.model_fields_set)
    explicit = hp.model_dump(include=hp.model_fields_set)
    profiled = Hyperparameters.model_validate(explicit | filled)
    return profiled, (f"no GPU and no `model` hyperparameter: training the CPU profile ({profiled.model}, "
                      f"{profiled.min_size} px, batch {profiled.ims_per_batch}, {profiled.max_iter} iterations); "
                      "set `model` to train the cloud configuration")


def build_context(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> RunContext:
    # Both splits come from the one dataset channel (opened once: a derived val split is derived once).
    train = val = open_dataset_version(env.channel(DATASET_CHANNEL))
    hp, notice = with_cpu_profile(hp, use_gpu=env.num_gpus > 0)
    if notice:
        print(notice, flush=True)
    plan = plan_world(env, hp, environ)
    threads = max(1, env.num_cpus // plan.processes_per_host)
    return RunContext(env=env, hp=hp, plan=plan, schedule=scaled_schedule(hp, plan.world_size), dataset=train,
                      val_dataset=val, categories=categories_for(train, val),
                      model_name=resolve_model(hp.model, train.task), threads=threads)


def run(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> None:
    ctx = build_context(env, hp, environ)
    os.environ.update(communication_environment(ctx.plan, environ))
    for directory in (env.checkpoint_dir, env.model_dir, env.output_data_dir):
        directory.mkdir(parents=True, exist_ok=True)
    if ctx.plan.processes_per_host == 1:
        StopFlag.install()
        train_worker(0, ctx)
        return
    _spawn(ctx)


def _spawn(ctx: RunContext) -> None:
    import torch.multiprocessing as mp

    procs = mp.start_processes(train_worker, args=(ctx,), nprocs=ctx.plan.processes_per_host, join=False,
                               start_method="spawn")

    def forward(signum: int, frame: FrameType | None) -> None:
        for p in procs.processes:
            if p.pid and p.is_alive():
                os.kill(p.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    try:
        while not procs.join():
            pass
    except mp.ProcessRaisedException as exc:
        # The child's traceback ends with "ExceptionType: message"; keep that line as the reason.
        last = [line for line in str(exc).splitlines() if line.strip()][-1]
        if "Interrupted" in last:
            raise Interrupted(last.split(":", 1)[-1].strip()) from None
        raise TrainingError(f"worker process failed: {_QUALIFIER.sub('', last)}") from None
    except mp.ProcessExitedException as exc:
        print(str(exc), file=sys.stderr)
        raise TrainingError(f"worker process exited unexpectedly: {exc}") from None
