"""``d2ops train-local DATASET_DIR OUTPUT_DIR``: the training job as local processes, SageMaker-style."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from d2ops.commands.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-local", help="run the training job locally (one process per host), like SageMaker would",
        description="Lays out /opt/ml-shaped trees under OUTPUT_DIR/hosts/, runs the training entry point once "
                    "per host and leaves model.tar.gz and output.tar.gz in OUTPUT_DIR. Running it again with the "
                    "same OUTPUT_DIR resumes from the checkpoints there. The last line is a JSON summary.")
    p.add_argument("dataset_dir", metavar="DATASET_DIR", help="dataset version (manifest.json, annotations/, images/)")
    p.add_argument("output_dir", metavar="OUTPUT_DIR")
    p.add_argument("--hosts", type=int, default=1, help="number of hosts (processes), default 1")
    p.add_argument("--hyperparameters", default="{}", metavar="JSON",
                   help='JSON object of hyperparameters, e.g. \'{"max_iter": 150, "min_size": 128}\'')
    p.add_argument("--job-name", default=None, help="training job name (default: derived from OUTPUT_DIR)")
    p.add_argument("--max-runtime", type=float, default=None, metavar="SECONDS")
    p.set_defaults(func=run)


def parse_hyperparameters_option(text: str) -> dict[str, str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--hyperparameters is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--hyperparameters must be a JSON object, got {type(value).__name__}")
    # SageMaker passes every hyperparameter as a string; so do we.
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def run(args: argparse.Namespace) -> int:
    from d2ops.local.jobs import LocalJobError, TrainingJobSpec, run_training_job

    dataset, output = Path(args.dataset_dir), Path(args.output_dir)
    if not (dataset / "manifest.json").is_file():
        raise UsageError(f"{dataset}: not a dataset version (no manifest.json)")
    if args.hosts < 1:
        raise UsageError(f"--hosts must be at least 1, got {args.hosts}")
    hyperparameters = parse_hyperparameters_option(args.hyperparameters)
    name = args.job_name or re.sub(r"[^A-Za-z0-9-]", "-", output.resolve().name)[:63] or "local-training"
    spec = TrainingJobSpec(job_name=name, channels={"dataset": dataset}, work_dir=output / "hosts",
                           output_dir=output, hyperparameters=hyperparameters, instance_count=args.hosts,
                           max_runtime_seconds=args.max_runtime)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()  # like StopTrainingJob: SIGTERM reaches every host, which checkpoints and exits

    signal.signal(signal.SIGTERM, request_stop)
    try:
        result = run_training_job(spec, stop=stop, log=lambda line: print(line, file=sys.stderr, flush=True))
    except LocalJobError as exc:
        raise UsageError(str(exc)) from None
    summary = result.summary()
    summary.pop("final_metrics")
    for key, value in result.metrics.items():
        if key.startswith("val:"):
            summary[key[len("val:"):]] = value
    summary.setdefault("bbox_AP", None)
    summary.setdefault("bbox_AP50", None)
    print(json.dumps(summary))
    return 0 if result.status == "Completed" else 1
