"""``make bench-calibrate``: how far the CPU training profile is from diverging, and whether seeds agree.

Two measurements through the real local job runner and entry point, on the calibrated test data
(``d2ops synth --images 160 --size 128 --seed 1``) with the torchvision CPU profile:

1. **Learning-rate margin.** Short probe runs (``--iterations``, warm-up ``--warmup``) at a
   ladder of learning rates. A probe *diverges* when the trainer stops with its TrainingError
   (non-finite loss or gradient) or its loss ends above where it started. The largest rate that
   still converges, divided by the profile's rate (the named baseline), is the margin.
2. **Seeds.** Full calibrated runs (the integration test's schedule) at the profile's rate for
   several seeds: bbox AP50 of each through the exported artifact.

Ends with one JSON line. Numbers and the machine they came from: docs/training.md, "Calibration".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from d2ops import synth
from d2ops.local.jobs import TrainingJobSpec, run_training_job
from d2ops_core.cpu_profile import CALIBRATION_DATA, TORCHVISION_CPU_PROFILE

_LOSS = re.compile(r"d2ops-metric train:loss=([\d.eE+-]+) iter=(\d+)")


def _run(dataset: Path, work: Path, hyperparameters: dict[str, str]) -> dict[str, Any]:
    losses: list[float] = []

    def log(line: str) -> None:
        if match := _LOSS.search(line):
            losses.append(float(match[1]))
        if "iter " in line or "failed" in line:
            print(line, flush=True)

    shutil.rmtree(work, ignore_errors=True)
    result = run_training_job(TrainingJobSpec(
        job_name=work.name, channels={"dataset": dataset}, work_dir=work / "hosts",
        output_dir=work / "out", hyperparameters=hyperparameters), log=log)
    return {"status": result.status, "failure_reason": result.failure_reason, "losses": losses,
            "bbox_AP50": result.metrics.get("val:bbox_AP50"), "bbox_AP": result.metrics.get("val:bbox_AP")}


def probe(dataset: Path, work: Path, lr: float, iterations: int, warmup: int) -> dict[str, Any]:
    hps = TORCHVISION_CPU_PROFILE | {"base_lr": repr(lr), "max_iter": str(iterations), "warmup_iters": str(warmup),
                                     "lr_steps": "0.99", "log_period": "5", "checkpoint_period": "100000",
                                     "report_images": "0"}
    run = _run(dataset, work / f"lr-{lr:g}", hps)
    losses = run["losses"]
    converged = run["status"] == "Completed" and len(losses) >= 2 and losses[-1] < losses[0]
    return {"lr": lr, "converged": converged, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "failure_reason": run["failure_reason"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", default="build/bench-calibrate")
    parser.add_argument("--lrs", default="0.02,0.04,0.08,0.16,0.32", help="comma-separated probe learning rates")
    parser.add_argument("--iterations", type=int, default=60, help="iterations per probe")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up iterations per probe")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for full runs ('' to skip)")
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    dataset = work / "dataset"
    if not (dataset / "manifest.json").is_file():
        synth.generate(dataset, **CALIBRATION_DATA)
    profile_lr = float(TORCHVISION_CPU_PROFILE["base_lr"])

    probes = [probe(dataset, work, float(lr), args.iterations, args.warmup) for lr in args.lrs.split(",") if lr]
    for p in probes:
        print(f"lr {p['lr']:<6g} {'converged' if p['converged'] else 'DIVERGED '} loss {p['first_loss']} -> "
              f"{p['last_loss']} {p['failure_reason'] or ''}")
    stable = [p["lr"] for p in probes if p["converged"]]
    # the largest rate below which every probe converged: one lucky rate above a failure does not count
    largest = None
    for p in sorted(probes, key=lambda p: p["lr"]):
        if not p["converged"]:
            break
        largest = p["lr"]
    margin = largest / profile_lr if largest else None
    if probes:
        print(f"largest converging lr {largest} (probes: {stable}); profile lr {profile_lr:g}; "
              f"margin x{margin:.1f}" if margin else f"no probe converged; profile lr {profile_lr:g}")

    seeds = []
    for seed in (int(s) for s in args.seeds.split(",") if s):
        run = _run(dataset, work / f"seed-{seed}", TORCHVISION_CPU_PROFILE | {"seed": str(seed)})
        seeds.append({"seed": seed, "status": run["status"], "bbox_AP50": run["bbox_AP50"], "bbox_AP": run["bbox_AP"],
                      "failure_reason": run["failure_reason"]})
        print(f"seed {seed}: {run['status']} bbox AP50 {run['bbox_AP50']} AP {run['bbox_AP']}")

    import torch

    print(json.dumps({"bench": "calibrate", "cpus": os.cpu_count(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "baseline": "profile base_lr", "profile_lr": profile_lr, "largest_converging_lr": largest,
                      "margin": round(margin, 2) if margin else None, "probe_iterations": args.iterations,
                      "probes": probes, "seeds": seeds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
