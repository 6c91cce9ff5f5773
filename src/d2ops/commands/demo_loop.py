"""``d2ops demo --loop``: after the first deployment, the loop back into training, offline (issue 32).

After the demo's first run has deployed a model (its dataset ``shapes/v1``):

1. *a shifted stream*: ``d2ops synth``'s scenes at another distribution (``--brightness 0.5``: twice as dark)
   are sent to the offline endpoint through SageMaker Runtime's InvokeEndpoint; the endpoint captures them
   (CaptureSamplingPercentage 100 for the demo) into the local S3 in SageMaker's layout;
2. *the monitor* (the MonitorEndpointFunction Lambda's real handler) compares the stream's window with the
   model's baseline and names the statistics that drifted;
3. *selection*: ``d2ops label select``'s code ranks the captured images and writes a selection directory;
4. *labelling*: a real Label Studio server (its own tool environment) gets the selection through ``d2ops label
   export``'s code; the demo then answers every task through Label Studio's API with the synthetic ground truth
   (as a labeller correcting the pre-annotations would), and ``d2ops label import``'s code reads the completed
   tasks back as dataset version ``shapes/v2`` (v1 plus the labelled images, validated);
5. *the next run*: v2 is uploaded (manifest last) and goes through the pipeline to the quality gate.

A step whose part is not there (no Label Studio installed, a module not in this checkout) says "not yet" and
why, and the steps that need it are skipped; the loop's result says which.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STREAM_IMAGES = 60
STREAM_SEED = 1001
STREAM_BRIGHTNESS = 0.5  # the shifted stream: the same kind of scenes, twice as dark
LABEL_BUDGET = 24
MONITOR_FUNCTION = "MonitorEndpointFunction"
PROJECT = "d2ops demo loop"
CAPTURE_WAIT_S = 60.0  # the offline endpoint writes its capture buffer every few seconds
# The demo's stack parameters: capture every request (the stack's default samples 10 %).
LOOP_PARAMETERS = {"CaptureSamplingPercentage": "100"}

Say = Callable[[str], None]


@dataclass
class LoopResult:
    steps: dict[str, str] = field(default_factory=dict)  # step -> "done" | "not yet: why" | "failed: why"
    stream: dict[str, Any] = field(default_factory=dict)
    monitor: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    labelling: dict[str, Any] = field(default_factory=dict)
    next_run: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No step failed (a step "not yet" is not a failure: its part has not landed)."""
        return not any(v.startswith("failed") for v in self.steps.values())

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "stream": self.stream, "monitor": self.monitor, "selection": self.selection,
                "labelling": self.labelling, "next_run": self.next_run}


def send_stream(rt: Any, root: Path, images: int, size: int, say: Say) -> dict[str, Any]:
    """Write the shifted stream with synth, send every image to the endpoint; the ground truth by image SHA-256."""
    from d2ops import synth

    target = root / "stream"
    synth.generate(target, images=images, seed=STREAM_SEED, size=size, name="stream", version="shifted",
                   brightness=STREAM_BRIGHTNESS)
    truth: dict[str, dict[str, Any]] = {}
    for split in ("train", "val"):
        doc = json.loads((target / "annotations" / f"{split}.json").read_text())
        names = {c["id"]: c["name"] for c in doc["categories"]}
        for image in doc["images"]:
            body = (target / "images" / image["file_name"]).read_bytes()
            boxes = [{"class_name": names[a["category_id"]], "bbox": a["bbox"]} for a in doc["annotations"]
                     if a["image_id"] == image["id"]]
            truth[hashlib.sha256(body).hexdigest()] = {"file": image["file_name"], "width": image["width"],
                                                       "height": image["height"], "boxes": boxes, "body": body}
    runtime = rt.client("sagemaker-runtime")
    started = datetime.now(UTC)
    t = time.monotonic()
    for item in truth.values():
        runtime.invoke_endpoint(EndpointName=rt.stack.endpoint_name, Body=item["body"], ContentType="image/jpeg")
    ended = datetime.now(UTC)
    seconds = time.monotonic() - t
    say(f"  sent {len(truth)} images ({size} px, brightness x{STREAM_BRIGHTNESS}: twice as dark as the training "
        f"data) to {rt.stack.endpoint_name} in {seconds:.1f} s")
    return {"truth": truth, "start": started, "end": ended, "seconds": round(seconds, 1)}


