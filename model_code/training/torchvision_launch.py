"""Start the torchvision trainer's workers on this host: inline for one, spawned for several."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from types import FrameType

from model_code.dataset_version import open_dataset_version
from model_code.training.config import Hyperparameters, TrainingEnvironment
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


def build_context(env: TrainingEnvironment, hp: Hyperparameters, environ: Mapping[str, str]) -> RunContext:
    train = open_dataset_version(env.channel("train"))
    val = open_dataset_version(env.channel("val"))
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
