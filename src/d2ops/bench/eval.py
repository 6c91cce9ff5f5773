"""``make bench-eval``: our bbox evaluation vs pycocotools ``COCOeval`` on a val2017-shaped set.

Writes a synthetic ground truth shaped like COCO val2017 (5,000 images, 36,781 instances,
80 categories; d2ops.bench.cocogen) and detections like a detector's output at
``MAX_DETECTIONS`` per image (about 500k: jittered copies of the ground-truth boxes, some with
the wrong class, plus background boxes, random scores), then scores them in separate
subprocesses, each timed from the loaded JSON to the 12 stats:

- **ours**: ``model_code.evaluation.coco.score_iou_type`` (faster-coco-eval, with the per-class
  AP and PR curves the evaluation report carries), what the evaluation job runs;
- **baseline**: ``pycocotools`` ``COCO`` + ``loadRes`` + ``COCOeval`` evaluate/accumulate/summarize.

And the gated evaluation, on the same ground truth with a second model's detections (the champion:
the same generator, another seed):

- **gated**: the whole comparison the gate runs: ``model_code.evaluation.matching.matches_from_coco``
  for both models, then ``model_code.evaluation.bootstrap.compare`` (1,000 resamples, the gate's
  default confidence, seed and judged classes), timed against the baseline's pycocotools COCOeval
  of one model (``gated_ratio``, goal at most 0.25);
- **matching baseline**: the matching step as the gate ran it before, pycocotools' pure-Python
  ``COCOeval.evaluate()`` read into ClassMatches (``d2ops.bench.reference_matching``), on the
  challenger's detections, against ours on the same file (``matching_ratio``); the two must be
  identical (``matching_identical``).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from d2ops.bench.child import measure_in_child
from d2ops.bench.cocogen import HEIGHT, WIDTH, write_coco_like
from d2ops_core.gate import DEFAULT_CONFIDENCE, DEFAULT_MIN_CLASS_INSTANCES, DEFAULT_SEED

VAL2017_IMAGES = 5_000
VAL2017_INSTANCES = 36_781
MAX_DETECTIONS = 100  # per image, as model_code.evaluation.coco keeps
STAT_COUNT = 12
GATED_RESAMPLES = 1_000
MEASURES = ("ours", "pycocotools", "gated", "matching-baseline")


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


def _measure_gated(gt_path: str, challenger_path: str, champion_path: str) -> dict[str, Any]:
    from model_code.evaluation.bootstrap import compare
    from model_code.evaluation.matching import matches_from_coco

    gt = json.loads(Path(gt_path).read_text())
    challenger, champion = (json.loads(Path(p).read_text()) for p in (challenger_path, champion_path))
    instances = {str(c["name"]): 0 for c in gt["categories"]}
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    for ann in gt["annotations"]:
        if not ann.get("iscrowd"):
            instances[names[int(ann["category_id"])]] += 1
    judged = sorted(name for name, n in instances.items() if n >= DEFAULT_MIN_CLASS_INSTANCES)
    started = time.perf_counter()
    ours = matches_from_coco(gt, challenger, "bbox")
    one_model = time.perf_counter() - started
    theirs = matches_from_coco(gt, champion, "bbox")
    matched = time.perf_counter()
    comparison = compare(ours, theirs, metric="bbox_AP", n_images=len(gt["images"]), resamples=GATED_RESAMPLES,
                         confidence=DEFAULT_CONFIDENCE, seed=DEFAULT_SEED, judged_classes=judged)
    finished = time.perf_counter()
    overall = comparison.overall
    return {"seconds": finished - started, "matching_seconds": matched - started,
            "matching_one_model_seconds": one_model, "bootstrap_seconds": finished - matched,
            "judged_classes": len(judged), "difference": overall.difference, "interval": [overall.low, overall.high]}


def _measure_matching_baseline(gt_path: str, dt_path: str) -> dict[str, Any]:
    import numpy as np

    from d2ops.bench.reference_matching import pycocotools_matches
    from model_code.evaluation.matching import matches_from_coco

    gt, dt = json.loads(Path(gt_path).read_text()), json.loads(Path(dt_path).read_text())
    started = time.perf_counter()
    reference = pycocotools_matches(gt, dt, "bbox")
    seconds = time.perf_counter() - started
    ours = matches_from_coco(gt, dt, "bbox")  # untimed: the agreement figure
    identical = list(ours) == list(reference) and all(
        np.array_equal(getattr(ours[c], f), getattr(reference[c], f))
        for c in reference for f in ("gt_per_image", "det_image", "det_tp", "det_ignore"))
    return {"seconds": seconds, "identical": identical}


def _run_measure(kind: str, *paths: Path) -> dict[str, Any]:
    return measure_in_child("d2ops.bench.eval", kind, *paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.bench.eval", description=__doc__)
    parser.add_argument("--workdir", default="build/bench-eval", help="where the synthetic files go")
    parser.add_argument("--images", type=int, default=VAL2017_IMAGES)
    parser.add_argument("--instances", type=int, default=VAL2017_INSTANCES)
    parser.add_argument("--detections-per-image", type=int, default=MAX_DETECTIONS)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--measure", choices=MEASURES, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:  # child process: one measurement, one JSON line
        measures: dict[str, Callable[..., dict[str, Any]]] = {
            "ours": _measure_ours, "pycocotools": _measure_pycocotools, "gated": _measure_gated,
            "matching-baseline": _measure_matching_baseline}
        measure = measures[args.measure]
        print(json.dumps(measure(*args.paths)))
        return 0

    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    print(f"[1/5] writing {args.images} images / {args.instances} instances and "
          f"{args.detections_per_image} detections per image", flush=True)
    started = time.perf_counter()
    gt_path = write_coco_like(root / "val.json", images=args.images, instances=args.instances, seed=5)
    dt_path = root / "detections.json"
    detections = write_detections(json.loads(gt_path.read_text()), dt_path, per_image=args.detections_per_image,
                                  seed=6)
    champion_path = root / "champion.json"
    write_detections(json.loads(gt_path.read_text()), champion_path, per_image=args.detections_per_image, seed=7)
    print(f"      {detections} detections (and the champion's as many) in {time.perf_counter() - started:.1f} s",
          flush=True)
    print("[2/5] ours: model_code.evaluation.coco.score_iou_type (faster-coco-eval)", flush=True)
    ours = _run_measure("ours", gt_path, dt_path)
    print(f"      {ours['seconds']:.2f} s", flush=True)
    print("[3/5] baseline: pycocotools COCOeval", flush=True)
    base = _run_measure("pycocotools", gt_path, dt_path)
    print(f"      {base['seconds']:.2f} s", flush=True)
    print(f"[4/5] gated: matching both models (model_code.evaluation.matching) + paired bootstrap "
          f"({GATED_RESAMPLES} resamples)", flush=True)
    gated = _run_measure("gated", gt_path, dt_path, champion_path)
    print(f"      {gated['seconds']:.2f} s (matching {gated['matching_seconds']:.2f} s, bootstrap "
          f"{gated['bootstrap_seconds']:.2f} s)", flush=True)
    print("[5/5] matching baseline: pycocotools COCOeval.evaluate() per-image matching, one model", flush=True)
    matching_base = _run_measure("matching-baseline", gt_path, dt_path)
    print(f"      {matching_base['seconds']:.2f} s", flush=True)
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
    gated_ratio = gated["seconds"] / base["seconds"] if base["seconds"] > 0 else float("inf")
    one_model = gated["matching_one_model_seconds"]
    matching_ratio = one_model / matching_base["seconds"] if matching_base["seconds"] > 0 else float("inf")
    print(f"time ratio ours/pycocotools {ratio:.3f}; largest abs difference across the {STAT_COUNT} stats "
          f"{max(diffs):.2e}")
    print(f"gated comparison / pycocotools COCOeval {gated_ratio:.3f} (goal <= 0.25); matching one model "
          f"{one_model:.2f} s vs pycocotools' {matching_base['seconds']:.2f} s ({matching_ratio:.3f}), "
          f"{'identical' if matching_base['identical'] else 'DIFFERENT'} matches")
    print(json.dumps({
        "bench": "eval", "images": args.images, "instances": args.instances, "detections": detections,
        "seconds": round(ours["seconds"], 3), "baseline": "pycocotools.cocoeval.COCOeval",
        "baseline_seconds": round(base["seconds"], 3), "ratio": round(ratio, 4),
        "max_abs_stat_diff": max(diffs), "reported_vs_stats_diff": reported_diff,
        "stats": [round(s, 6) for s in ours["stats"]], "baseline_stats": [round(s, 6) for s in base["stats"]],
        "gated_seconds": round(gated["seconds"], 3), "gated_ratio": round(gated_ratio, 4),
        "gated_matching_seconds": round(gated["matching_seconds"], 3),
        "gated_bootstrap_seconds": round(gated["bootstrap_seconds"], 3), "gated_resamples": GATED_RESAMPLES,
        "gated_judged_classes": gated["judged_classes"], "gated_difference": round(gated["difference"], 6),
        "gated_interval": [round(v, 6) for v in gated["interval"]],
        "matching_seconds": round(one_model, 3),
        "matching_baseline": "pycocotools.cocoeval.COCOeval.evaluate (per-image matching)",
        "matching_baseline_seconds": round(matching_base["seconds"], 3), "matching_ratio": round(matching_ratio, 4),
        "matching_identical": matching_base["identical"],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
