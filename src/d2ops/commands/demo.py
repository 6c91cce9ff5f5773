"""``d2ops demo``: the whole product offline, end to end, on a synthetic dataset.

Generates a dataset version, uploads it to the local S3 (manifest.json last), delivers the S3
"Object Created" event several times (one run starts), follows the run state by state, then
shows the status API's view of it (over HTTP), the evaluation, the gate decision and a real
prediction from the local endpoint. Its one run has no champion, so the gate decides on MinMap
alone (approve or refuse, never review): nobody is asked to decide, the demo runs unattended.

``--twice`` then shows the quality gate at the stack's own settings (MinMap, MaxRegression,
MinComparedImages; no manifest loosens them): a second version trained for a third of the
iterations is refused with the champion still serving, a third trained for twice as many is
approved and promoted blue/green. Approval needs at least MinComparedImages (50) held-out val
images, so each version has 80 (320 images, a quarter of them val).

``--review`` shows a person deciding: a second version whose val file reuses images the champion
trained on (the same bytes) leaves fewer than MinComparedImages held-out images, so the gate asks
for a review; while the run waits, the demo runs ``d2ops approve RUN_ID`` as a separate process
(through the runtime's status API, as a reviewer would) and the run deploys with the decider recorded.

The last output line is one JSON object (run ids, statuses, per-state durations, gate metrics;
with ``--review`` the review and who decided it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from d2ops.commands.demo_loop import LABEL_BUDGET, LOOP_PARAMETERS, STREAM_IMAGES, LoopResult, close_the_loop
from d2ops.commands.errors import UsageError
from d2ops.local.trainer_choice import FRAMEWORKS, TrainerChoice
from d2ops_core.platform import SERVING_BACKEND_PARAMETER, SERVING_SERVERS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run the whole pipeline offline on a synthetic dataset")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"),
                   help="offline runtime state (default .d2ops; the demo starts it clean)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--twice", action="store_true",
                      help="then a weaker version (refused by the gate) and a stronger one (promoted blue/green)")
    mode.add_argument("--review", action="store_true",
                      help="then a version compared on too few held-out images: the gate asks for a review, "
                           "which the demo decides with `d2ops approve`")
    mode.add_argument("--loop", action="store_true",
                      help="then the loop back into training: a shifted stream to the endpoint, the monitor's "
                           "drift verdict, d2ops label select, labels through a real Label Studio, the next "
                           "version through the gate (d2ops.commands.demo_loop)")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                   help=f"synthetic images per dataset version, a quarter of them val (default {DEFAULT_IMAGES}: "
                        "80 val images, enough for --twice's approval, which needs MinComparedImages)")
    p.add_argument("--size", type=int, default=128, help="image side in pixels (default 128)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="training iterations (default: 250 for detectron2, 150 for torchvision)")
    p.add_argument("--deliveries", type=int, default=3,
                   help="deliver the upload event this many times, as at-least-once delivery may (default 3)")
    p.add_argument("--keep-state", action="store_true", help="keep the work dir's earlier runs and champion")
    p.add_argument("--framework", choices=FRAMEWORKS, default="auto",
                   help="trainer: detectron2 (production), torchvision, or auto (default): detectron2 where it "
                        "imports, torchvision otherwise")
    p.add_argument("--serving-backend", choices=tuple(SERVING_SERVERS), default=None,
                   help="the endpoint's server, the stack parameter ServingBackend (default: the template's, "
                        "torchserve; ray-serve is the maintained one)")
    p.add_argument("--loop-images", type=int, default=STREAM_IMAGES,
                   help=f"--loop: images in the shifted stream (default {STREAM_IMAGES})")
    p.add_argument("--loop-budget", type=int, default=LABEL_BUDGET,
                   help=f"--loop: images to select and label (default {LABEL_BUDGET})")
    p.set_defaults(func=run)


# 320 images, 80 of them val: --twice's third version is approved only when at least MinComparedImages (50)
# held-out val images were compared. Training time does not grow with the images (it is a number of
# iterations); validating and evaluating them costs a few seconds (docs/benchmarks.md).
DEFAULT_IMAGES = 320
VAL_FRACTION = 0.25  # synth.generate's default
REVIEW_REASON = "d2ops demo --review: a person looked at the run and approves it"
EXCLUSION_WORDS = {"champion_trained_on": "the champion trained on them",
                   "challenger_trained_on": "the challenger trained on them"}
APPROVE_TIMEOUT = 120.0  # seconds for the `d2ops approve` process (it starts Python and posts one request)


class _Output:
    """Where say() prints: now, or, for other threads while one thread holds the output, after it lets go."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holder: int | None = None
        self.held: list[str] = []


