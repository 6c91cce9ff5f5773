"""``d2ops demo``: the whole product offline, end to end, on a synthetic dataset.

Generates a dataset version, uploads it to the local S3 (manifest.json last), delivers the S3
"Object Created" event several times (one run starts), follows the run state by state, then
shows the status API's view of it (over HTTP), the evaluation, the gate decision and a real
prediction from the local endpoint. ``--twice`` then shows the quality gate at the stack's own
settings (MinMap, MaxRegression; no manifest loosens them): a second version trained for a
third of the iterations is refused with the champion still serving, a third trained for twice
as many is promoted blue/green. The last output line is one JSON object (run ids, statuses,
per-state durations, gate metrics).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from d2ops.commands.errors import UsageError
from d2ops.trainer_choice import FRAMEWORKS, TrainerChoice


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run the whole pipeline offline on a synthetic dataset")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"),
                   help="offline runtime state (default .d2ops; the demo starts it clean)")
    p.add_argument("--twice", action="store_true",
                   help="then a weaker version (refused by the gate) and a stronger one (promoted blue/green)")
    p.add_argument("--images", type=int, default=160, help="synthetic images per dataset version (default 160)")
    p.add_argument("--size", type=int, default=128, help="image side in pixels (default 128)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="training iterations (default: 250 for detectron2, 150 for torchvision)")
    p.add_argument("--deliveries", type=int, default=3,
                   help="deliver the upload event this many times, as at-least-once delivery may (default 3)")
    p.add_argument("--keep-state", action="store_true", help="keep the work dir's earlier runs and champion")
    p.add_argument("--framework", choices=FRAMEWORKS, default="auto",
                   help="trainer: detectron2 (production), torchvision, or auto (default): detectron2 where it "
                        "imports, torchvision otherwise")
    p.set_defaults(func=run)


def say(line: str = "") -> None:
    print(line, flush=True)


def make_dataset(root: Path, version: str, images: int, size: int, seed: int, max_iter: int,
                 trainer: TrainerChoice) -> Path:
    from d2ops import synth

    target = root / f"shapes-{version}"
    shutil.rmtree(target, ignore_errors=True)
    synth.generate(target, images=images, seed=seed, size=size, name="shapes", version=version)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["training"] = {**trainer.manifest_training, "max_iter": max_iter, "seed": seed}
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return target


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
    if summary.status == "SUCCEEDED":
        prediction = predict(rt, rt.stack.endpoint_name, dataset)
        say(f"\n== prediction from endpoint {rt.stack.endpoint_name} (InvokeEndpoint, "
            f"{prediction['latency_ms']} ms) ==")
        say(f"  image {prediction['image']}: ground truth {', '.join(prediction['truth'])}")
        for line in describe_detections(prediction["answer"]) or ["(no detection scored >= 0.5)"]:
            say(f"  detected {line}")
        result["prediction"] = prediction
    return result


def gate_line(run: dict[str, Any]) -> str:
    gate = run["gate"]
    champion = f"{gate['champion']:.4f}" if gate.get("champion") is not None else "none"
    interval = gate.get("interval")
    judged = (f", difference {interval['difference']:.4f} in [{interval['low']:.4f}, {interval['high']:.4f}] "
              f"({interval['confidence']:.0%})" if interval else "")
    return (f"{run['run_id']} ({run['max_iter']} iterations): {gate['primary_metric']} challenger "
            f"{gate['challenger']:.4f} vs champion {champion}{judged}; gate min_map {gate['min_map']}, "
            f"max_regression {gate['max_regression']} (the stack's) -> {str(gate['decision']).upper()}")


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


def show_promotion(champion: dict[str, Any], promoted: dict[str, Any]) -> bool:
    say(f"\n== quality gate promoted a stronger challenger ==\n  {gate_line(promoted)}")
    say(f"  blue/green: endpoint moved from {champion['endpoint_config']} to {promoted['endpoint_config']} "
        f"({promoted['deployment']})")
    return promoted["deployment"] == "update" and promoted["endpoint_config"] != champion["endpoint_config"]


def run(args: argparse.Namespace) -> int:
    from d2ops.offline.pipeline import run_pipeline
    from d2ops.offline.processes import RuntimeBusy, install_signal_handlers
    from d2ops.offline.runtime import OfflineRuntime
    from d2ops.trainer_choice import TrainerUnavailable, choose_trainer

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
    settings: dict[str, Any] = {"training_defaults": trainer.training_defaults, "parameters": trainer.stack_parameters,
                                "function_env": {"PrepareTrainingFunction": {"FRAMEWORK": trainer.framework}}}
    stages: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
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
        if trainer.stack_parameters.get("PretrainedWeightsKey") == "none":
            say("weights: PretrainedWeightsKey=none, the CPU profile trains from scratch (a deployed stack fine-tunes "
                "from a model-zoo checkpoint: d2ops weights upload --help)")
        with runtime as rt:
            stages["start runtime"] = round(time.monotonic() - t0, 1)
            for message in rt.messages:
                say(f"note: {message}")
            say(f"local AWS: moto {rt.moto_url}, Step Functions/SageMaker {rt.gateway.url}, "
                f"status API {rt.status_api.url}")
            # The gate is the stack's (MinMap, MaxRegression): a manifest may only tighten it, so the
            # champion/challenger story is told by training effort, far above run-to-run noise.
            versions: list[tuple[str, int, int]] = [("v1", 1, args.max_iter)]
            if args.twice:
                versions += [("v2", 2, max(1, args.max_iter // 3)), ("v3", 3, 2 * args.max_iter)]
            expected = {"v1": "SUCCEEDED", "v2": "FAILED", "v3": "SUCCEEDED"}
            for version, seed, max_iter in versions:
                t = time.monotonic()
                dataset = make_dataset(work_dir / "datasets", version, args.images, args.size, seed, max_iter,
                                       trainer)
                stages[f"synth {version}"] = round(time.monotonic() - t, 1)
                say(f"\n== dataset shapes/{version}: {args.images} synthetic images at {args.size} px, "
                    f"{max_iter} training iterations of {trainer.framework} ==")
                t = time.monotonic()
                summary = run_pipeline(rt, dataset, deliveries=args.deliveries, out=say)
                stages[f"pipeline {version}"] = round(time.monotonic() - t, 1)
                distinct = {r.get("run_id") for r in summary.trigger_results}
                say(f"{len(summary.trigger_results)} event deliveries -> {len(distinct)} run: {summary.run_id}")
                t = time.monotonic()
                shown = show_run(rt, summary, dataset)
                stages[f"report {version}"] = round(time.monotonic() - t, 1)
                endpoint = rt.sagemaker.endpoint_api.describe_endpoint({"EndpointName": rt.stack.endpoint_name}) \
                    if summary.status == "SUCCEEDED" else None
                runs.append({**summary.to_json(), "deployment": (shown["run"].get("endpoint") or {}).get("mode"),
                             "endpoint_config": endpoint["EndpointConfigName"] if endpoint else None,
                             "prediction": shown.get("prediction", {}).get("answer"), "max_iter": max_iter})
                if summary.status != expected[version] or (version == "v2" and summary.error != "QualityGateFailed"):
                    ok = False
                    say(f"\nthe run ended {summary.status} ({summary.error}); see `d2ops status {summary.run_id}`")
                    break
                if version == "v2":
                    ok = show_refusal(rt, runs[0], runs[1], dataset) and ok
            if args.twice and len(runs) == 3:
                ok = show_promotion(runs[0], runs[2]) and ok
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
                      "runs": [{k: v for k, v in r.items() if k != "prediction"} for r in runs], "stages": stages}),
          flush=True)
    sys.stdout.flush()
    return 0 if ok and runs else 1
