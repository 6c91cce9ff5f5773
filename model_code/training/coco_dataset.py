"""A COCO split as torchvision detection training samples, and the iteration-indexed batch sampler."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset, Sampler

from d2ops_core import images as rule
from d2ops_core.validation.manifest import unsafe_relative_path
from model_code.dataset_version import Categories, DatasetError


def check_file_names(images: list[dict[str, Any]], source: str) -> None:
    """The validator refuses these upstream, but the image reads the channel as it finds it: a file_name
    must not reach outside the images directory (d2ops_core's one rule for dataset-relative paths)."""
    for img in images:
        problem = unsafe_relative_path(str(img.get("file_name", "")))
        if problem:
            raise DatasetError(f"{source}: image {img.get('id')} file_name {str(img.get('file_name'))[:80]!r} "
                               f"{problem}")


def check_image_files(coco: dict[str, Any], images_dir: Path, source: str) -> None:
    """Every image of a split named safely and, where it exists, resolving inside ``images_dir``.

    For loaders that open the files themselves (detectron2's): one stat per image, before training.
    """
    check_file_names(list(coco["images"]), source)
    root = images_dir.resolve()
    for img in coco["images"]:
        path = images_dir / img["file_name"]
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise DatasetError(f"{path}: a symlink to {path.resolve()}, outside the channel's images directory "
                               f"{root} (image id {img.get('id')}); upload the file itself")


def _polygon_mask(polygons: list[list[float]], height: int, width: int) -> np.ndarray:
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for flat in polygons:
        if len(flat) >= 6:
            draw.polygon(list(zip(flat[0::2], flat[1::2], strict=False)), fill=1)
    return np.asarray(canvas, dtype=np.uint8)


def _segmentation_mask(segmentation: Any, height: int, width: int) -> np.ndarray:
    if isinstance(segmentation, list):
        return _polygon_mask(segmentation, height, width)
    from faster_coco_eval.core import mask as mask_utils  # RLE decoding only; polygons need no library

    rle = segmentation
    if isinstance(rle.get("counts"), list):
        rle = mask_utils.frPyObjects(rle, height, width)
    return np.asarray(mask_utils.decode(rle), dtype=np.uint8)


class CocoDetectionSet(Dataset[tuple[torch.Tensor, dict[str, torch.Tensor]]]):  # keyed by (index, position)
    """Image i as a float tensor in [0, 1] and its target (boxes xyxy, labels 1..K, optional masks).

    Labels are 1-based because torchvision reserves 0 for the background; label k+1 is
    ``categories.ids[k]``. Crowd regions and degenerate boxes are left out of training.
    """

    def __init__(self, coco: dict[str, Any], images_dir: Path, categories: Categories, *, with_masks: bool,
                 horizontal_flip: bool, seed: int, source: str) -> None:
        self.images_dir = images_dir
        self.seed = seed
        self.with_masks = with_masks
        self.horizontal_flip = horizontal_flip
        self.images = list(coco["images"])
        check_file_names(self.images, source)
        self.images_root = images_dir.resolve()
        label_of = categories.label_of()
        by_image: dict[int, list[dict[str, Any]]] = {int(img["id"]): [] for img in self.images}
        for ann in coco["annotations"]:
            if ann.get("iscrowd", 0):
                continue
            if int(ann["category_id"]) not in label_of:
                raise DatasetError(f"{source}: annotation {ann.get('id')} has category_id {ann['category_id']}, "
                                   f"not among the train categories {categories.ids}")
            w, h = float(ann["bbox"][2]), float(ann["bbox"][3])
            if w < 1 or h < 1 or int(ann["image_id"]) not in by_image:
                continue
            by_image[int(ann["image_id"])].append(ann)
        self.annotations = [by_image[int(img["id"])] for img in self.images]
        self.label_of = label_of
        if with_masks and not any("segmentation" in a for anns in self.annotations for a in anns):
            raise DatasetError(f"{source}: the task is instance_segmentation but no annotation has a segmentation")

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``key`` = (image index, global sample position); the position decides the flip."""
        index, position = key
        info = self.images[index]
        path = self.images_dir / info["file_name"]
        if not path.resolve().is_relative_to(self.images_root):
            raise DatasetError(f"{path}: a symlink to {path.resolve()}, outside the channel's images directory "
                               f"{self.images_root} (image id {info['id']}); upload the file itself")
        try:
            # The one image rule (d2ops_core.images): upright by EXIF orientation, as the validator measured it
            # against the annotations and as evaluation and the endpoint read it.
            image = rule.load_rgb(path, str(path))
        except (rule.ImageRejected, OSError) as exc:
            raise DatasetError(f"{path}: unreadable image (image id {info['id']}): {exc}") from exc
        width, height = image.size
        anns = self.annotations[index]
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                              for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        target = {"boxes": boxes,
                  "labels": torch.tensor([self.label_of[int(a["category_id"])] + 1 for a in anns], dtype=torch.int64)}
        if self.with_masks:
            masks = [_segmentation_mask(a.get("segmentation", []), height, width) for a in anns]
            target["masks"] = torch.from_numpy(np.stack(masks)) if masks else torch.zeros((0, height, width),
                                                                                          dtype=torch.uint8)
        tensor = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0
        # The flip depends only on the sample position, so a resumed run flips exactly as the original would.
        if self.horizontal_flip and random.Random(self.seed * 1_000_003 + position).random() < 0.5:
            tensor = tensor.flip(-1)
            target["boxes"] = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], dim=1)
            if self.with_masks:
                target["masks"] = target["masks"].flip(-1)
        return tensor, target


class IterationBatchSampler(Sampler[list[tuple[int, int]]]):
    """This worker's share of each global batch, for iterations ``start`` .. ``stop - 1``.

    Sample positions ``it * global_batch ...`` index into a permutation of the dataset drawn
    per epoch from ``seed``; worker r takes the r-th slice. A resumed run therefore sees
    exactly the images the uninterrupted run would have seen from that iteration on.
    """

    def __init__(self, size: int, *, global_batch: int, rank: int, world_size: int, seed: int, start: int,
                 stop: int) -> None:
        if size < 1:
            raise DatasetError("the train split has no images")
        self.size, self.global_batch, self.rank, self.world = size, global_batch, rank, world_size
        self.seed, self.start, self.stop = seed, start, stop
        self._perms: dict[int, list[int]] = {}

    def _position(self, p: int) -> int:
        epoch = p // self.size
        if epoch not in self._perms:
            self._perms = {epoch: torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch))
                           .tolist()}
        return self._perms[epoch][p % self.size]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        per_worker = self.global_batch // self.world
        for it in range(self.start, self.stop):
            first = it * self.global_batch + self.rank * per_worker
            yield [(self._position(p), p) for p in range(first, first + per_worker)]

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


def collate(batch: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> tuple[list[torch.Tensor],
                                                                                list[dict[str, torch.Tensor]]]:
    return [b[0] for b in batch], [b[1] for b in batch]
