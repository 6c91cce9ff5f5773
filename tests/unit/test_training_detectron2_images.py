"""The detectron2 trainer reads every image by the one image rule (model_code/training/detectron2_mapper.py).

Real detectron2 on a tiny synthetic version: the trainer's own train and test loaders, its mapper against
detectron2's stock one. What the stock mapper does differently is each test's mutation: it reads a GIF and a
picture over the operator's pixel limit without a word, so a trainer wired back to it fails here.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from d2ops import synth
from d2ops_core import images as rule
from model_code.dataset_version import Categories, DatasetError, open_dataset_version
from model_code.training import detectron2_trainer as d2
from model_code.training.config import ConfigError
from tests.fixtures.frameworks import require_detectron2

require_detectron2()

from detectron2.data import DatasetCatalog, DatasetMapper  # noqa: E402

from model_code.training import detectron2_sampler, detectron2_worker  # noqa: E402
from model_code.training.detectron2_mapper import RuleDatasetMapper, read_image  # noqa: E402

ROTATED = "train/000001.jpg"  # stored 40 wide, 64 high, EXIF orientation 6: upright 64x40
GIF = "train/000002.jpg"  # a GIF named .jpg
LARGE = "train/000003.jpg"  # 1001x1000 JPEG, over a limit of 1,000,000 pixels
LIMIT = 1_000_000


def _jpeg(size: tuple[int, int], orientation: int | None = None) -> bytes:
    picture = Image.new("RGB", size, (200, 40, 10))
    picture.paste((10, 40, 200), (0, 0, 12, 20))  # a marker in the stored top-left corner shows the rotation
    exif = Image.Exif()
    if orientation:
        exif[rule.EXIF_ORIENTATION] = orientation
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", exif=exif.tobytes(), quality=95)
    return buffer.getvalue()


def _gif(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (0, 128, 0)).save(buffer, "GIF")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-image version with three special train images, declared at their upright sizes."""
    root = tmp_path_factory.mktemp("rule-ds")
    synth.generate(root, images=8, seed=3, size=48)
    files = {ROTATED: (_jpeg((40, 64), orientation=6), (64, 40)), GIF: (_gif((48, 48)), (48, 48)),
             LARGE: (_jpeg((1001, 1000)), (1001, 1000))}
    train_path = root / "annotations/train.json"
    train = json.loads(train_path.read_text())
    for name, (data, (width, height)) in files.items():
        (root / "images" / name).write_bytes(data)
        [entry] = [im for im in train["images"] if im["file_name"] == name]
        entry["width"], entry["height"] = width, height
    train_path.write_text(json.dumps(train))
    return root


@pytest.fixture(scope="module")
def names(channel: Path) -> tuple[str, str]:
    """The version registered with detectron2 (names of this module's own, so other tests' stay theirs)."""
    version = open_dataset_version(channel)
    train, val = d2.dataset_registrations(version, version, Categories(ids=[1, 2, 3],
                                                                       names=["square", "disc", "triangle"]))
    train, val = replace(train, name="d2ops_rule_train"), replace(val, name="d2ops_rule_val")
    detectron2_worker.register([vars(train), vars(val)])
    return train.name, val.name


def _record(dataset: str, file_name: str) -> dict[str, Any]:
    [record] = [r for r in DatasetCatalog.get(dataset) if r["file_name"].endswith(file_name)]
    return dict(record)


def _cfg(tmp_path: Path, train: str, val: str, *extra: str) -> Any:
    job = {"source": vars(d2.config_source(None, "detection", use_gpu=False)),
           "options": ["DATASETS.TRAIN", f"('{train}',)", "DATASETS.TEST", f"('{val}',)",
                       "MODEL.ROI_HEADS.NUM_CLASSES", "3", "MODEL.DEVICE", "cpu", "SEED", "1",
                       "DATALOADER.NUM_WORKERS", "0", "SOLVER.IMS_PER_BATCH", "8",
                       "DATALOADER.ASPECT_RATIO_GROUPING", "False", "OUTPUT_DIR", str(tmp_path), *extra]}
    return detectron2_worker.build_config(job)


