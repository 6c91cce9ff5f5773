"""``make bench-eval``: our bbox evaluation vs pycocotools ``COCOeval`` on a val2017-shaped set.

Writes a synthetic ground truth shaped like COCO val2017 (5,000 images, 36,781 instances,
80 categories; d2ops.bench.cocogen) and detections like a detector's output at
``MAX_DETECTIONS`` per image (about 500k: jittered copies of the ground-truth boxes, some with
the wrong class, plus background boxes, random scores), then scores them in separate
subprocesses, each timed from the loaded JSON to the 12 stats:

- **ours**: ``model_code.evaluation.coco.score_iou_type`` (faster-coco-eval, with the per-class
  AP and PR curves the evaluation report carries), what the evaluation job runs;
- **baseline**: ``pycocotools`` ``COCO`` + ``loadRes`` + ``COCOeval`` evaluate/accumulate/summarize.

The 12 stats of ours come from the same faster-coco-eval evaluation (run once more, untimed, as
``score_iou_type`` keeps only the first six); the largest absolute difference across them is
the agreement figure. Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from d2ops.bench.child import measure_in_child
from d2ops.bench.cocogen import HEIGHT, WIDTH, write_coco_like

VAL2017_IMAGES = 5_000
VAL2017_INSTANCES = 36_781
MAX_DETECTIONS = 100  # per image, as model_code.evaluation.coco keeps
STAT_COUNT = 12


def write_detections(gt: dict[str, Any], path: Path, *, per_image: int, seed: int) -> int:
    """Detector-like results: per image, jittered ground-truth boxes first, then background boxes."""
    rng = random.Random(seed)
    categories = [c["id"] for c in gt["categories"]]
    by_image: dict[int, list[dict[str, Any]]] = {im["id"]: [] for im in gt["images"]}
    for ann in gt["annotations"]:
        by_image[ann["image_id"]].append(ann)
    results: list[dict[str, Any]] = []
    for image_id, anns in by_image.items():
        for k in range(per_image):
            if k < 2 * len(anns):  # two guesses per object: one close, one looser
                x, y, w, h = anns[k % len(anns)]["bbox"]
                spread = 0.05 if k < len(anns) else 0.25
                x, y = x + rng.gauss(0, spread * w), y + rng.gauss(0, spread * h)
                w, h = w * rng.uniform(1 - spread, 1 + spread), h * rng.uniform(1 - spread, 1 + spread)
                cat = anns[k % len(anns)]["category_id"] if rng.random() < 0.85 else rng.choice(categories)
                score = rng.uniform(0.3, 1.0)
            else:
                w, h = rng.uniform(4, 200), rng.uniform(4, 200)
                x, y, cat, score = rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h), rng.choice(categories), \
                    rng.uniform(0.0, 0.5)
            results.append({"image_id": image_id, "category_id": cat,
                            "bbox": [round(x, 2), round(y, 2), round(max(w, 1.0), 2), round(max(h, 1.0), 2)],
                            "score": round(score, 5)})
    path.write_text(json.dumps(results))
    return len(results)


def _measure_ours(gt_path: str, dt_path: str) -> dict[str, Any]:
    from faster_coco_eval import COCO, COCOeval_faster

    from model_code.evaluation.coco import score_iou_type

    gt, dt = json.loads(Path(gt_path).read_text()), json.loads(Path(dt_path).read_text())
    names = {c["id"]: c["name"] for c in gt["categories"]}
    started = time.perf_counter()
    scores = score_iou_type(gt, dt, "bbox", names)
    seconds = time.perf_counter() - started
    # score_iou_type keeps six stats: the same evaluation again, untimed, for all twelve.
    gt, dt = json.loads(Path(gt_path).read_text()), json.loads(Path(dt_path).read_text())
    coco_gt = COCO(gt, print_function=lambda *_, **__: None)
    evaluator = COCOeval_faster(coco_gt, coco_gt.loadRes(dt), iouType="bbox", print_function=lambda *_, **__: None)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return {"seconds": seconds, "stats": [float(s) for s in evaluator.stats[:STAT_COUNT]],
            "reported": scores.metrics, "classes": len(scores.per_class)}


def _measure_pycocotools(gt_path: str, dt_path: str) -> dict[str, Any]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt, dt = json.loads(Path(gt_path).read_text()), json.loads(Path(dt_path).read_text())
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress and the summary
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        evaluator = COCOeval(coco_gt, coco_gt.loadRes(dt), iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "stats": [float(s) for s in evaluator.stats[:STAT_COUNT]]}


def _run_measure(kind: str, gt: Path, dt: Path) -> dict[str, Any]:
    return measure_in_child("d2ops.bench.eval", kind, gt, dt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.bench.eval", description=__doc__)
    parser.add_argument("--workdir", default="build/bench-eval", help="where the synthetic files go")
    parser.add_argument("--images", type=int, default=VAL2017_IMAGES)
    parser.add_argument("--instances", type=int, default=VAL2017_INSTANCES)
    parser.add_argument("--detections-per-image", type=int, default=MAX_DETECTIONS)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--measure", choices=("ours", "pycocotools"), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:  # child process: one measurement, one JSON line
        measure = _measure_ours if args.measure == "ours" else _measure_pycocotools
        print(json.dumps(measure(*args.paths)))
        return 0

    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    print(f"[1/3] writing {args.images} images / {args.instances} instances and "
          f"{args.detections_per_image} detections per image", flush=True)
    started = time.perf_counter()
    gt_path = write_coco_like(root / "val.json", images=args.images, instances=args.instances, seed=5)
    dt_path = root / "detections.json"
    detections = write_detections(json.loads(gt_path.read_text()), dt_path, per_image=args.detections_per_image,
                                  seed=6)
    print(f"      {detections} detections in {time.perf_counter() - started:.1f} s", flush=True)
    print("[2/3] ours: model_code.evaluation.coco.score_iou_type (faster-coco-eval)", flush=True)
    ours = _run_measure("ours", gt_path, dt_path)
    print(f"      {ours['seconds']:.2f} s", flush=True)
    print("[3/3] baseline: pycocotools COCOeval", flush=True)
    base = _run_measure("pycocotools", gt_path, dt_path)
    print(f"      {base['seconds']:.2f} s", flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)

    diffs = [abs(a - b) for a, b in zip(ours["stats"], base["stats"], strict=True)]
    # What the report carries must be those same stats (the first six, -1 "undefined" left out).
    reported = [ours["reported"].get(f"bbox_{n}") for n in ("AP", "AP50", "AP75", "APs", "APm", "APl")]
    reported_diff = max((abs(r - s) for r, s in zip(reported, ours["stats"], strict=False) if r is not None),
                        default=0.0)
    ratio = ours["seconds"] / base["seconds"] if base["seconds"] > 0 else float("inf")
    print(f"stats ours      {' '.join(f'{s:.4f}' for s in ours['stats'])}")
    print(f"stats baseline  {' '.join(f'{s:.4f}' for s in base['stats'])}")
    print(f"time ratio ours/pycocotools {ratio:.3f}; largest abs difference across the {STAT_COUNT} stats "
          f"{max(diffs):.2e}")
    print(json.dumps({
        "bench": "eval", "images": args.images, "instances": args.instances, "detections": detections,
        "seconds": round(ours["seconds"], 3), "baseline": "pycocotools.cocoeval.COCOeval",
        "baseline_seconds": round(base["seconds"], 3), "ratio": round(ratio, 4),
        "max_abs_stat_diff": max(diffs), "reported_vs_stats_diff": reported_diff,
        "stats": [round(s, 6) for s in ours["stats"]], "baseline_stats": [round(s, 6) for s in base["stats"]],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
