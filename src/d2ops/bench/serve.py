"""``make bench-serve``: the artifact's forms against the eager model, and each server against TorchServe.

One detector (an untrained torchvision Faster R-CNN resnet18-FPN, 320 px, so the figures measure serving
rather than accuracy) and one set of 640x480 JPEGs, measured in one run:

- forms, in this process (``d2ops.bench.serve_forms.measure``): export time of each form the export step
  writes (TorchScript, torch.export, AOTInductor unless ``--no-aoti``) and its latency through
  ``model_code.inference.predict``, one image a call, against the eager model (the baseline);
- servers: ``POST /invocations`` with the JPEG bytes through every server of
  ``d2ops_core.platform.SERVING_SERVERS`` (``d2ops.local.serving.LocalEndpoint``, the serving image's
  configuration, one worker, the artifact's TorchScript form on both), batching on (batch size 8) and off
  (batch size 1), at concurrency 1 and 8; TorchServe is the baseline.

Latency p50/p99 per request and throughput (requests/s) for each, ratios against the baselines measured in
the same run. Both sides run torch with the same number of intra-op threads (``--threads``). Prints the CPU
and load average it ran under; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform as host
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from d2ops_core.platform import SERVING_SERVERS

IMAGE_SIZE = (640, 480)
MODEL_SIZE = 320
BASELINE_FORM = "eager"
BASELINE_SERVER = "torchserve"
BATCHING = (("batching_on", 8), ("batching_off", 1))
CONCURRENCY = (1, 8)


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return host.processor() or "unknown"


def make_model(directory: Path) -> Path:
    """The detector the servers serve, exported as a ``model.tar.gz`` holding its TorchScript form (the one
    every artifact holds, so both servers run the same form)."""
    import torch
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    from model_code.artifact import ArtifactMetadata, pack_artifact, save_artifact
    from model_code.training.torchvision_export import export_torchvision

    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    model = FasterRCNN(backbone, num_classes=4, min_size=MODEL_SIZE, max_size=MODEL_SIZE, box_score_thresh=0.05)
    meta = ArtifactMetadata(framework="torchvision", task="detection", model="fasterrcnn_resnet18_fpn",
                            class_names=["square", "disc", "triangle"], category_ids=[1, 2, 3])
    out = save_artifact(directory / "model", export_torchvision(model, has_masks=False), meta)
    return pack_artifact(out, directory / "model.tar.gz")


def make_images(count: int) -> list[bytes]:
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    images = []
    for _ in range(count):
        image = Image.new("RGB", IMAGE_SIZE, tuple(int(v) for v in rng.integers(0, 90, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(4):
            x, y = int(rng.integers(0, IMAGE_SIZE[0] - 120)), int(rng.integers(0, IMAGE_SIZE[1] - 120))
            draw.ellipse((x, y, x + 100, y + 100), fill=tuple(int(v) for v in rng.integers(120, 256, 3)))
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=90)
        images.append(buf.getvalue())
    return images


def summarize(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"requests": len(latencies), "p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(p99 * 1000, 1), "throughput_rps": round(len(latencies) / wall, 2)}


def ratios(figures: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    """p50, p99 and throughput over the baseline's (latency below 1 and throughput above 1 beat it)."""
    return {"p50_ratio": round(figures["p50_ms"] / baseline["p50_ms"], 3),
            "p99_ratio": round(figures["p99_ms"] / baseline["p99_ms"], 3),
            "throughput_ratio": round(figures["throughput_rps"] / baseline["throughput_rps"], 3)}


def bench_forms(rounds: int, threads: int, aoti: bool) -> dict[str, Any]:
    """Export time and in-process latency of each form against the eager model: the export step's own writers,
    timed by :func:`d2ops.bench.serve_forms.measure` on the same detector and image size as the servers."""
    from d2ops.bench.serve_forms import measure

    result = measure(images=8, rounds=rounds, image_size=IMAGE_SIZE, model_size=MODEL_SIZE, aoti=aoti,
                     threads=threads)
    print(f"  {BASELINE_FORM} (baseline): {result['eager']}", flush=True)
    for form, figures in result["forms"].items():
        print(f"  {form}: {figures}", flush=True)
    for form, figures in (result.get("backbone") or {}).items():
        print(f"  backbone {form}: {figures}", flush=True)
    return result


def bench_served(url: str, images: list[bytes], concurrency: int, requests_total: int) -> dict[str, float]:
    import requests

    local = threading.local()

    def send(i: int) -> float:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        t = time.perf_counter()
        r = session.post(url, data=images[i % len(images)], headers={"Content-Type": "image/jpeg"}, timeout=300)
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:200]}")
        return time.perf_counter() - t

    for i in range(2):  # connection set-up and first-request costs out of the figures
        send(i)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(send, range(requests_total)))
    return summarize(latencies, time.perf_counter() - started)