_OUTPUT = _Output()


def say(line: str = "") -> None:
    with _OUTPUT.lock:
        if _OUTPUT.holder is not None and _OUTPUT.holder != threading.get_ident():
            _OUTPUT.held.append(line)
            return
    print(line, flush=True)


@contextlib.contextmanager
def others_held() -> Iterator[None]:
    """Other threads' lines wait until the block ends: the run's progress (printed by the state machine's
    threads) moves on the moment a decision lands, before the deciding command has printed its answer. Kept,
    not blocked: a blocked state machine thread could hold up the very decision the block waits for. Their
    timestamps are the events' own."""
    with _OUTPUT.lock:
        _OUTPUT.holder = threading.get_ident()
    try:
        yield
    finally:
        with _OUTPUT.lock:  # printed under the lock, so a new line cannot come before them
            for line in _OUTPUT.held:
                print(line, flush=True)
            _OUTPUT.holder, _OUTPUT.held = None, []


def make_dataset(root: Path, version: str, images: int, size: int, seed: int, max_iter: int,
                 trainer: TrainerChoice) -> Path:
    from d2ops import synth

    target = root / f"shapes-{version}"
    shutil.rmtree(target, ignore_errors=True)
    synth.generate(target, images=images, seed=seed, size=size, val_fraction=VAL_FRACTION, name="shapes",
                   version=version)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["training"] = {**trainer.manifest_training, "max_iter": max_iter, "seed": seed}
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return target


def borrow_champion_images(dataset: Path, champion: Path, keep: int) -> dict[str, int]:
    """Make ``dataset``'s val split its first ``keep`` own val images plus, in place of the others, as many of
    ``champion``'s train images (copied: the same bytes, so the same content hash), with their annotations.

    The evaluation job leaves an image a model trained on out of the comparison (model_code.evaluation.held_out),
    so only the ``keep`` own images are compared. The dropped own images leave the dataset (files and entries).
    """
    val_path = dataset / "annotations" / "val.json"
    val = json.loads(val_path.read_text())
    train = json.loads((champion / "annotations" / "train.json").read_text())
    own = sorted(val["images"], key=lambda i: i["id"])
    kept, dropped = own[:keep], own[keep:]
    borrowed = sorted(train["images"], key=lambda i: i["id"])[:len(dropped)]
    if len(borrowed) < len(dropped):
        raise UsageError(f"{champion}: {len(borrowed)} train images, fewer than the {len(dropped)} to borrow")
    for image in dropped:
        (dataset / "images" / image["file_name"]).unlink()
    dropped_ids = {i["id"] for i in dropped}
    annotations = [a for a in val["annotations"] if a["image_id"] not in dropped_ids]
    next_image = 1 + max(i["id"] for i in own)
    next_annotation = 1 + max([a["id"] for a in val["annotations"]] + [0])
    for image in borrowed:
        file_name = f"val/champion-{Path(image['file_name']).name}"
        shutil.copyfile(champion / "images" / image["file_name"], dataset / "images" / file_name)
        kept.append({**image, "id": next_image, "file_name": file_name})
        for a in (a for a in train["annotations"] if a["image_id"] == image["id"]):
            annotations.append({**a, "id": next_annotation, "image_id": next_image})
            next_annotation += 1
        next_image += 1
    val_path.write_text(json.dumps({**val, "images": kept, "annotations": annotations}, indent=1))
    return {"own": keep, "borrowed": len(borrowed)}


