"""``make bench-serve``: a real TorchServe endpoint against the in-process model call.

One exported detector (an untrained torchvision Faster R-CNN resnet18-FPN, 320 px, so the
figures measure serving rather than accuracy) and one set of 640x480 JPEGs. Measured in one run:

- baseline: ``model_code.inference.predict`` on one decoded image, in this process;
- served: ``POST /invocations`` through TorchServe (``d2ops.local.serving.LocalEndpoint``, the
  serving image's configuration) at concurrency 1 and 8, with batching on (batch size 8) and
  off (batch size 1).

Latency p50/p99 per request and throughput (requests/s) for each; ratios against the baseline.
Both sides run torch with the same number of intra-op threads (``--threads``). Ends with one
JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

IMAGE_SIZE = (640, 480)
MODEL_SIZE = 320


def make_model(directory: Path) -> Path:
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


def bench_in_process(model: Path, images: list[bytes], rounds: int) -> dict[str, float]:
    from PIL import Image

    from model_code.artifact import load_artifact
    from model_code.inference import image_to_tensor, predict

    detector = load_artifact(model)
    tensors = [image_to_tensor(Image.open(io.BytesIO(data))) for data in images]
    for tensor in tensors[:2]:
        predict(detector, [tensor], score_threshold=0.5)
    latencies = []
    started = time.perf_counter()
    for i in range(rounds):
        t = time.perf_counter()
        predict(detector, [tensors[i % len(tensors)]], score_threshold=0.5)
        latencies.append(time.perf_counter() - t)
    return summarize(latencies, time.perf_counter() - started)


def bench_served(url: str, images: list[bytes], concurrency: int, requests_total: int) -> dict[str, float]:
    import requests

    local = threading.local()

    def send(i: int) -> float:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        t = time.perf_counter()
        r = session.post(url, data=images[i % len(images)], headers={"Content-Type": "image/jpeg"}, timeout=120)
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:200]}")
        return time.perf_counter() - t

    for i in range(2):  # connection set-up and first-request costs out of the figures
        send(i)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(send, range(requests_total)))
    return summarize(latencies, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=48, help="requests per served configuration (default 48)")
    parser.add_argument("--max-batch-delay-ms", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, in-process and in the TorchServe worker alike (default 1: on a "
                             "shared 2-core machine more threads than free cores slow torch down several times)")
    args = parser.parse_args(argv)
    # Read by torch at import, here and in the TorchServe worker (which inherits the environment).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    from d2ops.local.serving import LocalEndpoint

    with tempfile.TemporaryDirectory(prefix="d2ops-bench-serve-") as tmp:
        print("exporting the benchmark detector ...", flush=True)
        model = make_model(Path(tmp))
        images = make_images(8)
        print("in-process predict (baseline) ...", flush=True)
        baseline = bench_in_process(model, images, rounds=args.requests)
        print(f"  baseline: {baseline}", flush=True)
        served: dict[str, Any] = {}
        for name, batch_size in (("batching_on", 8), ("batching_off", 1)):
            print(f"starting TorchServe, {name} (batch_size={batch_size}) ...", flush=True)
            with LocalEndpoint(model, batch_size=batch_size, max_batch_delay_ms=args.max_batch_delay_ms,
                               startup_timeout=300) as endpoint:
                for concurrency in (1, 8):
                    figures = bench_served(endpoint.invocations_url, images, concurrency, args.requests)
                    figures["p50_ratio_to_in_process"] = round(figures["p50_ms"] / baseline["p50_ms"], 2)
                    figures["throughput_ratio_to_in_process"] = round(
                        figures["throughput_rps"] / baseline["throughput_rps"], 2)
                    served[f"{name}_c{concurrency}"] = figures
                    print(f"  {name} concurrency {concurrency}: {figures}", flush=True)

    print()
    print(f"{'configuration':<22}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>8}{'p50/in-proc':>13}{'rps/in-proc':>13}")
    print(f"{'in-process predict':<22}{baseline['p50_ms']:>9}{baseline['p99_ms']:>9}"
          f"{baseline['throughput_rps']:>8}{1.0:>13}{1.0:>13}")
    for name, f in served.items():
        print(f"{name:<22}{f['p50_ms']:>9}{f['p99_ms']:>9}{f['throughput_rps']:>8}"
              f"{f['p50_ratio_to_in_process']:>13}{f['throughput_ratio_to_in_process']:>13}")
    print(json.dumps({"bench": "serve", "image": list(IMAGE_SIZE), "model_size": MODEL_SIZE, "threads": args.threads,
                      "max_batch_delay_ms": args.max_batch_delay_ms, "in_process": baseline, **served}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
