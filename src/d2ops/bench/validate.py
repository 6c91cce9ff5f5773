"""``make bench-validate``: our validator vs ``pycocotools.coco.COCO(path)`` on a train2017-sized file.

Writes a synthetic dataset version (train: the big file, val: a val2017-sized one), then runs
each measurement in its own subprocess so the peak RSS of one does not count against the other:
ours validates the whole version with every check except opening image files
(``validate_local(check_images=False)``) on the bounded reader that well-formed files take; the
same with the whole-file decoder (how every file was read before the bounded reader, and how
hostile ones still are); the baseline merely loads and indexes train.json.
Peak RSS is the process's VmHWM, which counts the memory-mapped annotation file's resident pages.
Ends with one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from d2ops.bench.child import measure_in_child
from d2ops.bench.cocogen import TRAIN2017_IMAGES, TRAIN2017_INSTANCES, write_coco_like

TARGET_RATIO = 1.0  # ours vs pycocotools' load
TARGET_PEAK_MB = 512.0  # what the bounded reader must stay under at train2017 scale
TARGET_VS_WHOLE_FILE = 1.5  # its time vs the whole-file decoder's
VAL_FRACTION = 1 / 24  # val2017 is about 1/24 of train2017


def _peak_rss_mb() -> float:
    """VmHWM: resident anonymous memory and mapped file pages (ru_maxrss may carry a parent's size across exec)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def _measure_ours(dataset: str, *, whole_file: bool = False) -> dict[str, Any]:
    from d2ops_core.validation import coco, validate_local

    if whole_file:  # what a document the bounded reader gives up on gets (and every file got before it)
        def give_up(*_: Any, **__: Any) -> coco.SplitResult:
            raise coco._Fallback
        coco._check_bounded = give_up
    started = time.perf_counter()
    report = validate_local(dataset, check_images=False)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_rss_mb": _peak_rss_mb(), "valid": report.valid,
            "error_count": report.error_count, "warning_count": report.warning_count,
            "issue_counts": report.issue_counts}


def _measure_pycocotools(annotation_file: str) -> dict[str, Any]:
    import contextlib
    import io

    from pycocotools.coco import COCO

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # COCO() prints progress lines
        coco = COCO(annotation_file)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_rss_mb": _peak_rss_mb(), "annotations": len(coco.anns)}


def _run_measure(kind: str, target: Path) -> dict[str, Any]:
    return measure_in_child("d2ops.bench.validate", kind, target)


def write_dataset(root: Path, *, images: int, instances: int) -> Path:
    """A dataset version whose train.json has the given size; returns the train.json path."""
    if root.exists():
        shutil.rmtree(root)
    (root / "annotations").mkdir(parents=True)
    train = write_coco_like(root / "annotations/train.json", images=images, instances=instances, seed=1)
    write_coco_like(root / "annotations/val.json", images=max(2, round(images * VAL_FRACTION)),
                    instances=max(2, round(instances * VAL_FRACTION)), seed=2, folder="val/")
    (root / "manifest.json").write_text(json.dumps({
        "name": "bench", "version": "v1", "format": "coco", "train": "annotations/train.json",
        "val": "annotations/val.json", "images": "images/"}))
    return train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.bench.validate", description=__doc__)
    parser.add_argument("--workdir", default="build/bench-validate", help="where the synthetic files go")
    parser.add_argument("--images", type=int, default=TRAIN2017_IMAGES)
    parser.add_argument("--instances", type=int, default=TRAIN2017_INSTANCES)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--measure", choices=("ours", "whole-file", "pycocotools"), help=argparse.SUPPRESS)
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:  # child process: one measurement, one JSON line
        if args.measure == "pycocotools":
            print(json.dumps(_measure_pycocotools(args.target)))
        else:
            print(json.dumps(_measure_ours(args.target, whole_file=args.measure == "whole-file")))
        return 0

    root = Path(args.workdir) / "dataset"
    print(f"[1/4] writing a synthetic dataset: train {args.images} images / {args.instances} instances", flush=True)
    started = time.perf_counter()
    train = write_dataset(root, images=args.images, instances=args.instances)
    size_mb = train.stat().st_size / 1e6
    print(f"      {train} {size_mb:.0f} MB in {time.perf_counter() - started:.1f} s", flush=True)
    print("[2/4] ours: validate_local(check_images=False) on the whole version (bounded reader)", flush=True)
    ours = _run_measure("ours", root)
    print(f"      {ours['seconds']:.2f} s, peak RSS {ours['peak_rss_mb']:.0f} MB, valid={ours['valid']} "
          f"({ours['error_count']} errors, {ours['warning_count']} warnings)", flush=True)
    print("[3/4] the same with the whole-file decoder (how every file was read before)", flush=True)
    whole = _run_measure("whole-file", root)
    print(f"      {whole['seconds']:.2f} s, peak RSS {whole['peak_rss_mb']:.0f} MB", flush=True)
    if whole["issue_counts"] != ours["issue_counts"]:
        raise SystemExit(f"the two readers disagree: {ours['issue_counts']} vs {whole['issue_counts']}")
    print("[4/4] baseline: pycocotools.coco.COCO(train.json)", flush=True)
    base = _run_measure("pycocotools", train)
    print(f"      {base['seconds']:.2f} s, peak RSS {base['peak_rss_mb']:.0f} MB", flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)

    ratio = ours["seconds"] / base["seconds"] if base["seconds"] > 0 else float("inf")
    vs_whole = ours["seconds"] / whole["seconds"] if whole["seconds"] > 0 else float("inf")
    met = ratio <= TARGET_RATIO and ours["peak_rss_mb"] <= TARGET_PEAK_MB and vs_whole <= TARGET_VS_WHOLE_FILE
    print(f"ratio {ratio:.2f} (target <= {TARGET_RATIO}), peak {ours['peak_rss_mb']:.0f} MB vs "
          f"{whole['peak_rss_mb']:.0f} MB whole-file (target <= {TARGET_PEAK_MB:.0f}), time {vs_whole:.2f}x the "
          f"whole-file decoder's (target <= {TARGET_VS_WHOLE_FILE}): {'met' if met else 'NOT met'}")
    print(json.dumps({
        "bench": "validate", "images": args.images, "instances": args.instances, "file_mb": round(size_mb, 1),
        "seconds": round(ours["seconds"], 3), "baseline": "pycocotools.coco.COCO",
        "baseline_seconds": round(base["seconds"], 3), "ratio": round(ratio, 3),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1), "baseline_peak_rss_mb": round(base["peak_rss_mb"], 1),
        "whole_file_seconds": round(whole["seconds"], 3), "whole_file_peak_rss_mb": round(whole["peak_rss_mb"], 1),
        "ratio_vs_whole_file": round(vs_whole, 3),
        "valid": ours["valid"], "targets_met": met,
    }))
    return 0 if ours["valid"] else 1  # the synthetic version is valid: anything else is a validator bug


if __name__ == "__main__":
    sys.exit(main())
