"""``d2ops status [RUN_ID]``: the status API's view of the runs (or of one run).

Offline by default; ``--stack NAME`` reads a deployed stack's API (its ``StatusApiUrl`` output),
signing each request with the caller's AWS credentials (SigV4, like ``awscurl``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from d2ops.commands.errors import UsageError
from d2ops_core.gate import interval_line
from d2ops_core.stage_timeline import human_duration, line_title, summarise
from d2ops_core.training_progress import Progress, format_progress


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="show offline runs (GET /runs) or one run (GET /runs/{runId})")
    p.add_argument("run_id", metavar="RUN_ID", nargs="?")
    p.add_argument("--work-dir", type=Path, default=Path(".d2ops"), help="offline runtime state (default .d2ops)")
    p.add_argument("--json", action="store_true", help="print the status API's JSON answer")
    add_stack_arguments(p)
    p.set_defaults(func=run)


def add_stack_arguments(p: argparse.ArgumentParser) -> None:
    """``--stack`` (and where its credentials come from), shared with ``d2ops console``."""
    p.add_argument("--stack", metavar="NAME", help="a deployed d2ops stack: read its status API (signed with your AWS "
                                                   "credentials) instead of the offline runtime")
    p.add_argument("--profile", help="AWS profile for --stack (default: the usual AWS_PROFILE / credential chain)")
    p.add_argument("--region", help="AWS region of --stack (default: the profile's or AWS_REGION)")


class StatusApi(Protocol):
    def get(self, path: str) -> Any: ...

    def call(self, method: str, path: str, document: Any = None) -> Any: ...


@contextlib.contextmanager
def open_status_api(args: argparse.Namespace) -> Iterator[StatusApi]:
    """The status API the arguments name: a deployed stack's (``--stack``), or the offline runtime's.

    Errors the user can fix (no such stack, no credentials, the runtime busy) are UsageErrors.
    """
    if getattr(args, "stack", None):
        import boto3
        from botocore.exceptions import BotoCoreError

        from d2ops.sigv4 import StackError, for_stack

        try:
            session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
            api = for_stack(args.stack, session)
        except (StackError, BotoCoreError) as exc:
            raise UsageError(f"--stack {args.stack}: {exc}") from exc
        yield api
        return
    from d2ops.offline.client import connect
    from d2ops.offline.processes import RuntimeBusy

    try:
        with connect(args.work_dir) as apis:
            yield apis
    except RuntimeBusy as exc:
        raise UsageError(str(exc)) from exc


def format_training_progress(progress: dict[str, Any]) -> str:
    """The status API's TrainingProgress as the line ``d2ops demo`` / ``d2ops run`` print while training
    (d2ops_core.training_progress.format_progress), with the learning rate and when it was published."""
    line = format_progress("progress", Progress(
        iteration=progress["iteration"], total=progress.get("total_iterations"), loss=progress.get("loss"),
        images_per_second=progress.get("images_per_second"),
        # the API says the time left only while the job runs
        seconds_per_iteration=progress.get("seconds_per_iteration") if progress.get("seconds_left") else None))
    if progress.get("learning_rate") is not None:
        line += f"  lr {progress['learning_rate']:.3g}"
    return f"{line}  (as of {progress.get('updated_at')})"


def format_run(run: dict[str, Any]) -> list[str]:
    """A run as the status API returns it (GET /runs/{runId}) -> readable lines."""
    lines = [f"run {run['run_id']}: {run['status']}" + (f" ({run['error']})" if run.get("error") else "")]
    dataset = run.get("dataset") or {}
    if dataset:
        lines.append(f"  dataset   {dataset.get('name')} {dataset.get('version')} (s3://{dataset.get('bucket')}/"
                     f"{dataset.get('prefix')})")
    lines.append(f"  started   {run.get('started_at')}   stopped {run.get('stopped_at') or '-'}")
    if run.get("current_state"):
        lines.append(f"  now in    {run['current_state']}")
    validation = run.get("validation") or {}
    if validation:
        lines.append(f"  validation valid={validation.get('valid')} errors={validation.get('error_count')} "
                     f"warnings={validation.get('warning_count')} report={validation.get('report_uri')}")
        for err in validation.get("first_errors") or []:
            lines.append(f"    {err.get('code')}: {err.get('message')} ({err.get('location')})")
    training = run.get("training") or {}
    if training:
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted((training.get("metrics") or {}).items())
                            if not k.startswith("train:"))
        lines.append(f"  training  {training.get('job_name')} {training.get('status') or ''} {metrics}")
        if training.get("failure_reason"):
            lines.append(f"    failure: {training['failure_reason']}")
        if training.get("progress"):
            lines.append(f"    {format_training_progress(training['progress'])}")
    if run.get("dataset_diff"):
        lines.extend(f"  data      {line}" for line in _data_changes(run['dataset_diff']))
    evaluation = run.get("evaluation") or {}
    if evaluation:
        champion = evaluation.get("champion_value")
        lines.append(f"  evaluation {evaluation.get('primary_metric')}: challenger "
                     f"{evaluation.get('challenger_value'):.4f}" + (f", champion {champion:.4f}" if champion is not None
                                                                    else ", no champion yet"))
        interval = evaluation.get("interval")
        compared = evaluation.get("images_compared", evaluation.get("val_images"))
        if interval and compared:  # the paired bootstrap the gate judged, on the held-out images
            lines.append("    " + interval_line(
                str(evaluation.get("primary_metric")), interval["difference"], interval["low"], interval["high"],
                interval["confidence"], compared, evaluation.get("more_val_images"),
                evaluation.get("max_regression")))
        if evaluation.get("images_excluded"):
            lines.append(f"    {evaluation['images_excluded']} of {evaluation.get('val_images')} val images left "
                         "out: a model was trained on them")
        if evaluation.get("decision"):
            because = ", ".join(evaluation.get("review_because") or [])
            lines.append(f"    decision: {evaluation['decision']}" + (f" ({because})" if because else ""))
    gate = run.get("gate") or {}
    if gate:
        lines.append(f"  gate      {gate.get('decision')}: {gate.get('reason')}")
    lines += format_review(run.get("run_id"), run.get("review") or {})
    endpoint = run.get("endpoint") or {}
    if endpoint:
        lines.append(f"  endpoint  {endpoint.get('name') or ''} mode={endpoint.get('mode')} "
                     f"status={endpoint.get('status')} config={endpoint.get('endpoint_config')}")
    lines += format_cost(run.get("cost") or {})
    if run.get("cause") and run.get("status") != "SUCCEEDED":
        lines.append(f"  cause     {run['cause']}")
    lines.append("  timeline")
    lines += format_timeline(run.get("timeline") or [])
    return lines


def format_review(run_id: Any, review: dict[str, Any]) -> list[str]:
    """The status API's ``review`` (a run the gate sent to a person) -> lines: what it waits for and how to
    decide, or who decided what, why and when."""
    if not review:
        return []
    status = review.get("status")
    if status in ("approved", "rejected"):
        return [f"  review    {status} by {review.get('decided_by')} at {review.get('decided_at')}: "
                f"{review.get('reason')}"]
    if status == "waiting":
        return [f"  review    waiting since {review.get('requested_at')}; refused unless decided by "
                f"{review.get('expires_at')}",
                f"    decide: d2ops approve {run_id} [--reason TEXT]  |  d2ops reject {run_id} --reason TEXT"]
    if status == "requested":
        return ["  review    the gate asked for a person's review; the run is entering its wait"]
    return ["  review    not decided: the wait ended without a decision (timed out, or the run stopped)"]


def format_timeline(steps: list[dict[str, Any]]) -> list[str]:
    """The status API's per-visit timeline by stage (d2ops_core.stage_timeline): a wait loop on one line with
    its rounds and total time, an expected miss as ``missed`` with what it meant, not as ``failed``."""
    lines = []
    for stay in summarise(steps):
        lines.append(f"    {stay.stage.title:<16} {stay.status:<11} {human_duration(stay.seconds)}")
        for line in stay.lines:
            said = f"  {line.note}" if line.note else f"  [{line.error}]" if line.error else ""
            lines.append(f"      {line.status:<10} {line_title(line):<40} {human_duration(line.seconds):>7}{said}")
    return lines


def _data_changes(summary: Any) -> list[str]:
    """The dataset diff against the champion in one line (and where the whole diff is), and its warning."""
    from pydantic import ValidationError

    from d2ops_core.documents.dataset_diff import DatasetDiffSummary

    try:
        diff = DatasetDiffSummary.model_validate(summary)
    except ValidationError:
        return ["dataset diff unreadable in this answer"]
    warning = diff.warning()
    return [diff.line() + (f" ({diff.uri})" if diff.uri else "")] + ([f"WARNING: {warning}"] if warning else [])


def _usd(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:.4f}" if value < 1 else f"${value:.2f}"


def format_cost(cost: dict[str, Any]) -> list[str]:
    """The status API's ``cost`` (d2ops_core.cost.RunCost) -> readable lines; none when the run has no cost yet."""
    if not cost:
        return []
    lines = [f"  cost      {_usd(cost.get('total_usd'))} (SageMaker list prices of {cost.get('prices_as_of')}, "
             f"{cost.get('prices_region')})"]
    for part in ("training", "evaluation", "endpoint"):
        item = cost.get(part)
        if not item:
            continue
        line = (f"    {part:<10} {item['instance_count']} x {item['instance_type']} x "
                f"{human_duration(item['seconds'])} = {_usd(item.get('cost_usd'))}")
        if part == "training" and item.get("spot"):
            line += (f" (spot: {item.get('spot_savings_percent')}% saved, {_usd(item.get('spot_savings_usd'))} "
                     f"of {_usd(item.get('on_demand_cost_usd'))})")
        lines.append(line)
    if cost.get("unpriced"):
        lines.append(f"    no price for {', '.join(cost['unpriced'])} (set D2OPS_PRICE_TABLE)")
    return lines


