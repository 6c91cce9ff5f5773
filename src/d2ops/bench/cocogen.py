"""A fast writer of large COCO-instances files shaped like COCO train2017.

The defaults give about 118k images, 860k instances (1% crowd RLEs, the rest polygons with
about 25 points) and 80 categories, roughly 450 MB: the scale the validator must handle
inside a Lambda. Polygons come from a small pool of pre-rendered strings, so writing takes
seconds; every box lies inside its image and every area is consistent, so the file is
valid and the validator does all of its work.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

TRAIN2017_IMAGES = 118_287
TRAIN2017_INSTANCES = 860_001
WIDTH, HEIGHT = 640, 480


def _polygon_pool(rng: random.Random, size: int = 4096) -> list[str]:
    pool = []
    for _ in range(size):
        parts = rng.choice((1, 1, 1, 2))
        polys = []
        for _ in range(parts):
            points = rng.randint(8, 35)
            coords = (f"{rng.uniform(0, WIDTH):.2f},{rng.uniform(0, HEIGHT):.2f}" for _ in range(points))
            polys.append("[" + ",".join(coords) + "]")
        pool.append("[" + ",".join(polys) + "]")
    return pool


def _rle_pool(rng: random.Random, size: int = 64) -> list[str]:
    pool = []
    for _ in range(size):
        runs = [rng.randint(1, 400) for _ in range(rng.randint(200, 900))]
        runs.append(WIDTH * HEIGHT - sum(runs))
        pool.append(json.dumps({"counts": runs, "size": [HEIGHT, WIDTH]}, separators=(",", ":")))
    return pool


def write_coco_like(path: Path | str, *, images: int = TRAIN2017_IMAGES, instances: int = TRAIN2017_INSTANCES,
                    categories: int = 80, seed: int = 0, folder: str = "") -> Path:
    """Write a valid COCO instances file of the given size to ``path`` (atomically).

    ``folder`` prefixes every file_name ("val/"): a val file of other images than train's, which
    a train/val pair needs (the same name in both splits is SPLIT_OVERLAP, an error).
    """
    rng = random.Random(seed)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    polygons, rles = _polygon_pool(rng), _rle_pool(rng)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write('{"info":{"description":"synthetic, train2017-shaped"},"licenses":[],"images":[')
        fh.write(",".join(
            f'{{"id":{i},"file_name":"{folder}{i:012d}.jpg","width":{WIDTH},"height":{HEIGHT},"license":1}}'
            for i in range(1, images + 1)))
        fh.write('],"annotations":[')
        chunk: list[str] = []
        for a in range(1, instances + 1):
            w, h = rng.uniform(2, 300), rng.uniform(2, 300)
            x, y = rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h)
            crowd = a % 100 == 0
            seg = rles[a % len(rles)] if crowd else polygons[rng.randrange(len(polygons))]
            chunk.append(
                f'{{"segmentation":{seg},"area":{0.6 * w * h:.3f},"iscrowd":{int(crowd)},'
                f'"image_id":{(a % images) + 1},"bbox":[{x:.2f},{y:.2f},{w:.2f},{h:.2f}],'
                f'"category_id":{(a % categories) + 1},"id":{a}}}')
            if len(chunk) == 10_000:
                fh.write(("," if a > len(chunk) else "") + ",".join(chunk))
                chunk = []
        if chunk:
            fh.write(("," if instances > len(chunk) else "") + ",".join(chunk))
        fh.write('],"categories":[')
        fh.write(",".join(f'{{"id":{c},"name":"class{c:02d}","supercategory":"thing"}}'
                          for c in range(1, categories + 1)))
        fh.write("]}")
    os.replace(tmp, out)
    return out
