"""``make bench-train``: CPU training throughput, detectron2 against torchvision on the same data.

Both trainers run through the real local job runner and the training image's entry point on
the same synthetic shapes dataset (128 px) with the same global batch (4 images), each in its
own CPU profile: torchvision's calibrated Faster R-CNN resnet18-FPN (d2ops_core.cpu_profile; the
**baseline**) and detectron2's ``rcnn_R_18_FPN_cpu.yaml`` (what the detectron2 trainer picks
without a GPU). Throughput has one definition for both: images per second between the first
and the last ``train:iter_seconds`` metric line as they arrive from the job, so start-up, the
first ``log_period`` iterations (warm-up, first allocations), export and evaluation are left
out. ``--processes 2`` runs every job as two hosts meeting over gloo. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from d2ops import synth
from d2ops.local.job_log import split_host_line
from d2ops.local.jobs import TrainingJobSpec, run_training_job
from d2ops_core import metrics
from d2ops_core.cpu_profile import torchvision_cpu_profile

GLOBAL_BATCH = 4
IMAGE_SIZE = 128
LOG_PERIOD = 5
BASELINE = "torchvision"
# Only what the benchmark must pin: the batch, the logging cadence, no mid-run checkpoints, no report.
COMMON = {"ims_per_batch": str(GLOBAL_BATCH), "log_period": str(LOG_PERIOD), "num_workers": "0",
          "checkpoint_period": "100000", "report_images": "0"}
HYPERPARAMETERS: dict[str, dict[str, str]] = {
    "torchvision": {**{k: v for k, v in torchvision_cpu_profile(IMAGE_SIZE).items() if k != "max_iter"}, **COMMON,
                    "framework": "torchvision"},
    "detectron2": {**COMMON, "framework": "detectron2"},
}


class BenchError(SystemExit):
    pass


def measure(framework: str, dataset: Path, work: Path, iterations: int, processes: int) -> dict[str, Any]:
    arrivals: list[tuple[float, int]] = []  # (when the line arrived, iteration)

    def log(line: str) -> None:
        parsed = metrics.parse_metric_line(split_host_line(line)[1])
        if parsed and parsed[0] == "train:iter_seconds" and parsed[2] is not None:
            arrivals.append((time.perf_counter(), parsed[2]))
        print(line, flush=True)

    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    result = run_training_job(TrainingJobSpec(
        job_name=f"bench-{framework}-{processes}", channels={"dataset": dataset},
        work_dir=work / "hosts", output_dir=work / "out",
        hyperparameters=HYPERPARAMETERS[framework] | {"max_iter": str(iterations)}, instance_count=processes), log=log)
    if result.status != "Completed":
        raise BenchError(f"bench run of {framework} ({processes} process(es)) failed: {result.failure_reason}")
    if len(arrivals) < 2:
        raise BenchError(f"{framework}: fewer than two train:iter_seconds lines; raise --iterations "
                         f"(now {iterations}) to at least {3 * LOG_PERIOD}")
    (t0, first), (t1, last) = arrivals[0], arrivals[-1]
    seconds = t1 - t0
    return {"framework": framework, "processes": processes, "iterations_timed": last - first,
            "timed_seconds": round(seconds, 2), "images_per_second": round(GLOBAL_BATCH * (last - first) / seconds, 3),
            "job_seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", default="build/bench-train")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--processes", type=int, default=1, help="hosts per job (gloo over loopback when 2+)")
    parser.add_argument("--frameworks", default="torchvision,detectron2",
                        help="comma-separated, baseline first (default torchvision,detectron2)")
    args = parser.parse_args(argv)
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(frameworks) - set(HYPERPARAMETERS))
    if unknown or not frameworks:
        parser.error(f"--frameworks: unknown {unknown}; expected some of {sorted(HYPERPARAMETERS)}")
    if args.iterations < 3 * LOG_PERIOD:
        parser.error(f"--iterations must be at least {3 * LOG_PERIOD} (metric lines come every {LOG_PERIOD})")
    work = Path(args.workdir)
    dataset = work / "dataset"
    if not (dataset / "manifest.json").is_file():
        synth.generate(dataset, images=64, size=IMAGE_SIZE, seed=0)
    rows = [measure(f, dataset, work / f, args.iterations, args.processes) for f in frameworks]
    baseline = next((r for r in rows if r["framework"] == BASELINE), rows[0])
    print(f"\n{'framework':<12} {'images/s':>9} {'timed':>16} {'ratio':>6}   (same data, batch {GLOBAL_BATCH}, "
          f"{IMAGE_SIZE} px, {args.processes} process(es); ratio against {baseline['framework']})")
    for row in rows:
        row["ratio_to_baseline"] = round(row["images_per_second"] / baseline["images_per_second"], 3)
        print(f"{row['framework']:<12} {row['images_per_second']:>9.2f} "
              f"{row['iterations_timed']:>4} it {row['timed_seconds']:>7.1f} s {row['ratio_to_baseline']:>6.2f}")
    print(json.dumps({"bench": "train", "cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
                      "global_batch": GLOBAL_BATCH, "image_size": IMAGE_SIZE, "processes": args.processes,
                      "baseline": baseline["framework"], "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
