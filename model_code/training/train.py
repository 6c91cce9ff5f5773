"""The training job's entry point (``train`` in the image runs ``python -m model_code.training.train``).

Exit codes: 0 finished; 1 failed, with a one-line reason in ``<output>/failure`` (SageMaker
shows it as the job's FailureReason); 143 stopped by SIGTERM after writing a checkpoint.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from pathlib import Path

from model_code.training.config import (
    ConfigError,
    Hyperparameters,
    TrainingEnvironment,
    failure_file,
    load_environment,
    parse_hyperparameters,
)

EXIT_FAILED = 1
EXIT_STOPPED = 143  # 128 + SIGTERM, what a process killed by the signal would report
MAX_REASON = 1000  # SageMaker truncates FailureReason at 1024 characters


def write_failure(path: Path, reason: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    one_line = " ".join(reason.split())[:MAX_REASON]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(one_line + "\n")
    os.replace(tmp, path)


def check_writable(env: TrainingEnvironment) -> None:
    """Fail in the first second, not after hours of training, when an output directory cannot be written."""
    for what, directory in (("model", env.model_dir), ("output data", env.output_data_dir),
                            ("checkpoint", env.checkpoint_dir)):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".d2ops-write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"{what} directory {directory} is not writable: "
                              f"{exc.strerror or type(exc).__name__}") from None


def discard_partial_artifact(model_dir: Path) -> None:
    """A failed job's model directory must hold no artifact: an export whose evaluation then failed would
    otherwise leave model.pt with a metrics-less metadata.json that serving accepts (if anything uploads it)."""
    from model_code.artifact import CUDA_MODEL_FILE, EVALUATION_FILE, METADATA_FILE, MODEL_FILE

    for name in (MODEL_FILE, CUDA_MODEL_FILE, METADATA_FILE, EVALUATION_FILE):
        for path in (model_dir / name, model_dir / f"{name}.tmp"):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # the failure reason is already written; say it and go on
                print(f"could not remove {path}: {exc}", file=sys.stderr, flush=True)


def run(env: TrainingEnvironment, hp: Hyperparameters) -> None:
    if hp.framework == "detectron2":
        from model_code.training import detectron2_trainer

        detectron2_trainer.run(env, hp, dict(os.environ))
    else:
        from model_code.training import torchvision_launch

        torchvision_launch.run(env, hp, dict(os.environ))


def check_pixel_limit() -> None:
    """The job's MAX_IMAGE_PIXELS (CreateTrainingJob's Environment, from MaxImagePixels) is one the image rule
    takes: a bad value is a ConfigError at the start, not an error in a data-loader worker hours later."""
    from d2ops_core import images

    try:
        images.max_pixels()
    except images.PixelLimitError as exc:
        raise ConfigError(str(exc)) from None


def main() -> int:
    # torch marks TorchScript deprecated; the artifact contract is TorchScript on purpose (docs/model-artifact.md).
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
    failure = failure_file()
    failure.unlink(missing_ok=True)  # a restarted job must not inherit the previous attempt's reason
    from model_code.dataset_version import DatasetError
    from model_code.training.checkpoints import CheckpointError
    from model_code.training.torchvision_trainer import Interrupted, TrainingError

    model_dir: Path | None = None  # set once training may have written into it
    try:
        env = load_environment()
        check_pixel_limit()
        hp = parse_hyperparameters(env.hyperparameters)
        check_writable(env)
        model_dir = env.model_dir
        run(env, hp)
    except Interrupted as exc:
        print(str(exc), flush=True)
        return EXIT_STOPPED
    except (ConfigError, CheckpointError, TrainingError, DatasetError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # anything else is still a failed job, never a silent exit 0
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}"
    else:
        print("training job finished", flush=True)
        return 0
    print(f"training failed: {reason}", file=sys.stderr, flush=True)
    write_failure(failure, reason)
    if model_dir is not None:
        discard_partial_artifact(model_dir)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
