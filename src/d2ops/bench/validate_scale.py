"""``make bench-validate-scale``: every image of an Open-Images-shaped version checked through the
offline Distributed Map, against today's single-Lambda path on the same version in the same run.

The version is synthetic and shaped like Open Images V7 detection: about 600 classes with a long
tail, a long-tailed number of boxes per image (8 on average), JPEGs of the sizes its images come in
(the longer side 1024 px, varied aspect ratios), one train and one val split. It lives in moto's S3
(in-process; a versioned data bucket like the stack's DataBucket).

- **map**: the validate step with ``InlineImageLimit`` 0 writes the image items; the pipeline's own
  ``Check images`` state (read from statemachine/training_pipeline.asl.json, so the bench runs what
  ships) runs on the embedded interpreter: ItemReader, ItemBatcher (50), MaxConcurrencyPath,
  ResultWriter, each child invoking the real ``check_images`` handler; then the real summarize step.
- **single**: the validate step checking every image itself (``InlineImageLimit`` above the count).
- **worker**: one batch of 50 in a process of its own: the peak RSS a batch adds to a Lambda's.

Each side runs in its own process. The extrapolation to 1.7 M images in the cloud is a model, not a
measurement: see :func:`extrapolate`. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from d2ops.bench import cpu_model
from d2ops.bench.child import measure_in_child
from d2ops.functions import import_handler
from d2ops_core.pipeline_stages import all_states

OPEN_IMAGES_TRAIN = 1_743_042  # Open Images V7 detection train images
CLASSES = 600
BOXES_MEAN = 8
BATCH = 50  # the Check images state's MaxItemsPerBatch (read back from the definition and checked)
LAMBDA_SECONDS = 900  # one Lambda invocation's limit
# Step Functions starts a Map Run's children over a few seconds; AWS documents no figure, so the model
# charges this much per wave of children (an assumption, printed with the result).
CHILD_START_SECONDS = 1.0
DATA, ARTIFACTS, PREFIX, RUN_ID = "d2ops-data-bench", "d2ops-artifacts-bench", "datasets/oi/v1/", "oi_v1_bench"
REPO_ROOT = Path(__file__).resolve().parents[3]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _status_mb(field: str) -> float:
    """VmRSS or VmHWM (the peak since the last reset) from /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no {field} in /proc/self/status")


def _jpegs(rng: random.Random) -> list[tuple[bytes, int, int]]:
    """A few encoded JPEGs of Open Images' shapes (longer side 1024), reused across the version."""
    from PIL import Image, ImageDraw

    out = []
    for width, height in ((1024, 768), (768, 1024), (1024, 683), (1024, 576), (683, 1024), (1024, 1024)):
        image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(12):
            x, y = rng.randrange(width - 64), rng.randrange(height - 64)
            draw.rectangle((x, y, x + rng.randrange(16, 64), y + rng.randrange(16, 64)),
                           fill=tuple(rng.randrange(256) for _ in range(3)))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85)
        out.append((buffer.getvalue(), width, height))
    return out


