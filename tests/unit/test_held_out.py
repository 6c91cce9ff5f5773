"""model_code.evaluation.held_out: the comparison keeps only val images no model trained on, by their bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from d2ops_core.documents.evaluation import ExcludedImages, HeldOutImages
from model_code.dataset_version import DatasetError
from model_code.evaluation.held_out import held_out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def val(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Eight val images v0..v7 (v6 and v7 have the same bytes), one box each, plus an extra key kept as is."""
    images = tmp_path / "images"
    (images / "val").mkdir(parents=True)
    contents = [f"image {i}".encode() for i in range(6)] + [b"twin", b"twin"]
    for i, data in enumerate(contents):
        (images / f"val/v{i}.jpg").write_bytes(data)
    gt = {"info": {"x": 1}, "categories": [{"id": 1, "name": "a"}],
          "images": [{"id": 10 + i, "file_name": f"val/v{i}.jpg"} for i in range(8)],
          "annotations": [{"id": 100 + i, "image_id": 10 + i, "category_id": 1} for i in range(8)]}
    return gt, images


def test_images_a_model_trained_on_are_left_out_with_their_annotations(val: tuple[dict[str, Any], Path]) -> None:
    gt, images = val
    challenger = frozenset({sha(b"image 0"), sha(b"image 1"), sha(b"unrelated")})
    champion = frozenset({sha(b"image 1"), sha(b"image 2"), sha(b"image 3")})  # image 1: both, counted once
    result = held_out(gt, images, {"challenger": challenger, "champion": champion})
    kept = [im["file_name"] for im in result.gt["images"]]
    assert kept == ["val/v4.jpg", "val/v5.jpg", "val/v6.jpg", "val/v7.jpg"]
    assert {a["image_id"] for a in result.gt["annotations"]} == {14, 15, 16, 17}
    assert result.gt["info"] == gt["info"] and result.gt["categories"] == gt["categories"]
    assert result.images == HeldOutImages(compared=4, excluded=[
        ExcludedImages(reason="challenger_trained_on", images=2, examples=["val/v0.jpg", "val/v1.jpg"]),
        ExcludedImages(reason="champion_trained_on", images=2, examples=["val/v2.jpg", "val/v3.jpg"])],
        unverified=[])
    assert (result.compared, result.unknown) == (4, [])
    filtered, report = result  # unpacks as (gt, HeldOutImages)
    assert filtered is result.gt and report.excluded_images == 4
    assert len(gt["images"]) == 8  # the caller's document is not changed


def test_content_not_names_decides(val: tuple[dict[str, Any], Path]) -> None:
    """A val image with a training image's bytes under another name is left out; two val images with the same
    bytes both stay (duplicates in val are no leak)."""
    gt, images = val
    result = held_out(gt, images, {"challenger": frozenset(), "champion": frozenset({sha(b"image 5")})})
    assert [e.examples for e in result.excluded] == [["val/v5.jpg"]]
    assert {"val/v6.jpg", "val/v7.jpg"} <= {im["file_name"] for im in result.gt["images"]}
    by_name = held_out(gt, images, {"challenger": frozenset({"val/v0.jpg"}), "champion": frozenset()})
    assert by_name.compared == 8  # a file name is not a content hash


def test_a_model_without_a_list_is_unverified_and_a_missing_champion_is_not_a_model(
        val: tuple[dict[str, Any], Path]) -> None:
    gt, images = val
    result = held_out(gt, images, {"challenger": frozenset({sha(b"twin")}), "champion": None})
    assert result.unknown == ["champion"] and result.compared == 6
    assert result.excluded == [ExcludedImages(reason="challenger_trained_on", images=2,
                                              examples=["val/v6.jpg", "val/v7.jpg"])]
    first_run = held_out(gt, images, {"challenger": frozenset()})
    assert first_run.images == HeldOutImages(compared=8)
    neither = held_out(gt, images, {"challenger": None, "champion": None})
    assert neither.images == HeldOutImages(compared=8, unverified=["challenger", "champion"])


def test_examples_are_capped_and_every_image_is_counted(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    gt: dict[str, Any] = {"images": [], "annotations": [], "categories": []}
    for i in range(12):
        (tmp_path / f"img/{i:02d}.png").write_bytes(bytes([i]) * 3)
        gt["images"].append({"id": i, "file_name": f"img/{i:02d}.png"})
    trained = frozenset(sha(bytes([i]) * 3) for i in range(9))
    result = held_out(gt, tmp_path, {"challenger": trained})
    [excluded] = result.excluded
    assert excluded.images == 9 and excluded.examples == [f"img/{i:02d}.png" for i in range(5)]
    assert result.compared == 3


def test_bad_arguments_are_named(val: tuple[dict[str, Any], Path]) -> None:
    gt, images = val
    with pytest.raises(ValueError, match=r"trained_on names \['teacher'\]"):
        held_out(gt, images, {"challenger": frozenset(), "teacher": frozenset()})
    (images / "val/v3.jpg").unlink()
    with pytest.raises(DatasetError, match=r"v3\.jpg: cannot read the image to hash it"):
        held_out(gt, images, {"challenger": frozenset()})
