import json
import subprocess
import sys

from PIL import Image

from d2ops import synth


def test_synth_writes_a_complete_dataset_version(tmp_path):
    summary = synth.generate(tmp_path / "ds", images=12, seed=3)
    root = tmp_path / "ds"
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest == {"name": "shapes", "version": "v1", "format": "coco", "train": "annotations/train.json",
                        "val": "annotations/val.json", "images": "images/"}
    train = json.loads((root / "annotations/train.json").read_text())
    val = json.loads((root / "annotations/val.json").read_text())
    assert (summary.train_images, summary.val_images) == (len(train["images"]), len(val["images"])) == (9, 3)
    # every class appears in train, ids are unique across splits, boxes lie inside the image
    assert {a["category_id"] for a in train["annotations"]} == {1, 2, 3}
    ids = [a["id"] for a in train["annotations"] + val["annotations"]]
    assert len(ids) == len(set(ids))
    for doc in (train, val):
        sizes = {im["id"]: (im["width"], im["height"]) for im in doc["images"]}
        for im in doc["images"]:
            assert Image.open(root / "images" / im["file_name"]).size == (im["width"], im["height"])
        for a in doc["annotations"]:
            x, y, w, h = a["bbox"]
            width, height = sizes[a["image_id"]]
            assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= width and y + h <= height
            assert 0 < a["area"] <= w * h + 0.01  # both rounded to 2 decimals


def test_synth_is_deterministic(tmp_path):
    synth.generate(tmp_path / "a", images=8, seed=7)
    synth.generate(tmp_path / "b", images=8, seed=7)
    assert (tmp_path / "a/annotations/train.json").read_text() == (tmp_path / "b/annotations/train.json").read_text()


def test_synth_cli_rejects_too_few_images(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "d2ops", "synth", str(tmp_path), "--images", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "at least 4" in proc.stderr


def test_synth_shifts_brightness_and_shape_size_of_the_same_scenes(tmp_path):
    from PIL import ImageStat

    synth.generate(tmp_path / "base", images=40, seed=5)
    synth.generate(tmp_path / "shift", images=40, seed=5, brightness=0.5)
    synth.generate(tmp_path / "big", images=40, seed=5, shape_scale=1.5)

    def brightness(root):
        return [ImageStat.Stat(Image.open(p).convert("L")).mean[0] for p in sorted((root / "images").rglob("*.jpg"))]

    def areas(root):
        return [a["bbox"][2] * a["bbox"][3] for s in ("train", "val")
                for a in json.loads((root / f"annotations/{s}.json").read_text())["annotations"]]

    # catches the option being ignored (equal) or applied the wrong way (brighter, smaller)
    base, shifted = brightness(tmp_path / "base"), brightness(tmp_path / "shift")
    assert all(s < 0.6 * b for s, b in zip(shifted, base, strict=True))
    big, small = areas(tmp_path / "big"), areas(tmp_path / "base")
    assert sum(big) / len(big) > 1.5 * sum(small) / len(small)  # 1.5^2 = 2.25 per drawn shape
    done = subprocess.run([sys.executable, "-m", "d2ops", "synth", str(tmp_path / "bad"), "--shape-scale", "3"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("(got 3.0)")
    assert not (tmp_path / "bad" / "manifest.json").exists()
