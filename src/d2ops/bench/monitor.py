"""``make bench-monitor``: windows of captured records the monitor judges per second, and its peak memory,
against reading the same records with pandas (``pandas.read_json(lines=True)``) in the same run.

One capture file of ``--records`` SageMaker data-capture records (default 10,000: a busy hour at 10%
sampling) is written once: each a base64 JPEG request (``--size``, default 320x240, cycling through 64
distinct images) and the endpoint's JSON answer. Each side runs in its own process (peak RSS is its own)
and judges ``--windows`` windows of the file against a baseline of the same traffic:

- ours: the monitor's path (``capture_files.parse_capture_lines`` streaming the lines,
  ``monitor_endpoint.service.window_features``, ``statistics.judge``);
- pandas: ``pandas.read_json(path, lines=True)`` reads the whole window into a DataFrame, then the same
  features from its rows (the same image function, so the two differ only in how records are read) and
  the same statistics.

Both sides' read alone is timed too (the lines parsed into records vs ``read_json``). Ends with one JSON
line of figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from d2ops.bench import cpu_model
from d2ops.bench.child import measure_in_child
from d2ops.functions import import_handler
from d2ops_core.documents.capture import CaptureData, CaptureRecord, EventMetadata, encode_payload
from d2ops_core.documents.monitoring import MonitoringBaseline
from d2ops_core.monitoring_features import build_baseline

MODULE = "d2ops.bench.monitor"
CLASSES = ("car", "person", "bicycle")
DISTINCT_IMAGES = 64


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _images(size: tuple[int, int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(DISTINCT_IMAGES):
        image = Image.new("RGB", size, tuple(rng.randrange(60, 200) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(12):
            x, y = rng.randrange(size[0]), rng.randrange(size[1])
            draw.rectangle([x, y, x + rng.randrange(8, 80), y + rng.randrange(8, 60)],
                           fill=tuple(rng.randrange(256) for _ in range(3)))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return out


def _answer(rng: random.Random, size: tuple[int, int]) -> dict[str, Any]:
    detections = []
    for class_id, name in enumerate(CLASSES, start=1):
        for _ in range(rng.randrange(3)):
            x, y = rng.uniform(0, size[0] - 40), rng.uniform(0, size[1] - 40)
            detections.append({"box": [round(x, 2), round(y, 2), round(x + rng.uniform(8, 40), 2),
                                       round(y + rng.uniform(8, 40), 2)],
                               "score": round(rng.uniform(0.5, 1.0), 4), "class_id": class_id, "class_name": name})
    return {"detections": detections, "image": {"width": size[0], "height": size[1]},
            "score_thresholds": {"source": "model", "by_class": dict.fromkeys(CLASSES, 0.5)}}


def write_capture(path: Path, records: int, size: tuple[int, int], seed: int = 0) -> None:
    """``records`` capture lines (SageMaker's record shape), written as the offline endpoint writes them."""
    rng = random.Random(seed)
    images = [encode_payload(data, "image/jpeg", "INPUT") for data in _images(size, seed)]
    start = datetime(2026, 11, 29, 9, tzinfo=UTC)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i in range(records):
            answer = encode_payload(json.dumps(_answer(rng, size)).encode(), "application/json", "OUTPUT")
            record = CaptureRecord(captureData=CaptureData(endpointInput=images[i % len(images)],
                                                           endpointOutput=answer),
                                   eventMetadata=EventMetadata(eventId=f"e-{i}", inferenceTime=start + timedelta(
                                       seconds=i * 3600 / records)))
            out.write(record.model_dump_json() + "\n")


def _monitor_modules() -> tuple[Any, Any]:
    return import_handler("monitor_endpoint.service"), import_handler("monitor_endpoint.statistics")


def _measure(kind: str, capture: Path, baseline_path: Path, windows: int) -> dict[str, Any]:
    from d2ops_core.capture_files import parse_capture_lines
    from d2ops_core.monitoring_features import FeatureSample

    service, statistics = _monitor_modules()
    baseline = MonitoringBaseline.model_validate_json(baseline_path.read_text())
    thresholds = statistics.Thresholds()
    if kind == "pandas":
        import pandas as pd  # imported before the clock starts, as the monitor's own modules are
    read_seconds = 0.0
    verdict, records = "", 0
    started = time.perf_counter()
    for _ in range(windows):
        if kind == "ours":
            problems: list[str] = []
            with capture.open("rb") as lines:  # streamed: the read alone is timed below
                sample, records = service.window_features(parse_capture_lines(lines, str(capture)), baseline,
                                                          problems)
        else:
            t0 = time.perf_counter()
            frame = pd.read_json(capture, lines=True)
            read_seconds += time.perf_counter() - t0
            sample = FeatureSample(list(baseline.class_names))
            for data, meta in zip(frame["captureData"], frame["eventMetadata"], strict=True):
                record = CaptureRecord.model_validate({"captureData": data, "eventMetadata": meta})
                sample.add(service.record_features(record, dict(baseline.score_thresholds), "row"))
            records = len(frame)
            del frame
        verdict, _ = statistics.judge(baseline, sample, thresholds)
    seconds = time.perf_counter() - started
    if kind == "ours":  # the read alone: every line parsed into a record, nothing decoded
        t0 = time.perf_counter()
        with capture.open("rb") as lines:
            count = sum(1 for _ in parse_capture_lines(lines, str(capture)))
        read_seconds = (time.perf_counter() - t0) * windows
        assert count == records
    return {"seconds": seconds, "windows": windows, "records": records, "read_seconds": read_seconds / windows,
            "peak_rss_mb": _peak_rss_mb(), "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="build/bench-monitor")
    parser.add_argument("--records", type=int, default=10_000, help="captured records in a window")
    parser.add_argument("--windows", type=int, default=2, help="windows each side judges")
    parser.add_argument("--size", default="320x240", help="the captured images' size, WxH")
    parser.add_argument("--measure", choices=("ours", "pandas"), help=argparse.SUPPRESS)
    parser.add_argument("target", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # child process: one side, one JSON line
        capture, baseline = (Path(p) for p in args.target)
        print(json.dumps(_measure(args.measure, capture, baseline, args.windows)))
        return 0

    width, height = (int(v) for v in args.size.lower().split("x"))
    workdir = Path(args.workdir)
    capture = workdir / "capture.jsonl"
    load = os.getloadavg()[0]
    print(f"[1/3] writing {args.records} capture records ({args.size} JPEG requests) to {capture}", flush=True)
    write_capture(capture, args.records, (width, height))
    baseline_path = workdir / "baseline.json"
    service, _ = _monitor_modules()
    problems: list[str] = []
    from d2ops_core.capture_files import parse_capture_lines

    reference = workdir / "reference.jsonl"  # another draw of the same traffic: the window is unshifted
    write_capture(reference, min(args.records, 2000), (width, height), seed=1)
    with reference.open("rb") as lines:
        features = []
        for record in parse_capture_lines(lines, str(reference)):
            try:
                f = service.record_features(record, dict.fromkeys(CLASSES, 0.5), "reference")
            except ValueError as exc:
                problems.append(str(exc))
                continue
            features.append(f)
    baseline = build_baseline(features, run_id="bench", class_names=CLASSES,
                              score_thresholds=dict.fromkeys(CLASSES, 0.5))
    baseline_path.write_text(baseline.model_dump_json())
    file_mb = capture.stat().st_size / 1e6
    print(f"      {file_mb:.0f} MB", flush=True)
    print("[2/3] ours: the monitor's streaming reader, features, statistics", flush=True)
    ours = measure_in_child(MODULE, "ours", capture, baseline_path, "--windows", str(args.windows))
    print(f"      {ours['seconds']:.1f} s for {args.windows} windows, peak RSS {ours['peak_rss_mb']:.0f} MB",
          flush=True)
    print("[3/3] pandas.read_json(lines=True), the same features and statistics", flush=True)
    theirs = measure_in_child(MODULE, "pandas", capture, baseline_path, "--windows", str(args.windows))
    print(f"      {theirs['seconds']:.1f} s, peak RSS {theirs['peak_rss_mb']:.0f} MB", flush=True)
    if not ours["records"] == theirs["records"] == args.records:
        raise SystemExit(f"the sides read {ours['records']} and {theirs['records']} of {args.records} records")
    windows_per_s = args.windows / ours["seconds"]
    baseline_windows_per_s = args.windows / theirs["seconds"]
    print(json.dumps({
        "bench": "monitor", "records_per_window": args.records, "image": f"{width}x{height} JPEG",
        "file_mb": round(file_mb, 1), "windows": args.windows,
        "windows_per_s": round(windows_per_s, 4), "records_per_s": round(windows_per_s * args.records, 1),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1), "read_seconds": round(ours["read_seconds"], 3),
        "baseline": "pandas.read_json(lines=True)", "baseline_windows_per_s": round(baseline_windows_per_s, 4),
        "baseline_peak_rss_mb": round(theirs["peak_rss_mb"], 1),
        "baseline_read_seconds": round(theirs["read_seconds"], 3),
        "ratio": round(windows_per_s / baseline_windows_per_s, 3),
        "memory_ratio": round(ours["peak_rss_mb"] / theirs["peak_rss_mb"], 3),
        "verdict": ours["verdict"], "baseline_verdict": theirs["verdict"], "cpu": cpu_model(),
        "load_at_start": round(load, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
