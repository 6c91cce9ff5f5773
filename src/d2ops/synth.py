"""Synthetic dataset versions: coloured squares, discs and triangles on plain backgrounds.

The shapes are easy enough for a small detector trained from scratch on a CPU to learn in
minutes, which is what the tests and the offline demo need. Output follows the dataset
contract in docs/dataset-format.md, with ``manifest.json`` written last.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

CATEGORIES: tuple[dict[str, Any], ...] = (
    {"id": 1, "name": "square", "supercategory": "shape"},
    {"id": 2, "name": "disc", "supercategory": "shape"},
    {"id": 3, "name": "triangle", "supercategory": "shape"},
)
DISC_VERTICES = 24


@dataclass(frozen=True)
class SynthSummary:
    output_dir: Path
    train_images: int
    val_images: int
    train_instances: int
    val_instances: int


def _polygon(kind: int, cx: float, cy: float, r: float, rng: random.Random) -> list[float]:
    if kind == 1:
        pts = [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    elif kind == 2:
        pts = [
            (cx + r * math.cos(2 * math.pi * i / DISC_VERTICES), cy + r * math.sin(2 * math.pi * i / DISC_VERTICES))
            for i in range(DISC_VERTICES)
        ]
    else:
        turn = rng.uniform(0, 2 * math.pi)
        angles = [turn + 2 * math.pi * i / 3 for i in range(3)]
        pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in angles]
    return [round(v, 2) for p in pts for v in p]


def _area(flat: list[float]) -> float:
    xs, ys = flat[0::2], flat[1::2]
    n = len(xs)
    return abs(sum(xs[i] * ys[(i + 1) % n] - xs[(i + 1) % n] * ys[i] for i in range(n))) / 2


def _overlaps(box: tuple[float, float, float, float], others: list[tuple[float, float, float, float]]) -> bool:
    x0, y0, x1, y1 = box
    return any(not (x1 < a0 or a1 < x0 or y1 < b0 or b1 < y0) for a0, b0, a1, b1 in others)


def _make_image(
    index: int, size: int, rng: random.Random, *, brightness: float = 1.0, shape_scale: float = 1.0,
) -> tuple[Image.Image, list[tuple[int, list[float], list[float]]]]:
    # brightness and shape_scale scale what the generator drew (the same random calls), so a shifted stream
    # is the same scenes darker/brighter or with bigger/smaller shapes, and the defaults change nothing.
    background = tuple(min(255, round(rng.randint(0, 90) * brightness)) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    shapes: list[tuple[int, list[float], list[float]]] = []
    taken: list[tuple[float, float, float, float]] = []
    wanted = rng.randint(1, 3)
    for n in range(wanted * 10):  # bounded retries to place shapes without overlap
        if len(shapes) == wanted:
            break
        # The first shape's kind cycles with the image index so every class is present.
        kind = (index % 3) + 1 if not shapes else rng.randint(1, 3)
        r = rng.uniform(size * 0.08, size * 0.2) * shape_scale
        cx, cy = rng.uniform(r + 1, size - r - 1), rng.uniform(r + 1, size - r - 1)
        flat = _polygon(kind, cx, cy, r, rng)
        xs, ys = flat[0::2], flat[1::2]
        box = (min(xs), min(ys), max(xs), max(ys))
        if _overlaps(box, taken) and n < wanted * 10 - 1:
            continue
        colour = tuple(min(255, round(rng.randint(130, 255) * brightness)) for _ in range(3))
        draw.polygon(list(zip(xs, ys, strict=True)), fill=colour)
        taken.append(box)
        shapes.append((kind, flat, [box[0], box[1], box[2] - box[0], box[3] - box[1]]))
    return image, shapes


def _write_json_atomic(path: Path, document: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)


MAX_SHAPE_SCALE = 2.0  # the largest shape (0.2 x size x scale in radius) still fits inside the image


def generate(output_dir: Path | str, *, images: int = 60, seed: int = 0, size: int = 128,
             val_fraction: float = 0.25, name: str = "shapes", version: str = "v1", brightness: float = 1.0,
             shape_scale: float = 1.0) -> SynthSummary:
    """Write a dataset version of ``images`` images (train + val) under ``output_dir``.

    ``brightness`` multiplies every colour (0.5: images half as bright) and ``shape_scale`` every shape's size:
    another distribution of the same scenes, for a shifted stream (``d2ops demo --loop``, the monitor's tests)."""
    if not 0 < brightness <= 4:
        raise ValueError(f"--brightness must be in (0, 4] (got {brightness})")
    if not 0.25 <= shape_scale <= MAX_SHAPE_SCALE:
        raise ValueError(f"--shape-scale must be in [0.25, {MAX_SHAPE_SCALE}] (got {shape_scale})")
    if images < 4:
        raise ValueError(f"--images must be at least 4 (got {images}): both splits need images")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1 (got {val_fraction})")
    out = Path(output_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    manifest = out / "manifest.json"
    manifest.unlink(missing_ok=True)  # a half-rewritten dataset must never look complete

    rng = random.Random(seed)
    n_val = max(1, round(images * val_fraction))
    splits: dict[str, dict[str, Any]] = {
        s: {"images": [], "annotations": [], "categories": [dict(c) for c in CATEGORIES]} for s in ("train", "val")
    }
    ann_id = 1
    for i in range(images):
        split = "val" if i >= images - n_val else "train"
        image, shapes = _make_image(i, size, rng, brightness=brightness, shape_scale=shape_scale)
        file_name = f"{split}/{i:06d}.jpg"
        (out / "images" / split).mkdir(exist_ok=True)
        image.save(out / "images" / file_name, quality=95)
        splits[split]["images"].append({"id": i + 1, "file_name": file_name, "width": size, "height": size})
        for kind, flat, bbox in shapes:
            splits[split]["annotations"].append({
                "id": ann_id, "image_id": i + 1, "category_id": kind, "bbox": [round(v, 2) for v in bbox],
                "area": round(_area(flat), 2), "segmentation": [flat], "iscrowd": 0,
            })
            ann_id += 1

    for split, doc in splits.items():
        _write_json_atomic(out / "annotations" / f"{split}.json", doc)
    _write_json_atomic(manifest, {
        "name": name, "version": version, "format": "coco",
        "train": "annotations/train.json", "val": "annotations/val.json", "images": "images/",
    })
    return SynthSummary(
        output_dir=out,
        train_images=len(splits["train"]["images"]),
        val_images=len(splits["val"]["images"]),
        train_instances=len(splits["train"]["annotations"]),
        val_instances=len(splits["val"]["annotations"]),
    )