def predict(rt: Any, endpoint: str, dataset: Path) -> dict[str, Any]:
    """Send the first val image to the endpoint through SageMaker Runtime's InvokeEndpoint."""
    val = json.loads((dataset / "annotations" / "val.json").read_text())
    image = val["images"][0]
    truth = [next(c["name"] for c in val["categories"] if c["id"] == a["category_id"])
             for a in val["annotations"] if a["image_id"] == image["id"]]
    body = (dataset / "images" / image["file_name"]).read_bytes()
    started = time.monotonic()
    response = rt.client("sagemaker-runtime").invoke_endpoint(EndpointName=endpoint, Body=body,
                                                              ContentType="image/png" if image["file_name"].endswith(
                                                                  ".png") else "image/jpeg")
    answer = json.loads(response["Body"].read())
    return {"image": image["file_name"], "truth": sorted(truth), "answer": answer,
            "latency_ms": round((time.monotonic() - started) * 1000, 1)}


def describe_detections(answer: Any, threshold: float = 0.5) -> list[str]:
    detections = answer.get("detections") if isinstance(answer, dict) else answer
    lines = []
    for det in detections or []:
        score = det.get("score", 0)
        if score >= threshold:
            box = ", ".join(f"{v:.0f}" for v in det.get("box", det.get("bbox", [])))
            lines.append(f"{det.get('class_name', det.get('label'))} {score:.2f} [{box}]")
    return lines