def _no_augmentation(image_format: str = "BGR") -> RuleDatasetMapper:
    return RuleDatasetMapper(is_train=True, augmentations=[], image_format=image_format)


def test_an_exif_rotated_jpeg_arrives_upright_with_the_annotations_size_and_the_rules_pixels(
        names: tuple[str, str]) -> None:
    record = _record(names[0], ROTATED)
    assert (record["width"], record["height"]) == (64, 40)
    mapped = _no_augmentation("BGR")(record)  # check_image_size would raise SizeMismatchError if it were not
    image = mapped["image"].numpy().transpose(1, 2, 0)  # CHW -> HWC
    assert image.shape == (40, 64, 3)
    rgb = np.asarray(rule.load_rgb(record["file_name"]))
    assert np.array_equal(image, rgb[:, :, ::-1])  # BGR, detectron2's INPUT.FORMAT default
    # the stored top-left marker (blue) is now at the top-right, as every other part reads it
    top_right, top_left = rgb[2, 61].astype(int), rgb[2, 2].astype(int)
    assert top_right[2] > 150 > top_right[0] and top_left[0] > 150 > top_left[2]
    assert len(mapped["instances"]) == len(record["annotations"])

    as_rgb = _no_augmentation("RGB")(record)["image"].numpy().transpose(1, 2, 0)
    assert np.array_equal(as_rgb, rgb)


def test_a_gif_is_refused_by_the_rule_naming_the_file(names: tuple[str, str]) -> None:
    record = _record(names[0], GIF)
    with pytest.raises(DatasetError) as caught:
        _no_augmentation()(record)
    message = str(caught.value)
    assert record["file_name"] in message and "not a JPEG or PNG image (it looks like GIF)" in message
    assert "image id" in message
    # detectron2's own mapper would have trained on it
    assert DatasetMapper(is_train=True, augmentations=[], image_format="BGR")(record)["image"].shape == (3, 48, 48)


def test_an_image_over_the_operators_limit_is_refused(names: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    record = _record(names[0], LARGE)
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, str(LIMIT))
    with pytest.raises(DatasetError) as caught:
        _no_augmentation()(record)
    assert record["file_name"] in str(caught.value)
    assert "1001x1000 (1,001,000 pixels); the limit is 1,000,000 pixels (MAX_IMAGE_PIXELS)" in str(caught.value)
    assert DatasetMapper(is_train=True, augmentations=[], image_format="BGR")(record)["image"].shape[1:] == (1000, 1001)
    monkeypatch.setenv(rule.MAX_PIXELS_ENV, str(2 * LIMIT))  # the limit is read when the image is read
    assert _no_augmentation()(record)["image"].shape[1:] == (1000, 1001)


def test_the_trainers_loaders_use_the_rule(names: tuple[str, str], tmp_path: Path) -> None:
    train, val = names
    cfg = _cfg(tmp_path, train, val)
    loader = detectron2_sampler.build_train_loader(cfg, rank=0, world_size=1, seed=1)
    assert type(loader.dataset.mapper) is RuleDatasetMapper and loader.dataset.mapper.is_train
    # one batch is the whole train split (6 images): the GIF among them stops training with its name
    with pytest.raises(DatasetError, match=r"000002\.jpg.*not a JPEG or PNG"):
        next(iter(loader))

    # evaluation during training (TEST.EVAL_PERIOD): the train split as the test set holds the same GIF
    test_loader = detectron2_worker.Trainer.build_test_loader(cfg, train)
    with pytest.raises(DatasetError, match=r"000002\.jpg.*not a JPEG or PNG"):
        for _ in test_loader:
            pass
    # the val split has no special image: it maps, unaugmented but resized, without annotations
    first = next(iter(detectron2_worker.Trainer.build_test_loader(cfg, val)))[0]
    assert "annotations" not in first and first["image"].dtype.is_floating_point is False


def test_formats_other_than_bgr_and_rgb_are_a_config_error(names: tuple[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"INPUT.FORMAT='L'"):
        RuleDatasetMapper(_cfg(tmp_path, *names, "INPUT.FORMAT", "L"), True)
    with pytest.raises(ConfigError, match="YUV"):
        read_image(_record(names[0], ROTATED)["file_name"], "YUV-BT.601")