def _split(rng: random.Random, names: list[tuple[str, int, int]], first_ann: int,
           classes: list[int]) -> dict[str, Any]:
    # Class frequencies fall off as a power law (a few classes hold most boxes, as in Open Images).
    weights = [1 / c ** 1.1 for c in classes]
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, (name, width, height) in enumerate(names, 1):
        images.append({"id": i, "file_name": name, "width": width, "height": height})
        for _ in range(min(60, int(rng.expovariate(1 / BOXES_MEAN)) + 1)):
            w, h = rng.uniform(8, width / 2), rng.uniform(8, height / 2)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            annotations.append({"id": first_ann + len(annotations), "image_id": i, "iscrowd": 0, "area": w * h,
                                "category_id": rng.choices(classes, weights)[0],
                                "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)]})
    categories = [{"id": c, "name": f"class_{c:03d}"} for c in range(1, CLASSES + 1)]
    return {"images": images, "annotations": annotations, "categories": categories}


def upload_version(s3: Any, images: int, *, seed: int = 0, corrupt: int = 0) -> None:
    """The synthetic version under s3://DATA/PREFIX (manifest last); ``corrupt`` images are truncated."""
    rng = random.Random(seed)
    encoded = _jpegs(rng)
    val_count = max(1, images // 10)
    names: dict[str, list[tuple[str, int, int]]] = {"train": [], "val": []}
    for n in range(images):
        split = "val" if n < val_count else "train"
        body, width, height = encoded[n % len(encoded)]
        # Every image's bytes differ (a comment segment after SOI), so no two are the same content.
        body = body[:2] + b"\xff\xfe" + (len(f"{n:08d}") + 2).to_bytes(2, "big") + f"{n:08d}".encode() + body[2:]
        if n >= images - corrupt:
            body = body[: len(body) // 3]  # a truncated JPEG: its header reads, its pixels do not
        name = f"{split}/{n:08d}.jpg"
        s3.put_object(Bucket=DATA, Key=f"{PREFIX}images/{name}", Body=body)
        names[split].append((name, width, height))
    train = _split(rng, names["train"], 1, list(range(1, CLASSES + 1)))
    # val's boxes only of classes train has (a val class absent from train is an error, as it should be)
    val = _split(rng, names["val"], 10_000_000, sorted({a["category_id"] for a in train["annotations"]}))
    for split, document in (("train", train), ("val", val)):
        s3.put_object(Bucket=DATA, Key=f"{PREFIX}annotations/{split}.json", Body=json.dumps(document).encode())
    manifest = {"name": "oi", "version": "v1", "format": "coco", "train": "annotations/train.json",
                "val": "annotations/val.json", "images": "images/"}
    s3.put_object(Bucket=DATA, Key=f"{PREFIX}manifest.json", Body=json.dumps(manifest).encode())


@contextmanager
def offline_s3() -> Iterator[Any]:
    """moto's S3 in this process, the stack's two buckets, and the function code on sys.path."""
    from unittest import mock

    import boto3
    from moto import mock_aws

    for name in ("validate_dataset", "check_images"):
        import_handler(name)
    environment = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                   "AWS_DEFAULT_REGION": "us-east-1", "ARTIFACTS_BUCKET": ARTIFACTS,
                   "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "WARNING"}
    with mock.patch.dict(os.environ, environment):
        for variable in [v for v in os.environ if v.startswith("AWS_ENDPOINT_URL")]:
            del os.environ[variable]  # moto's in-process S3, whatever endpoint the caller's shell names
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            for bucket in (DATA, ARTIFACTS):
                s3.create_bucket(Bucket=bucket)
            s3.put_bucket_versioning(Bucket=DATA, VersioningConfiguration={"Status": "Enabled"})
            yield s3


def _event() -> Any:
    from validate_dataset.models import ValidateDatasetEvent

    return ValidateDatasetEvent(bucket=DATA, prefix=PREFIX, run_id=RUN_ID)


def check_images_state() -> dict[str, Any]:
    """The pipeline's Check images state as a one-state machine (its Catch and Next dropped)."""
    definition = json.loads((REPO_ROOT / "statemachine" / "training_pipeline.asl.json").read_text())
    state = {k: v for k, v in all_states(definition)["Check images"].items() if k not in ("Catch", "Next")}
    if state["ItemBatcher"]["MaxItemsPerBatch"] != BATCH:
        raise SystemExit(f"the definition batches {state['ItemBatcher']['MaxItemsPerBatch']} images, not {BATCH}")
    return {"StartAt": "Check images", "States": {"Check images": {**state, "End": True}}}


def run_single(s3: Any, images: int) -> tuple[Any, float]:
    from validate_dataset.service import validate_dataset

    started = time.perf_counter()
    summary = validate_dataset(_event(), s3, ARTIFACTS, inline_limit=images + 1)
    return summary, time.perf_counter() - started


def run_map(s3: Any, concurrency: int) -> tuple[Any, float, list[float]]:
    """Validate (pending), the Check images Map on the interpreter, summarize: (summary, seconds, batch seconds)."""
    from check_images.models import ImageBatchEvent
    from check_images.service import check_batch
    from validate_dataset.models import SummarizeImagesEvent
    from validate_dataset.service import summarize_images, validate_dataset

    from d2ops.asl import StateMachine

    started = time.perf_counter()
    pending = validate_dataset(_event(), s3, ARTIFACTS, inline_limit=0, concurrency=concurrency)
    if not pending.images_pending:
        raise SystemExit(f"the version did not go to the Map: {pending.first_errors}")
    batch_seconds: list[float] = []

    def invoke(resource: str, parameters: Any, context: Any) -> Any:
        began = time.perf_counter()
        result = check_batch(ImageBatchEvent.model_validate(parameters["Payload"]), s3, ARTIFACTS)
        batch_seconds.append(time.perf_counter() - began)
        return {"StatusCode": 200, "ExecutedVersion": "$LATEST", "Payload": result.model_dump(mode="json")}

    machine = StateMachine.from_definition(check_images_state(), "PipelineStateMachine-bench", substitutions={
        "Partition": "aws", "CheckImagesFunctionArn": "arn:aws:lambda:us-east-1:123456789012:function:check-images",
        "ArtifactsBucketName": ARTIFACTS})
    execution = machine.run({"dataset": {"bucket": DATA, "prefix": PREFIX},
                             "validation": {"summary": pending.model_dump(mode="json")}},
                            executors={"arn:aws:states:::lambda:invoke": invoke}, execution_name=RUN_ID)
    if execution.status != "SUCCEEDED":
        raise SystemExit(f"the Map failed: {execution.error}: {execution.cause}")
    summary = summarize_images(SummarizeImagesEvent(bucket=DATA, prefix=PREFIX, run_id=RUN_ID,
                                                    result_writer=execution.output["image_check"]["ResultWriterDetails"]),
                               s3, ARTIFACTS, concurrency=concurrency)
    return summary, time.perf_counter() - started, batch_seconds


def run_worker(s3: Any) -> tuple[float, float]:
    """One batch of BATCH images in this process: (seconds, MB of peak RSS the batch added)."""
    from check_images.models import BatchInput, ImageBatchEvent
    from check_images.service import check_batch
    from validate_dataset.service import validate_dataset

    from d2ops_core import s3_layout
    from d2ops_core.validation.inventory import ImageItem

    validate_dataset(_event(), s3, ARTIFACTS, inline_limit=0)
    body = s3.get_object(Bucket=ARTIFACTS, Key=s3_layout.image_items_key(RUN_ID))["Body"].read()
    items = [ImageItem.model_validate_json(line) for line in body.splitlines()[:BATCH]]
    event = ImageBatchEvent(BatchInput=BatchInput(bucket=DATA, prefix=PREFIX, run_id=RUN_ID), Items=items)
    # Reset the peak to the current RSS (Linux clear_refs 5), so the peak read after is the batch's own.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_mb("VmRSS")
    started = time.perf_counter()
    check_batch(event, s3, ARTIFACTS)
    return time.perf_counter() - started, max(0.0, _status_mb("VmHWM") - before)


def _measure(kind: str, images: int, concurrency: int) -> dict[str, Any]:
    with offline_s3() as s3:
        upload_version(s3, images)
        if kind == "single":
            summary, seconds = run_single(s3, images)
            return {"seconds": seconds, "images": summary.image_count, "valid": summary.valid,
                    "peak_rss_mb": _peak_rss_mb()}
        if kind == "map":
            summary, seconds, batches = run_map(s3, concurrency)
            return {"seconds": seconds, "images": summary.image_count, "valid": summary.valid,
                    "batches": len(batches), "batch_seconds_mean": sum(batches) / len(batches),
                    "batch_seconds_max": max(batches), "peak_rss_mb": _peak_rss_mb()}
        seconds, added = run_worker(s3)
        return {"seconds": seconds, "peak_rss_added_mb": added, "peak_rss_mb": _peak_rss_mb()}


def extrapolate(batch_seconds: float, single_images_per_s: float, concurrency: int,
                images: int = OPEN_IMAGES_TRAIN) -> dict[str, float]:
    """The cloud-time model for ``images`` images.

    Map: ceil(images / BATCH) batches, ``concurrency`` at a time, each taking the batch time measured
    here, plus CHILD_START_SECONDS per wave. Single Lambda: images at the rate measured here, within
    one invocation's LAMBDA_SECONDS. Both measured against moto in-process, so S3's real GET latency
    (tens of ms, overlapped by the checking threads) is not in them: the model is a floor.
    """
    waves = math.ceil(math.ceil(images / BATCH) / concurrency)
    return {"map_seconds": waves * (batch_seconds + CHILD_START_SECONDS),
            "single_seconds": images / single_images_per_s,
            "single_max_images": single_images_per_s * LAMBDA_SECONDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.bench.validate_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000, help="images in the synthetic version (default 5000)")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="the Map's MaxConcurrency (default: the template's ImageCheckConcurrency default)")
    parser.add_argument("--measure", choices=("single", "map", "worker"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.images < BATCH:
        parser.error(f"--images must be at least {BATCH}")
    concurrency = args.concurrency or _template_concurrency()
    if args.measure:
        print(json.dumps(_measure(args.measure, args.images, concurrency)))
        return 0
    print(f"{args.images} images, {CLASSES} classes, about {BOXES_MEAN} boxes an image; Map concurrency "
          f"{concurrency}; CPU {cpu_model()}, {os.cpu_count()} cores", flush=True)
    single = measure_in_child("d2ops.bench.validate_scale", "single", "--images", str(args.images),
                              "--concurrency", str(concurrency))
    print(f"single Lambda: {single['images']} images in {single['seconds']:.1f} s "
          f"({single['images'] / single['seconds']:.0f}/s), peak RSS {single['peak_rss_mb']:.0f} MB", flush=True)
    mapped = measure_in_child("d2ops.bench.validate_scale", "map", "--images", str(args.images),
                              "--concurrency", str(concurrency))
    print(f"Distributed Map: {mapped['images']} images in {mapped['seconds']:.1f} s "
          f"({mapped['images'] / mapped['seconds']:.0f}/s), {mapped['batches']} batches of {BATCH}, "
          f"{mapped['batch_seconds_mean']:.2f} s a batch (max {mapped['batch_seconds_max']:.2f})", flush=True)
    worker = measure_in_child("d2ops.bench.validate_scale", "worker", "--images", str(max(BATCH, 100)),
                              "--concurrency", str(concurrency))
    print(f"one batch in its own process: {worker['seconds']:.2f} s, peak RSS +{worker['peak_rss_added_mb']:.0f} MB "
          f"(process {worker['peak_rss_mb']:.0f} MB with moto)", flush=True)
    if single["images"] != mapped["images"] or single["valid"] != mapped["valid"]:
        raise SystemExit(f"the paths disagree: single {single}, map {mapped}")
    model = extrapolate(mapped["batch_seconds_mean"], single["images"] / single["seconds"], concurrency)
    print(f"1.7 M images (Open Images train) in the cloud, modelled: Map {model['map_seconds'] / 60:.1f} min at "
          f"concurrency {concurrency}; one Lambda would need {model['single_seconds'] / 3600:.1f} h and checks at "
          f"most {model['single_max_images']:,.0f} images in its 15 minutes")
    result = {"bench": "validate_scale", "images": args.images, "concurrency": concurrency,
              "images_per_s_single": round(single["images"] / single["seconds"], 1),
              "images_per_s_map": round(mapped["images"] / mapped["seconds"], 1),
              "ratio": round(single["seconds"] / mapped["seconds"], 3),
              "batch_seconds": round(mapped["batch_seconds_mean"], 3),
              "peak_rss_mb_per_worker": round(worker["peak_rss_added_mb"], 1),
              "peak_rss_mb_single": round(single["peak_rss_mb"], 1),
              "extrapolated_cloud_seconds_1_7m": round(model["map_seconds"], 1),
              "single_lambda_seconds_1_7m": round(model["single_seconds"], 1),
              "single_lambda_max_images_15min": int(model["single_max_images"]),
              "cpu": cpu_model()}
    print(json.dumps(result))
    return 0


def _template_concurrency() -> int:
    from d2ops.template import load_template

    return int(load_template().document["Parameters"]["ImageCheckConcurrency"]["Default"])


if __name__ == "__main__":
    sys.exit(main())