def captured_records(rt: Any, images: set[str]) -> tuple[int, list[str]]:
    """(how many of ``images``, by SHA-256, the endpoint's capture holds; every capture file key). By content:
    capture times are whole seconds, and the deployment's smoke test and the demo's prediction are captured too."""
    from d2ops_core import s3_layout
    from d2ops_core.capture_files import parse_capture_lines
    from d2ops_core.documents.capture import CaptureError

    s3, bucket = rt.client("s3"), rt.stack.artifacts_bucket
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                             Prefix=s3_layout.capture_prefix(rt.stack.endpoint_name)):
        keys.extend(str(o["Key"]) for o in page.get("Contents") or [])
    found: set[str] = set()
    for key in keys:
        for record in parse_capture_lines(s3.get_object(Bucket=bucket, Key=key)["Body"].iter_lines(), key):
            payload = record.captureData.endpointInput
            try:
                digest = hashlib.sha256(payload.raw()).hexdigest() if payload else ""
            except CaptureError:
                continue
            if digest in images:
                found.add(digest)
    return len(found), sorted(keys)


def wait_for_capture(rt: Any, images: set[str], timeout: float = CAPTURE_WAIT_S) -> tuple[int, list[str], float]:
    """Poll until the endpoint's capture holds every image of the stream (it buffers, as SageMaker does, and
    writes a file every few seconds) or ``timeout`` passes: (images captured, keys, seconds waited)."""
    started = time.monotonic()
    while True:
        records, keys = captured_records(rt, images)
        waited = time.monotonic() - started
        if records >= len(images) or waited > timeout:
            return records, keys, waited
        time.sleep(1.0)


