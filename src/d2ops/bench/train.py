"""``make bench-train``: CPU training throughput of the torchvision trainer, one process vs two.

Both runs use the same global batch (4 images) on the same synthetic shapes dataset, through
the real local job runner and entry point: one host of one process (the baseline, with all
cores), then two hosts of one process each meeting over loopback with gloo (each with half
the cores). Throughput counts training iterations only (the log's "training done" line),
not start-up or the final export and evaluation. Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from d2ops import synth
from d2ops.local_jobs import TrainingJobSpec, run_training_job

GLOBAL_BATCH = 4
HYPERPARAMETERS = {"model": "fasterrcnn_resnet18_fpn", "ims_per_batch": str(GLOBAL_BATCH), "min_size": "96",
                   "max_size": "96", "rpn_pre_nms_train": "600", "rpn_post_nms_train": "300",
                   "rpn_pre_nms_test": "300", "rpn_post_nms_test": "100", "roi_batch_size_per_image": "128",
                   "num_workers": "0", "warmup_iters": "5", "checkpoint_period": "100000", "log_period": "10",
                   "report_images": "0"}
_DONE = re.compile(r"training done: (\d+) iterations in ([\d.]+) s")


def measure(dataset: Path, work: Path, hosts: int, iterations: int) -> dict[str, Any]:
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    result = run_training_job(TrainingJobSpec(
        job_name=f"bench-{hosts}", channels={"train": dataset, "val": dataset}, work_dir=work / "hosts",
        output_dir=work / "out", hyperparameters=HYPERPARAMETERS | {"max_iter": str(iterations)},
        instance_count=hosts), log=log)
    if result.status != "Completed":
        raise SystemExit(f"bench run with {hosts} process(es) failed: {result.failure_reason}")
    done = next(m for m in map(_DONE.search, lines) if m)
    seconds = float(done[2])
    return {"processes": hosts, "iterations": int(done[1]), "train_seconds": round(seconds, 2),
            "images_per_second": round(GLOBAL_BATCH * int(done[1]) / seconds, 3),
            "job_seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", default="build/bench-train")
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    dataset = work / "dataset"
    if not (dataset / "manifest.json").is_file():
        synth.generate(dataset, images=64, size=96, seed=0)
    one = measure(dataset, work / "one", 1, args.iterations)
    two = measure(dataset, work / "two", 2, args.iterations)
    ratio = two["images_per_second"] / one["images_per_second"]
    print(f"one process:   {one['images_per_second']:.2f} images/s ({one['iterations']} iterations, "
          f"{one['train_seconds']:.1f} s)")
    print(f"two processes: {two['images_per_second']:.2f} images/s ({two['iterations']} iterations, "
          f"{two['train_seconds']:.1f} s), gloo over loopback")
    print(f"scaling ratio (two / one): {ratio:.2f}  (1.0 = no gain; the ideal on 2 cores is 1.0-2.0)")
    print(json.dumps({"bench": "train", "cpus": os.cpu_count(), "global_batch": GLOBAL_BATCH,
                      "image_size": 96, "model": HYPERPARAMETERS["model"], "baseline": "one process",
                      "one_process_images_per_second": one["images_per_second"],
                      "two_processes_images_per_second": two["images_per_second"], "ratio": round(ratio, 3),
                      "one": one, "two": two}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
