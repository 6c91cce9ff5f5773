"""Which trainer an offline run trains: detectron2 (the production trainer) wherever it imports.

``make demo`` asks for ``auto``: detectron2 when this interpreter (the one local training jobs
run) imports it with its compiled ops, otherwise torchvision, saying why in one line. Each
framework brings its own CPU defaults: torchvision's calibrated profile
(:mod:`d2ops_core.cpu_profile`); for detectron2 only the loader and log settings, because without a
GPU and without a ``model`` hyperparameter the detectron2 trainer picks its own CPU profile
(``model_code/training/configs/rcnn_R_18_FPN_cpu.yaml``) with that profile's schedule.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from d2ops_core import pretrained
from d2ops_core.cpu_profile import torchvision_cpu_profile, torchvision_job_defaults

FRAMEWORKS = ("auto", "detectron2", "torchvision")
HOW_TO_INSTALL = "`make setup` installs it from ../shared/wheels (see README)"
# What a training job needs of detectron2: the package, its compiled C++ ops and the trainer.
IMPORT_CHECK = "import detectron2._C, detectron2.engine"


class TrainerUnavailable(Exception):
    """The framework asked for explicitly cannot run here; the message says why and how to fix it."""


@dataclass(frozen=True)
class TrainerChoice:
    framework: str  # "detectron2" or "torchvision"
    reason: str  # one line for the user
    training_defaults: dict[str, str] = field(default_factory=dict)  # job hyperparameter defaults offline
    # The manifest's `training` keys besides max_iter and seed.
    manifest_training: dict[str, object] = field(default_factory=dict)
    # The demo's iterations: enough for the CPU profile to clear the stack's MinMap (0.30) with margin.
    demo_iterations: int = 150
    # Stack parameters of the demo's offline stack (over the template's defaults).
    stack_parameters: dict[str, str] = field(default_factory=dict)


def detectron2_problem(python: str = sys.executable, timeout: float = 180.0) -> str | None:
    """None when ``python`` imports detectron2 and its compiled ops; otherwise why not, in one line."""
    try:
        done = subprocess.run([python, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"`{IMPORT_CHECK}` did not finish within {timeout:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"`{IMPORT_CHECK}` exited with status {done.returncode}"


def detectron2_choice(reason: str) -> TrainerChoice:
    # 250 iterations: bbox AP 0.79-0.82 for seeds 0-2 with the CPU profile, 200 gave 0.64-0.75 (docs/training.md);
    # with the earlier profile, 150 measured 0.35 in the demo, too near MinMap 0.30.
    # PretrainedWeightsKey=none: the demo trains the CPU profile (rcnn_R_18_FPN_cpu.yaml), built to learn from
    # scratch (trainable BN, nothing frozen), for which no model-zoo checkpoint exists; the default key would
    # stop every demo run in the prepare step until a file is uploaded (the offline tests exercise that path).
    return TrainerChoice("detectron2", reason, training_defaults={"num_workers": "0", "log_period": "10"},
                         demo_iterations=250, stack_parameters={"PretrainedWeightsKey": pretrained.SCRATCH})


def torchvision_choice(reason: str, image_size: int) -> TrainerChoice:
    profile = torchvision_cpu_profile(image_size)
    return TrainerChoice(
        "torchvision", reason,
        training_defaults=torchvision_job_defaults(image_size),
        manifest_training={"model": profile["model"], "ims_per_batch": int(profile["ims_per_batch"]),
                           "base_lr": float(profile["base_lr"])},
        demo_iterations=int(profile["max_iter"]))


def choose_trainer(requested: str, image_size: int, *,
                   check: Callable[[], str | None] = detectron2_problem) -> TrainerChoice:
    """``requested`` is one of FRAMEWORKS; ``check`` says why detectron2 cannot run here (None: it can)."""
    if requested not in FRAMEWORKS:
        raise ValueError(f"unknown framework {requested!r}; expected one of {', '.join(FRAMEWORKS)}")
    if requested == "torchvision":
        return torchvision_choice("asked for with --framework torchvision", image_size)
    why_not = check()
    if why_not is None:
        how = "asked for with --framework detectron2" if requested == "detectron2" else "the production trainer"
        return detectron2_choice(f"{how}; detectron2 imports here")
    if requested == "detectron2":
        raise TrainerUnavailable(f"--framework detectron2: detectron2 cannot be imported here ({why_not}); "
                                 f"{HOW_TO_INSTALL}")
    return torchvision_choice(f"detectron2 cannot be imported here ({why_not}), so the torchvision trainer "
                              f"runs instead; {HOW_TO_INSTALL}", image_size)
