"""The torchvision CPU profile: what a job trains when there is no GPU and the user did not choose.

One home for the calibrated CPU configuration (the tests, ``make demo``, ``d2ops train-local`` on
a laptop, the benchmarks): Faster R-CNN resnet18-FPN at the data's small resolution, a 4-image
batch, reduced proposal and RoI counts. The learning rate sits at a fraction of the largest one
that still converges on the calibration data; the measurements are in docs/training.md
("Calibration"), and ``make bench-calibrate`` repeats them. Values are strings, as SageMaker
passes hyperparameters. Standard library only: the d2ops core, which the training image and the
offline tooling share.
"""

from __future__ import annotations

from collections.abc import Mapping

# `d2ops synth` arguments of the calibration data (120 train / 40 val images of 1-3 shapes).
CALIBRATION_DATA = {"images": 160, "size": 128, "seed": 1}
CPU_MODEL = "fasterrcnn_resnet18_fpn"


def torchvision_cpu_profile(image_size: int = 128) -> dict[str, str]:
    """Hyperparameters of the CPU profile for images of about ``image_size`` pixels."""
    return {"model": CPU_MODEL, "min_size": str(image_size), "max_size": str(image_size),
            "ims_per_batch": "4", "base_lr": "0.005", "warmup_iters": "50", "max_iter": "150",
            "clip_grad_norm": "10", "rpn_pre_nms_train": "600", "rpn_post_nms_train": "300",
            "rpn_pre_nms_test": "300", "rpn_post_nms_test": "100", "roi_batch_size_per_image": "128",
            "num_workers": "0", "log_period": "10"}


TORCHVISION_CPU_PROFILE = torchvision_cpu_profile(CALIBRATION_DATA["size"])


def torchvision_job_defaults(image_size: int) -> dict[str, str]:
    """The profile less the choices that belong to a run (model, iterations): offline job defaults."""
    return {k: v for k, v in torchvision_cpu_profile(image_size).items() if k not in ("model", "max_iter")}


def unset_profile_values(profile: Mapping[str, str], explicitly_set: set[str]) -> dict[str, str]:
    """The profile's values for the hyperparameters the job did not set itself (the user's always win)."""
    return {name: value for name, value in profile.items() if name not in explicitly_set}
