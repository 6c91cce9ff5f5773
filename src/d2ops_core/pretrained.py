"""Pretrained weights: where the pipeline expects them and how a user puts them there.

One home for the facts the stack parameter ``PretrainedWeightsKey`` (template.yaml), the prepare
step (which checks the key and passes it as the ``pretrained`` channel), the trainer (which
picks the default config), ``d2ops weights upload`` and docs/training.md share. Pure: no boto3.
"""

from __future__ import annotations

# The config the trainer trains when the manifest names none (on a GPU; without one, the CPU profile).
DEFAULT_CONFIGS = {"detection": "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml",
                   "instance_segmentation": "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml"}
# PretrainedWeightsKey's value that opts into training from scratch (no channel, a scratch-capable config).
SCRATCH = "none"
WEIGHTS_PREFIX = "pretrained/"
CHANNEL = "pretrained"
# detectron2's MODEL_ZOO.md / model_zoo.py (checked 2026-11-26 against detectron2 02b5c4e2's
# detectron2/model_zoo/model_zoo.py, _ModelZooUrls): the COCO-trained checkpoint of each default config.
MODEL_ZOO_CHECKPOINTS = {
    "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml":
        "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_FPN_3x/137849458/"
        "model_final_280758.pkl",
    "COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml":
        "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x/137849600/"
        "model_final_f10217.pkl",
}
# An S3 key a CloudFormation parameter can carry and an IAM resource can name exactly: no wildcards
# (IAM would read `*` and `?` as patterns), no leading slash, no empty segments.
KEY_PATTERN = r"^(none|[A-Za-z0-9!_.'()-]+(/[A-Za-z0-9!_.'()-]+)*)$"


def weights_key(config: str) -> str:
    """The documented key of ``config``'s checkpoint: ``pretrained/<config without .yaml>.pkl``."""
    return f"{WEIGHTS_PREFIX}{config.removesuffix('.yaml').removesuffix('.py')}.pkl"


DEFAULT_KEY = weights_key(DEFAULT_CONFIGS["detection"])


def conventional_config(key: str) -> str | None:
    """The default config whose documented key ``key`` is (None: another key, whatever it holds)."""
    return next((c for c in DEFAULT_CONFIGS.values() if weights_key(c) == key), None)


def upload_command(stack: str | None) -> str:
    """The command that puts a checkpoint at the stack's key (offline: no ``--stack``)."""
    return "d2ops weights upload FILE" + (f" --stack {stack}" if stack else "")


def download_hint(key: str) -> str:
    """Where the checkpoint for the key's config comes from, when the key is a documented one."""
    config = conventional_config(key)
    return f" (FILE: {MODEL_ZOO_CHECKPOINTS[config]})" if config in MODEL_ZOO_CHECKPOINTS else ""
