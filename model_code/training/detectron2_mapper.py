"""detectron2's training and in-training evaluation data, with every image read by the one image rule.

detectron2's stock ``DatasetMapper`` reads a file with ``detection_utils.read_image``: plain
Pillow, any format it has a plugin for, Pillow's own pixel limit. That is a second image rule
beside :mod:`d2ops_core.images`, the one validation, the torchvision trainer, evaluation and
serving share: a GIF or a 60-megapixel JPEG the validator refused could still be trained on,
and nothing guaranteed training saw the pixels the endpoint later sees. :class:`RuleDatasetMapper`
is detectron2's mapper with only the reading replaced: :func:`read_image` decodes through
``d2ops_core.images.load_rgb`` (format by content, the operator's pixel limit, full decode, EXIF
orientation) and hands detectron2 the array in the channel order its config asks for
(``INPUT.FORMAT``). Augmentation, annotation transforms and everything else stay detectron2's.

Imports detectron2 at module level: only the training worker imports this module.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from detectron2.data import DatasetMapper
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T

from d2ops_core import images as rule
from model_code.dataset_version import DatasetError
from model_code.training.config import ConfigError

# INPUT.FORMAT values the rule's RGB pixels can be handed over in (detectron2's default is BGR,
# the channel order of its Caffe2-era pretrained weights). Others (L, YUV-BT.601) would need a
# colour conversion the exported model does not do at serving time, so they are refused.
FORMATS = ("BGR", "RGB")


def check_format(image_format: str) -> None:
    if image_format not in FORMATS:
        raise ConfigError(f"INPUT.FORMAT={image_format!r}: the trainer reads images as {' or '.join(FORMATS)} "
                          "(the one image rule decodes RGB; the endpoint feeds the model the same)")


def read_image(file_name: str, image_format: str, image_id: Any = None) -> np.ndarray:
    """``file_name`` decoded by the one image rule: an HxWx3 uint8 array, upright, in ``image_format``'s order.

    A file the rule refuses (not JPEG/PNG by content, over the pixel limit, damaged) or cannot open raises
    DatasetError naming the file, never a Pillow error from deep inside a worker.
    """
    check_format(image_format)
    try:
        image = rule.load_rgb(file_name, file_name)
    except (rule.ImageRejected, OSError) as exc:
        raise DatasetError(f"{file_name}: unreadable image (image id {image_id}): {exc}") from exc
    with image:
        pixels = np.asarray(image, dtype=np.uint8)
    return np.ascontiguousarray(pixels[:, :, ::-1]) if image_format == "BGR" else pixels


class RuleDatasetMapper(DatasetMapper):
    """detectron2's ``DatasetMapper`` (same constructor and ``from_config``), reading images by the rule."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_format(self.image_format)

    def __call__(self, dataset_dict: dict[str, Any]) -> dict[str, Any]:
        record = copy.deepcopy(dataset_dict)
        if "sem_seg_file_name" in record:  # detection and instance segmentation only: never dropped silently
            raise DatasetError(f"{record['file_name']}: semantic segmentation files are not supported")
        image = read_image(record["file_name"], self.image_format, record.get("image_id"))
        # the annotations' width/height against the upright image, as the validator compared them
        utils.check_image_size(record, image)
        augmented = T.AugInput(image)
        transforms = self.augmentations(augmented)
        image = augmented.image
        shape = image.shape[:2]
        record["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
        if self.proposal_topk is not None:
            utils.transform_proposals(record, shape, transforms, proposal_topk=self.proposal_topk)
        if not self.is_train:
            record.pop("annotations", None)
            return record
        if "annotations" in record:
            self._transform_annotations(record, transforms, shape)
        return record
