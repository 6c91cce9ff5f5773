"""Formats agree everywhere (issue 10): the endpoint, the trainer's data loader and evaluation read the
same bytes into the same upright pixels through d2ops_core.images, and refuse the same files.

A camera photo (an MPO JPEG whose EXIF says "rotate 90 degrees") is the case that used to split:
the validator measured it upright, training and evaluation read it sideways, the endpoint refused it.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from model_code.dataset_version import Categories, DatasetError
from model_code.evaluation.coco import iterate_images
from model_code.inference import image_to_tensor
from model_code.serving import decode
from model_code.serving.errors import RequestError
from model_code.training.coco_dataset import CocoDetectionSet
from tests.fixtures.serving.support import encode, shapes_image


def camera_photo() -> bytes:
    """An MPO (JPEG + preview) of 48x30 stored pixels, EXIF orientation 6: upright it is 30x48."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    shapes_image(48, 30, seed=11).save(buf, "MPO", save_all=True, append_images=[shapes_image(12, 8)], exif=exif,
                                       quality=95)
    return buf.getvalue()


def readers(tmp_path: Path, name: str, data: bytes) -> dict[str, object]:
    """What each part makes of one image file: a uint8 [3, H, W] tensor, or the exception it raised."""
    (tmp_path / name).write_bytes(data)
    coco = {"images": [{"id": 1, "file_name": name, "width": 30, "height": 48}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 3, 10, 12], "iscrowd": 0}],
            "categories": [{"id": 1, "name": "thing"}]}
    out: dict[str, object] = {}
    try:
        out["serving"] = decode.decode_request(data, "image/jpeg").image
    except RequestError as exc:
        out["serving"] = exc
    try:
        dataset = CocoDetectionSet(coco, tmp_path, Categories(ids=[1], names=["thing"]), with_masks=False,
                                   horizontal_flip=False, seed=0, source="train.json")
        out["training"] = (dataset[(0, 0)][0] * 255).round().to(torch.uint8)
    except DatasetError as exc:
        out["training"] = exc
    try:
        out["evaluation"] = image_to_tensor(next(iterate_images(coco, tmp_path))[1])
    except DatasetError as exc:
        out["evaluation"] = exc
    return out


def test_a_camera_photo_reads_upright_and_identical_in_serving_training_and_evaluation(tmp_path):
    got = readers(tmp_path, "photo.jpg", camera_photo())
    assert all(isinstance(t, torch.Tensor) for t in got.values()), got
    assert tuple(got["serving"].shape) == (3, 48, 30)  # type: ignore[union-attr]
    assert torch.equal(got["serving"], got["training"]) and torch.equal(got["serving"], got["evaluation"])


@pytest.mark.parametrize(("fmt", "name"), [("GIF", "a.png"), ("TIFF", "b.jpg"), ("WEBP", "c.jpg"), ("BMP", "d.png")])
def test_other_formats_are_refused_by_every_part_whatever_their_name(tmp_path, fmt, name):
    got = readers(tmp_path, name, encode(shapes_image(30, 48), fmt))
    assert isinstance(got["serving"], RequestError) and got["serving"].status == 415
    assert isinstance(got["training"], DatasetError) and "not a JPEG or PNG" in str(got["training"])
    assert isinstance(got["evaluation"], DatasetError) and "not a JPEG or PNG" in str(got["evaluation"])


def test_a_png_named_jpg_is_read_by_content_everywhere(tmp_path):
    got = readers(tmp_path, "really-a-png.jpg", encode(shapes_image(30, 48), "PNG"))
    assert torch.equal(got["serving"], got["training"]) and torch.equal(got["serving"], got["evaluation"])