def run_monitor(rt: Any, start: datetime, end: datetime, say: Say) -> dict[str, Any]:
    """The monitor Lambda's real handler on the window the stream was sent in; the window's verdict."""
    from d2ops_core.documents.monitoring import MonitoringWindow
    from d2ops_core.s3_layout import parse_s3_uri

    window_start = start.replace(second=0, microsecond=0)
    minutes = max(1, math.ceil((end - window_start).total_seconds() / 60) + 1)
    event = {"window_start": window_start.isoformat(), "window_minutes": minutes}
    say(f"  invoke {MONITOR_FUNCTION} {json.dumps(event)} (EventBridge Scheduler sends {{}}: the last full hour)")
    result = rt.lambdas.invoke(MONITOR_FUNCTION, event)
    bucket, key = parse_s3_uri(result["window_uri"])
    window = MonitoringWindow.model_validate_json(rt.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    say(f"  window {window.window_start:%H:%M}-{window.window_end:%H:%M} UTC, {window.records} records, model "
        f"{window.model_run_id}: {window.verdict.upper()}{' (SNS message sent)' if result.get('notified') else ''}")
    for s in window.statistics:
        if s.drifted:
            means = (f", mean {s.baseline:.3g} -> {s.window:.3g}" if s.baseline is not None and s.window is not None
                     else "")
            say(f"    drifted: {s.statistic} {s.test.upper()} {s.value:.3f} > {s.threshold:g}{means}")
    steady = [s.statistic for s in window.statistics if not s.drifted]
    if steady:
        say(f"    within thresholds: {', '.join(steady)}")
    return {"verdict": window.verdict, "records": window.records, "window": key, "notified": result.get("notified"),
            "drifted": [s.statistic for s in window.drifted_statistics]}


def select(rt: Any, out: Path, budget: int, say: Say) -> dict[str, Any]:
    """``d2ops label select``'s own code on the runtime's S3."""
    from d2ops.commands import label_select

    parser = argparse.ArgumentParser(prog="d2ops label")
    label_select.register(parser.add_subparsers(dest="label_command"))  # the command's own options and defaults
    args = parser.parse_args(["select", "--max-images", str(budget), "--out", str(out)])
    selection, bodies = label_select.make_selection(rt.client("s3"), rt.stack.artifacts_bucket,
                                                    rt.stack.endpoint_name, args, label_select.check_options(args))
    label_select.write_selection(out, selection, bodies)
    for line in label_select.summary_lines(selection, out, shown=5):
        say(f"  {line}")
    return {"images": len(selection.images), "candidates": selection.counts.candidates,
            "near_duplicates": selection.counts.near_duplicates, "excluded": selection.counts.excluded,
            "weak_classes": selection.parameters.weak_classes, "dir": str(out)}


def truth_regions(item: dict[str, Any], control: Any) -> list[dict[str, Any]]:
    """The image's ground-truth boxes as Label Studio rectangle regions (percent of the image's size)."""
    w, h = item["width"], item["height"]
    return [{"id": f"t{i}", "from_name": control.from_name, "to_name": control.to_name, "type": "rectanglelabels",
             "original_width": w, "original_height": h, "image_rotation": 0,
             "value": {"x": 100 * x / w, "y": 100 * y / h, "width": 100 * bw / w, "height": 100 * bh / h,
                       "rotation": 0, "rectanglelabels": [box["class_name"]]}}
            for i, box in enumerate(item["boxes"]) for x, y, bw, bh in [box["bbox"]]]


class BackgroundStudio:
    """Label Studio started in a thread when the loop begins (its first start migrates a database for a minute
    or two), so it comes up while the stream is sent and judged; :meth:`server` waits for it. Always stopped."""

    def __init__(self, data_dir: Path) -> None:
        from d2ops.labelling.studio_server import executable

        self.tool = executable()
        self.started = time.monotonic()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._server: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if self.tool is not None:
            self._thread = threading.Thread(target=self._run, args=(data_dir, self.tool), name="label-studio",
                                            daemon=True)
            self._thread.start()

    def _run(self, data_dir: Path, tool: Path) -> None:
        from d2ops.labelling.studio_server import studio_server

        try:
            with studio_server(data_dir, tool) as server:
                self._server = server
                self._ready.set()
                self._stop.wait()
        except BaseException as exc:  # handed to whoever waits for the server
            self._error = exc
        finally:
            self._ready.set()

    def server(self) -> Any:
        if self.tool is None:
            raise NotYet("Label Studio is not installed (make setup creates .venv-tools/label-studio, or set "
                         "D2OPS_LABEL_STUDIO)")
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._server

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def label(selection_dir: Path, truth: dict[str, dict[str, Any]], base: Path, out: Path, background: BackgroundStudio,
          say: Say) -> dict[str, Any]:
    """Export to a real Label Studio, answer every task with the ground truth through its API, import as v2."""
    from d2ops.labelling import labelstudio, new_version

    waited = time.monotonic()
    studio = background.server()
    say(f"  Label Studio {studio.url} up in {studio.start_seconds:.0f} s, started with the loop (waited "
        f"{time.monotonic() - waited:.0f} s for it here; {background.tool})")
    server = labelstudio.Server(studio.url, studio.token)
    exported = labelstudio.export_selection(server, PROJECT, str(selection_dir), progress=lambda m: say(f"  {m}"))
    project = labelstudio.find_project(server, PROJECT)
    assert project is not None  # export created it
    control = labelstudio.check_project_classes(PROJECT, project.parsed_label_config,
                                                list(new_version.open_base(base).classes))
    answered = 0
    t = time.monotonic()
    for task in server.call("list tasks", lambda: list(server.client.tasks.list(project=project.id,
                                                                                  fields="all"))):
        sha = labelstudio.task_sha256(task)
        item = truth.get(sha or "")
        if item is None:
            raise RuntimeError(f"task {task.id}: image {sha} is not one the demo sent")
        server.call("annotate", server.client.annotations.create, task.id,
                    result=truth_regions(item, control), project=project.id)
        answered += 1
    say(f"  {answered} tasks answered through Label Studio's API with the synthetic ground truth "
        f"({time.monotonic() - t:.1f} s)")
    base_version = new_version.open_base(base)
    read = labelstudio.read_labels(server, PROJECT, list(base_version.classes), progress=lambda m: say(f"  {m}"))
    written = new_version.write_version(base_version, read.labelled, out,
                                        version=new_version.next_version(base_version.version),
                                        progress=lambda m: say(f"  {m}"))
    say(f"  new dataset version {written.name}/{written.version} at {written.path}: +{written.added_train} train, "
        f"+{written.added_val} val images, +{written.added_boxes} boxes; valid: "
        f"{bool(written.report and written.report.valid)}")
    return {"server_start_s": round(studio.start_seconds, 1), "uploaded": exported.uploaded,
            "answered": answered, "labelled": len(read.labelled), "conflicts": len(read.conflicts),
            "version": written.version, "added_train": written.added_train, "added_val": written.added_val,
            "dir": str(written.path)}


class NotYet(Exception):
    """A part of the loop that is not in this checkout yet: the step says so and the loop goes on without it."""


def close_the_loop(rt: Any, args: argparse.Namespace, work_dir: Path, first: dict[str, Any], say: Say,
                   stages: dict[str, float], run_next: Callable[[Path], dict[str, Any]]) -> LoopResult:
    """Steps 1-5 of the module docstring after the first run (``first``) deployed; ``run_next`` runs a dataset
    version through the pipeline and returns the run as the demo records it."""
    result = LoopResult()
    root = work_dir / "loop"
    background = BackgroundStudio(root / "label-studio")
    try:
        return _steps(rt, args, work_dir, root, first, say, stages, run_next, result, background)
    finally:
        background.close()


def _steps(rt: Any, args: argparse.Namespace, work_dir: Path, root: Path, first: dict[str, Any], say: Say,
           stages: dict[str, float], run_next: Callable[[Path], dict[str, Any]], result: LoopResult,
           background: BackgroundStudio) -> LoopResult:

    def step(name: str, title: str, body: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()) -> Any:
        say(f"\n== loop {len(result.steps) + 1}: {title} ==")
        missing = [n for n in needs if result.steps.get(n) != "done"]
        if missing:
            result.steps[name] = f"not yet: needs {', '.join(missing)}"
            say(f"  not yet: needs the {', '.join(missing)} step")
            return None
        t = time.monotonic()
        try:
            value = body()
        except NotYet as exc:
            result.steps[name] = f"not yet: {exc}"
            say(f"  not yet: {exc}")
            return None
        except Exception as exc:  # a failed step is reported, and the loop ends as failed
            result.steps[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            say(f"  failed: {result.steps[name][8:]}")
            return None
        finally:
            stages[f"loop {name}"] = round(time.monotonic() - t, 1)
        result.steps[name] = "done"
        return value

    def stream() -> dict[str, Any]:
        sent = send_stream(rt, root, args.loop_images, args.size, say)
        records, keys, waited = wait_for_capture(rt, set(sent["truth"]))
        if not keys:
            raise NotYet(f"the offline endpoint wrote no data capture under s3://{rt.stack.artifacts_bucket}/"
                         f"capture/{rt.stack.endpoint_name}/ within {waited:.0f} s")
        say(f"  captured {records} of them in {len(keys)} file(s) ({waited:.0f} s after the last request), e.g. "
            f"s3://{rt.stack.artifacts_bucket}/{keys[0]}")
        result.stream = {"images": len(sent["truth"]), "seconds": sent["seconds"], "captured": records,
                         "capture_files": len(keys)}
        return sent

    stream_facts: dict[str, Any] = step("stream", f"a shifted stream to the endpoint of {first['run_id']}",
                                        stream) or {}

    def monitor() -> dict[str, Any]:
        if MONITOR_FUNCTION not in rt.stack.functions:
            raise NotYet(f"the stack has no {MONITOR_FUNCTION}")
        result.monitor = run_monitor(rt, stream_facts["start"], stream_facts["end"], say)
        return result.monitor

    step("monitor", "the monitor compares the window with the model's baseline", monitor, needs=("stream",))

    def selection() -> dict[str, Any]:
        result.selection = select(rt, root / "selection", args.loop_budget, say)
        return result.selection

    step("select", f"what to label next (at most {args.loop_budget} images)", selection, needs=("stream",))

    def labelling() -> dict[str, Any]:
        missing = [m for m in ("d2ops.labelling.labelstudio", "d2ops.labelling.new_version")
                   if importlib.util.find_spec(m) is None]
        if missing:
            raise NotYet(f"d2ops label export/import are not in this checkout ({', '.join(missing)})")
        from d2ops.labelling.new_version import download_champion_snapshot

        # the base is what `d2ops label import` takes by default: the serving model's training snapshot
        base = download_champion_snapshot(rt.client("s3"), rt.stack.artifacts_bucket, root / "champion-snapshot",
                                          lambda m: say(f"  {m}"))
        result.labelling = label(root / "selection", stream_facts["truth"], base,
                                 work_dir / "datasets" / "shapes-v2", background, say)
        background.close()  # not needed while the next version trains
        return result.labelling

    step("label", "labelled in Label Studio, imported as the next dataset version", labelling, needs=("select",))

    def next_run() -> dict[str, Any]:
        result.next_run = run_next(Path(result.labelling["dir"]))
        if not result.next_run.get("gate"):
            raise RuntimeError(f"run {result.next_run.get('run_id')} ended {result.next_run.get('status')} before "
                               "the quality gate")
        return result.next_run

    step("next run", "the new version through the pipeline and the quality gate", next_run, needs=("label",))
    say("\n== the loop ==\n  " + "\n  ".join(f"{k}: {v}" for k, v in result.steps.items()))
    return result