def bench_servers(model: Path, images: list[bytes], servers: list[str], requests_total: int,
                  max_batch_delay_ms: int) -> dict[str, dict[str, dict[str, float]]]:
    from d2ops.local.serving import LocalEndpoint

    results: dict[str, dict[str, dict[str, float]]] = {}
    for server in servers:
        results[server] = {}
        for name, batch_size in BATCHING:
            print(f"starting {server}, {name} (batch_size={batch_size}) ...", flush=True)
            with LocalEndpoint(model, backend=server, batch_size=batch_size, max_batch_delay_ms=max_batch_delay_ms,
                               startup_timeout=300) as endpoint:
                for concurrency in CONCURRENCY:
                    figures = bench_served(endpoint.invocations_url, images, concurrency, requests_total)
                    results[server][f"{name}_c{concurrency}"] = figures
                    print(f"  {server} {name} concurrency {concurrency}: {figures}", flush=True)
    baseline = results.get(BASELINE_SERVER)
    for server, configs in results.items():
        for config, figures in configs.items():
            if baseline and server != BASELINE_SERVER:
                figures.update({f"{k}_to_{BASELINE_SERVER}": v for k, v in ratios(figures, baseline[config]).items()})
    return results


def batching_gain(configs: dict[str, dict[str, float]]) -> float | None:
    """Throughput with batching over without, at the highest concurrency (the issue's goal: >= 1.5 on a GPU)."""
    top = max(CONCURRENCY)
    on, off = configs.get(f"batching_on_c{top}"), configs.get(f"batching_off_c{top}")
    return round(on["throughput_rps"] / off["throughput_rps"], 3) if on and off else None


def print_tables(forms: dict[str, Any], servers: dict[str, dict[str, dict[str, float]]]) -> None:
    print()
    print(f"{'form':<14}{'export s':>10}{'p50 ms':>9}{'p99 ms':>9}{'p50/eager':>11}{'p99/eager':>11}")
    eager = forms["eager"]
    print(f"{BASELINE_FORM:<14}{'-':>10}{eager['p50_ms']:>9}{eager['p99_ms']:>9}{1.0:>11}{1.0:>11}")
    for form, f in forms["forms"].items():
        if not f.get("available"):
            print(f"{form:<14}{f.get('export_s', '-'):>10}  not available: {f.get('problem')}")
            continue
        print(f"{form:<14}{f['export_s']:>10}{f['p50_ms']:>9}{f['p99_ms']:>9}{f['p50_ratio']:>11}{f['p99_ratio']:>11}")
    backbone = forms.get("backbone")
    if backbone:
        print(f"\nthe part that exports (backbone + FPN, {backbone['image_px']} px): p50 against its eager run")
        for form in ("eager", "exported", "aoti"):
            if form in backbone:
                f = backbone[form]
                print(f"{'backbone ' + form:<22}{f.get('export_s', '-'):>10}{f['p50_ms']:>9}{f['p99_ms']:>9}"
                      f"{f.get('p50_ratio', 1.0):>11}")
    if not servers:
        return
    print()
    key_p50, key_rps = f"p50_ratio_to_{BASELINE_SERVER}", f"throughput_ratio_to_{BASELINE_SERVER}"
    print(f"{'server':<12}{'configuration':<18}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>8}{'p50/ts':>9}{'rps/ts':>9}")
    for server, configs in servers.items():
        for config, f in configs.items():
            print(f"{server:<12}{config:<18}{f['p50_ms']:>9}{f['p99_ms']:>9}{f['throughput_rps']:>8}"
                  f"{f.get(key_p50, 1.0):>9}{f.get(key_rps, 1.0):>9}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=32,
                        help="requests per form and per served configuration (default 32)")
    parser.add_argument("--max-batch-delay-ms", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, in-process and in the servers alike (default 1: on a shared "
                             "2-core machine more threads than free cores slow torch down several times)")
    parser.add_argument("--servers", default=",".join(SERVING_SERVERS),
                        help=f"comma-separated servers to measure (default all: {','.join(SERVING_SERVERS)})")
    parser.add_argument("--skip-servers", action="store_true", help="the forms only (no server started)")
    parser.add_argument("--no-aoti", dest="aoti", action="store_false",
                        help="leave the AOTInductor form out (its CPU compile takes minutes)")
    args = parser.parse_args(argv)
    servers = [] if args.skip_servers else [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = sorted(set(servers) - set(SERVING_SERVERS))
    if unknown or args.requests < 1:
        parser.error(f"--servers: unknown {unknown}; expected from {', '.join(SERVING_SERVERS)}" if unknown
                     else "--requests must be at least 1")
    # Read by torch at import, here and in the servers' workers (which inherit the environment).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    cpu, load_start = cpu_model(), os.getloadavg()
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {args.threads} thread(s); "
          f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}", flush=True)

    print("forms in-process (baseline: the eager model) ...", flush=True)
    forms = bench_forms(args.requests, args.threads, args.aoti)
    with tempfile.TemporaryDirectory(prefix="d2ops-bench-serve-") as tmp:
        served = bench_servers(make_model(Path(tmp)), make_images(8), servers, args.requests, args.max_batch_delay_ms)

    load_end = os.getloadavg()
    print_tables(forms, served)
    print(f"\nload average at the end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print(json.dumps({
        "bench": "serve", "cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_start": round(load_start[0], 2), "load_avg_end": round(load_end[0], 2),
        "image": list(IMAGE_SIZE), "model_size": MODEL_SIZE, "requests": args.requests,
        "max_batch_delay_ms": args.max_batch_delay_ms,
        "baseline_form": BASELINE_FORM, "eager": forms["eager"], "forms": forms["forms"],
        "backbone": forms.get("backbone"),
        "baseline_server": BASELINE_SERVER, "servers": served,
        "batching_throughput_ratio": {server: batching_gain(configs) for server, configs in served.items()},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