def format_runs(listing: dict[str, Any]) -> list[str]:
    runs = listing.get("runs") or []
    if not runs:
        return ["no runs yet (start one with `d2ops run DATASET_DIR` or `d2ops demo`)"]
    lines = [f"{'RUN ID':<48} {'STATUS':<10} STARTED"]
    lines += [f"{r['run_id']:<48} {r['status']:<10} {r['started_at']}" for r in runs]
    return lines


def run(args: argparse.Namespace) -> int:
    from d2ops.sigv4 import StatusApiError

    where = f"stack {args.stack}" if args.stack else str(args.work_dir)
    with open_status_api(args) as api:
        try:
            answer = api.get(f"/runs/{args.run_id}" if args.run_id else "/runs?limit=100")
        except StatusApiError as err:
            if err.status == 404 and args.run_id:
                raise UsageError(f"no run {args.run_id!r} in {where} ({err.message})") from err
            raise UsageError(f"the status API of {where} answered {err}") from err
        except OSError as exc:  # unreachable URL, DNS, TLS: the stack's API cannot be reached from here
            raise UsageError(f"the status API of {where} cannot be reached: {exc}") from exc
    if args.json:
        print(json.dumps(answer))
        return 0
    print("\n".join(format_run(answer) if args.run_id else format_runs(answer)))
    return 0