class ReviewWatch:
    """run_pipeline's tick: notices the run waiting for a person (its review request, written by the
    "Wait for review" task's Lambda, appears) and then, once, says why and acts.

    ``approve``: runs the real ``d2ops approve RUN_ID`` as a separate process, as a reviewer would, and prints
    it and its answer (``--review``'s second version). Otherwise the demo did not expect a review: with
    ``attended`` (``--keep-state``: an earlier champion competes, so the gate may ask) it says how to decide
    and waits; without, it stops the run rather than leave an unattended demo waiting for days.
    """

    def __init__(self, rt: Any, *, approve: bool, attended: bool) -> None:
        self.rt = rt
        self.approve = approve
        self.attended = attended
        self.request: Any = None
        self.approval: dict[str, Any] | None = None

    def __call__(self, run_id: str) -> None:
        from d2ops_core.documents.review import ReviewRequest
        from d2ops_core.s3_layout import review_request_key

        if self.request is not None:
            return
        s3, bucket, key = self.rt.client("s3"), self.rt.stack.artifacts_bucket, review_request_key(run_id)
        if not s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0):
            return
        self.request = ReviewRequest.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        say(f"\n== the quality gate asked for a person's review: {run_id} waits in \"Wait for review\" ==")
        say(f"  request s3://{bucket}/{key}, refused unless decided by {self.request.expires_at:%Y-%m-%d %H:%M} UTC")
        say(f"  why: {', '.join(self.request.review_because)}: {self.request.gate_reason}")
        for line in excluded_lines(self.evaluation(run_id)):
            say(f"  {line}")
        if self.approve:
            with others_held():
                self.approval = self.decide(run_id)
            if self.approval["exit_code"] != 0:
                self.stop(self.request.execution_arn, "DemoReviewNotDecided",
                          f"`{self.approval['command']}` exited {self.approval['exit_code']}")
        elif self.attended:
            say(f"  decide it in another terminal: d2ops approve {run_id} --work-dir {self.rt.work_dir}  |  "
                f"d2ops reject {run_id} --reason TEXT --work-dir {self.rt.work_dir}; the demo waits")
        else:
            say("  this demo expected the gate to decide on its own (a first run has no champion, --twice's versions "
                "are compared on enough held-out images): stopping the run instead of waiting for a person")
            self.stop(self.request.execution_arn, "DemoUnexpectedReview",
                      f"the gate asked for a review ({', '.join(self.request.review_because)}), which this demo "
                      "does not expect")

    def evaluation(self, run_id: str) -> dict[str, Any]:
        from d2ops.offline.client import OfflineApis

        apis = OfflineApis(status_api=self.rt.status_api.url, sfn=None,
                           state_machine_arn=self.rt.stack.state_machine_arn)
        return dict(apis.get(f"/runs/{run_id}").get("evaluation") or {})

    def decide(self, run_id: str) -> dict[str, Any]:
        """``d2ops approve`` in its own process: it finds this runtime by the work dir and posts the decision
        to the status API (POST /runs/{runId}/decision) as a session of the stack's reviewer role."""
        import d2ops

        argv = ["approve", run_id, "--reason", REVIEW_REASON, "--work-dir", str(self.rt.work_dir)]
        command = shlex.join(["d2ops", *argv])
        say(f"  a person decides; the demo runs, as a separate process:\n  $ {command}")
        source = str(Path(d2ops.__file__).resolve().parents[1])  # the same d2ops as this process
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)}
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "d2ops", *argv], capture_output=True, text=True, env=env,
                                  timeout=APPROVE_TIMEOUT, check=False)
            code, output = done.returncode, (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            code, output = 124, f"no answer within {APPROVE_TIMEOUT:.0f} s"
        for line in output.splitlines() or ["(no output)"]:
            say(f"    {line}")
        say(f"  (exit {code} after {time.monotonic() - started:.1f} s)")
        return {"command": command, "exit_code": code, "output": output}

    def stop(self, execution_arn: str, error: str, cause: str) -> None:
        self.rt.client("stepfunctions").stop_execution(executionArn=execution_arn, error=error, cause=cause)


def excluded_lines(evaluation: dict[str, Any]) -> list[str]:
    """What the comparison rested on: the held-out val images compared, and those left out and why."""
    compared, val = evaluation.get("images_compared"), evaluation.get("val_images")
    lines = [f"images compared: {compared} held-out of {val} val images (the gate approves on at least "
             f"{evaluation.get('min_compared_images')})"]
    for group in evaluation.get("excluded") or []:
        examples, reason = ", ".join(group.get("examples") or []), str(group.get("reason"))
        lines.append(f"left out: {group.get('images')} val image(s): {EXCLUSION_WORDS.get(reason, reason)}"
                     + (f" (e.g. {examples})" if examples else ""))
    return lines


def show_run(rt: Any, summary: Any, dataset: Path) -> dict[str, Any]:
    from d2ops.commands.status import format_run
    from d2ops.offline.client import OfflineApis

    apis = OfflineApis(status_api=rt.status_api.url, sfn=None, state_machine_arn=rt.stack.state_machine_arn)
    say(f"\n== the status API's view (GET {rt.status_api.url}/runs/{summary.run_id}) ==")
    run = apis.get(f"/runs/{summary.run_id}")
    for line in format_run(run):
        say(line)
    result: dict[str, Any] = {"run": run}
    evaluation = run.get("evaluation") or {}
    if evaluation.get("challenger_metrics"):
        metrics = evaluation["challenger_metrics"]
        say("\n== evaluation (challenger on the val split) ==")
        say("  " + "  ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if isinstance(v, int | float)))
    if run.get("gate"):
        say(f"\n== quality gate: {run['gate']['decision'].upper()} ==\n  {run['gate']['reason']}")
        if evaluation and evaluation.get("champion_value") is None:
            say("  no champion yet: the gate decides on MinMap alone (approve or refuse, never review), so this "
                "run never waits for a person")
    if summary.status == "SUCCEEDED":
        prediction = predict(rt, rt.stack.endpoint_name, dataset)
        say(f"\n== prediction from endpoint {rt.stack.endpoint_name} (InvokeEndpoint, "
            f"{prediction['latency_ms']} ms) ==")
        say(f"  image {prediction['image']}: ground truth {', '.join(prediction['truth'])}")
        for line in describe_detections(prediction["answer"]) or ["(no detection scored >= 0.5)"]:
            say(f"  detected {line}")
        result["prediction"] = prediction
    return result


def next_version_run(rt: Any, dataset: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """--loop's next version through the pipeline, recorded as the other runs are; a review the gate asks for is
    decided with `d2ops approve`, as --review does (the loop is about the labels coming back, not the wait)."""
    from d2ops.offline.pipeline import run_pipeline

    watch = ReviewWatch(rt, approve=True, attended=False)
    summary = run_pipeline(rt, dataset, deliveries=1, out=say, tick=watch)
    shown = show_run(rt, summary, dataset)
    endpoint = rt.sagemaker.endpoint_api.describe_endpoint({"EndpointName": rt.stack.endpoint_name})
    evaluation = dict(shown["run"].get("evaluation") or {})
    record = {**summary.to_json(), "deployment": (shown["run"].get("endpoint") or {}).get("mode"),
              "endpoint_config": endpoint["EndpointConfigName"],
              "prediction": shown.get("prediction", {}).get("answer"),
              "max_iter": None, "images_compared": evaluation.get("images_compared"),
              "gate_decision": evaluation.get("decision")}
    runs.append(record)
    return record


def gate_line(run: dict[str, Any]) -> str:
    """The run's gate in one line: its AP on all its val images (MinMap's), and the comparison with the champion
    on the held-out ones (the interval's own points: the champion's AP on every val image would include the
    images it trained on)."""
    gate = run["gate"]
    interval = gate.get("interval")
    compared = (f"; vs champion on {run.get('images_compared')} held-out val images: {interval['challenger']:.4f} vs "
                f"{interval['champion']:.4f}, difference {interval['difference']:.4f} in [{interval['low']:.4f}, "
                f"{interval['high']:.4f}] ({interval['confidence']:.0%})" if interval else "; no champion")
    return (f"{run['run_id']} ({run['max_iter']} iterations): {gate['primary_metric']} {gate['challenger']:.4f} on its "
            f"val split{compared}; gate min_map {gate['min_map']}, max_regression {gate['max_regression']} (the "
            f"stack's) -> {str(gate['decision']).upper()}")


def show_refusal(rt: Any, champion: dict[str, Any], refused: dict[str, Any], dataset: Path) -> bool:
    """The refused challenger left the endpoint alone: same config, the champion still answers."""
    from d2ops_core.champion import read_champion

    endpoint = rt.sagemaker.endpoint_api.describe_endpoint({"EndpointName": rt.stack.endpoint_name})
    record = read_champion(rt.client("s3"), rt.stack.artifacts_bucket)
    say(f"\n== quality gate refused a weaker challenger ==\n  {gate_line(refused)}\n  {refused['gate']['reason']}")
    still = endpoint["EndpointConfigName"] == champion["endpoint_config"] and record is not None \
        and record.run_id == champion["run_id"]
    answer = predict(rt, rt.stack.endpoint_name, dataset)
    say(f"  the champion {champion['run_id']} still serves (endpoint config {endpoint['EndpointConfigName']}): "
        f"{len(describe_detections(answer['answer']))} detection(s) >= 0.5 on {answer['image']}")
    return still


def approval_line(evaluation: dict[str, Any]) -> str:
    """Why the gate could approve: each condition of the rule (d2ops_core.gate_decision) with its numbers."""
    interval = evaluation.get("interval") or {}
    return (f"approved because the interval's lower end {interval.get('low', float('nan')):.4f} >= "
            f"-MaxRegression {-float(evaluation.get('max_regression') or 0):.2f}, "
            f"{evaluation.get('class_drop_count')} class(es) dropped by more than MaxClassRegression "
            f"{evaluation.get('max_class_regression')} (collapsed or surely worse), "
            f"{evaluation.get('images_compared')} held-out val images compared >= MinComparedImages "
            f"{evaluation.get('min_compared_images')}")


def show_promotion(champion: dict[str, Any], promoted: dict[str, Any], evaluation: dict[str, Any]) -> bool:
    say(f"\n== quality gate promoted a stronger challenger ==\n  {gate_line(promoted)}\n  {approval_line(evaluation)}")
    say(f"  blue/green: endpoint moved from {champion['endpoint_config']} to {promoted['endpoint_config']} "
        f"({promoted['deployment']})")
    return promoted["deployment"] == "update" and promoted["endpoint_config"] != champion["endpoint_config"]


def review_record(summary: Any, watch: ReviewWatch, evaluation: dict[str, Any]) -> dict[str, Any]:
    """The review as the final JSON line tells it: why the gate asked, the command that decided, who decided."""
    gate = summary.output.get("gate") or {}
    return {"run_id": summary.run_id, "gate_decision": evaluation.get("decision"),
            "review_because": evaluation.get("review_because"), "images_compared": evaluation.get("images_compared"),
            "images_excluded": evaluation.get("images_excluded"), "excluded": evaluation.get("excluded"),
            "min_compared_images": evaluation.get("min_compared_images"),
            "command": (watch.approval or {}).get("command"), "exit_code": (watch.approval or {}).get("exit_code"),
            "decision": gate.get("decision"), "approval_status": gate.get("approval_status"),
            "decided_by": gate.get("decided_by"), "decided_at": gate.get("decided_at"),
            "reason": gate.get("review_reason")}


def show_review(champion: dict[str, Any], reviewed: dict[str, Any], record: dict[str, Any]) -> bool:
    """The reviewed run deployed as an approval by the gate would, with the person's decision recorded."""
    say(f"\n== a person approved what the gate could not ==\n  {gate_line(reviewed)}")
    say(f"  the gate: review ({', '.join(record['review_because'] or [])}); {record['images_compared']} held-out "
        f"val images compared, {record['images_excluded']} left out (the champion trained on them), fewer than "
        f"MinComparedImages {record['min_compared_images']}")
    say(f"  decided by {record['decided_by']} at {record['decided_at']}: {record['reason']} ({record['command']})")
    say(f"  registry {record['approval_status']}; blue/green: endpoint moved from {champion['endpoint_config']} to "
        f"{reviewed['endpoint_config']} ({reviewed['deployment']})")
    return (record["gate_decision"] == "review" and "too_few_images" in (record["review_because"] or [])
            and record["decision"] == "approved" and bool(record["decided_by"]) and record["exit_code"] == 0
            and reviewed["deployment"] == "update" and reviewed["endpoint_config"] != champion["endpoint_config"])


def run(args: argparse.Namespace) -> int:
    from d2ops.local.trainer_choice import TrainerUnavailable, choose_trainer
    from d2ops.offline.pipeline import run_pipeline
    from d2ops.offline.processes import RuntimeBusy, install_signal_handlers
    from d2ops.offline.runtime import OfflineRuntime

    if args.loop and (args.loop_images < 4 or args.loop_budget < 1):
        raise UsageError("--loop-images must be >= 4, --loop-budget >= 1")
    if args.images < 8 or (args.max_iter is not None and args.max_iter < 1) or args.deliveries < 1:
        raise UsageError("--images must be >= 8, --max-iter and --deliveries >= 1")
    try:
        trainer = choose_trainer(args.framework, args.size)
    except TrainerUnavailable as exc:
        raise UsageError(str(exc)) from exc
    if args.max_iter is None:
        args.max_iter = trainer.demo_iterations
    install_signal_handlers()
    work_dir: Path = args.work_dir
    parameters = dict(trainer.stack_parameters)
    if args.serving_backend:
        parameters[SERVING_BACKEND_PARAMETER] = args.serving_backend
    if args.loop:
        parameters.update(LOOP_PARAMETERS)
    settings: dict[str, Any] = {"training_defaults": trainer.training_defaults, "parameters": parameters,
                                "function_env": {"PrepareTrainingFunction": {"FRAMEWORK": trainer.framework}}}
    stages: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    review: dict[str, Any] | None = None  # --review: the review and who decided it
    loop: LoopResult | None = None  # --loop: each step's outcome
    ok = True
    t0 = time.monotonic()
    try:
        if not args.keep_state and work_dir.exists():
            previous = sorted(p.stem for p in (work_dir / "executions").glob("*.json"))
            runtime = OfflineRuntime(work_dir, fresh=True, **settings)
            if previous:
                say(f"starting clean: removing {len(previous)} earlier run(s) from {work_dir} "
                    "(--keep-state keeps them)")
        else:
            runtime = OfflineRuntime(work_dir, **settings)
        say("d2ops demo: the whole pipeline on this machine (no AWS account, no Docker, no GPU)")
        say(f"trainer: {trainer.framework} ({trainer.reason})")
        backend = runtime.stack.parameters[SERVING_BACKEND_PARAMETER]
        say(f"serving: {SERVING_BACKEND_PARAMETER}={backend}" + ("" if args.serving_backend else
            f" (the template's default; --serving-backend picks one of {', '.join(SERVING_SERVERS)})"))
        if trainer.stack_parameters.get("PretrainedWeightsKey") == "none":
            say("weights: PretrainedWeightsKey=none, the CPU profile trains from scratch (a deployed stack fine-tunes "
                "from a model-zoo checkpoint: d2ops weights upload --help)")
        with runtime as rt:
            stages["start runtime"] = round(time.monotonic() - t0, 1)
            for message in rt.messages:
                say(f"note: {message}")
            say(f"local AWS: moto {rt.moto_url}, Step Functions/SageMaker {rt.gateway.url}, "
                f"status API {rt.status_api.url}")
            min_compared = int(rt.stack.parameters["MinComparedImages"])
            val_images = max(1, round(args.images * VAL_FRACTION))
            if args.twice and val_images < min_compared:
                raise UsageError(f"--twice: --images {args.images} gives {val_images} val images, fewer than the "
                                 f"stack's MinComparedImages ({min_compared}), so the third version could not be "
                                 f"approved; use --images {4 * min_compared} or more")
            # The gate is the stack's (MinMap, MaxRegression, MinComparedImages): a manifest may only tighten
            # it, so the champion/challenger story is told by training effort, far above run-to-run noise.
            versions: list[tuple[str, int, int]] = [("v1", 1, args.max_iter)]
            expected = {"v1": "SUCCEEDED", "v2": "FAILED", "v3": "SUCCEEDED"}
            if args.twice:
                versions += [("v2", 2, max(1, args.max_iter // 3)), ("v3", 3, 2 * args.max_iter)]
            if args.review:
                # Trained for twice v1's iterations, as --twice's promoted version: a refusal (which would skip
                # the review) is then implausible; the review is about the images it can be compared on.
                versions += [("v2", 2, 2 * args.max_iter)]
                expected["v2"] = "SUCCEEDED"
            evaluations: dict[str, dict[str, Any]] = {}
            for version, seed, max_iter in versions:
                reviewed = args.review and version == "v2"
                t = time.monotonic()
                dataset = make_dataset(work_dir / "datasets", version, args.images, args.size, seed, max_iter,
                                       trainer)
                borrowed = borrow_champion_images(dataset, work_dir / "datasets" / "shapes-v1",
                                                  keep=min(val_images // 2, min_compared - 1)) if reviewed else None
                stages[f"synth {version}"] = round(time.monotonic() - t, 1)
                say(f"\n== dataset shapes/{version}: {args.images} synthetic images at {args.size} px, "
                    f"{max_iter} training iterations of {trainer.framework} ==")
                if borrowed:
                    say(f"its val file: {borrowed['own']} new images and {borrowed['borrowed']} of shapes/v1's train "
                        "images (the same bytes: the champion trained on them), so fewer than MinComparedImages "
                        f"({min_compared}) held-out images remain to compare the models on")
                watch = ReviewWatch(rt, approve=reviewed, attended=args.keep_state)
                t = time.monotonic()
                summary = run_pipeline(rt, dataset, deliveries=args.deliveries, out=say, tick=watch)
                stages[f"pipeline {version}"] = round(time.monotonic() - t, 1)
                distinct = {r.get("run_id") for r in summary.trigger_results}
                say(f"{len(summary.trigger_results)} event deliveries -> {len(distinct)} run: {summary.run_id}")
                t = time.monotonic()
                shown = show_run(rt, summary, dataset)
                stages[f"report {version}"] = round(time.monotonic() - t, 1)
                endpoint = rt.sagemaker.endpoint_api.describe_endpoint({"EndpointName": rt.stack.endpoint_name}) \
                    if summary.status == "SUCCEEDED" else None
                evaluation = evaluations[version] = dict(shown["run"].get("evaluation") or {})
                runs.append({**summary.to_json(), "deployment": (shown["run"].get("endpoint") or {}).get("mode"),
                             "endpoint_config": endpoint["EndpointConfigName"] if endpoint else None,
                             "prediction": shown.get("prediction", {}).get("answer"), "max_iter": max_iter,
                             "images_compared": evaluation.get("images_compared")})
                if reviewed:
                    review = review_record(summary, watch, evaluation)
                if reviewed and watch.request is None:
                    ok = False
                    say(f"\nthe gate did not ask for a review: it decided {evaluation.get('decision')} "
                        f"({evaluation.get('refused_by') or ''}: {evaluation.get('gate_reason')}); this demo "
                        f"expected a review (fewer than {min_compared} held-out images compared)")
                    break
                if summary.status != expected[version] or (version == "v2" and args.twice
                                                           and summary.error != "QualityGateFailed"):
                    ok = False
                    say(f"\nthe run ended {summary.status} ({summary.error}: {summary.cause}); "
                        f"see `d2ops status {summary.run_id}`")
                    break
                if version == "v2" and args.twice:
                    ok = show_refusal(rt, runs[0], runs[1], dataset) and ok
            if args.twice and len(runs) == 3:
                ok = show_promotion(runs[0], runs[2], evaluations["v3"]) and ok
            if args.review and len(runs) == 2 and review is not None:
                ok = show_review(runs[0], runs[1], review) and ok
            if args.loop and ok and len(runs) == 1:
                loop = close_the_loop(rt, args, work_dir, runs[0], say, stages,
                                      lambda dataset: next_version_run(rt, dataset, runs))
                ok = loop.ok and ok
            t = time.monotonic()
        stages["stop runtime"] = round(time.monotonic() - t, 1)
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc
    stages["total"] = round(time.monotonic() - t0, 1)
    say(f"\nstage durations: {', '.join(f'{k} {v}s' for k, v in stages.items())}")
    if runs:
        say(f"look again: d2ops status {runs[-1]['run_id']}  |  picture: d2ops graph {runs[-1]['run_id']}")
    last = runs[-1] if runs else {}
    print(json.dumps({"run_id": last.get("run_id"), "status": last.get("status") if ok else "FAILED",
                      "framework": trainer.framework,
                      "state_durations": last.get("state_durations"), "gate": last.get("gate"),
                      "runs": [{k: v for k, v in r.items() if k != "prediction"} for r in runs], "stages": stages,
                      **({"review": review} if args.review else {}),
                      **({"loop": loop.to_json() if loop else None} if args.loop else {})}),
          flush=True)
    sys.stdout.flush()
    return 0 if ok and runs else 1
