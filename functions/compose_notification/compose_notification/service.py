"""The run's notification subject and its cost, priced by the one cost module (d2ops_core.cost).

The notification must go out whatever happens here: an unreadable price table, an instance type the
table does not list, or a SageMaker describe that fails makes the cost unknown (saying why), never
the composition itself fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from compose_notification.models import Notification, NotificationEvent, NotificationFields
from d2ops_core import cost, gate, sagemaker_jobs
from d2ops_core.bounded_text import sns_subject
from d2ops_core.documents.dataset_diff import DatasetDiffSummary

# The Fail state's error when the gate refuses (statemachine/training_pipeline.asl.json).
QUALITY_GATE_FAILED = "QualityGateFailed"


def _describe(sagemaker: Any, kind: sagemaker_jobs.JobKind, name: str | None,
              problems: list[str]) -> dict[str, Any] | None:
    """The job's description; None when it was never created (nothing billed) or cannot be read (said why)."""
    if not name:
        return None
    try:
        return sagemaker_jobs.describe_job(sagemaker, kind, name)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "Error")
        problems.append(f"{kind} job {name} could not be described ({code})")
    except BotoCoreError as exc:
        problems.append(f"{kind} job {name} could not be described ({type(exc).__name__})")
    return None


def _usd(value: float | None) -> str:
    return "?" if value is None else f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def summary_line(run: cost.RunCost | None, unknown: str | None) -> str:
    if run is None:
        return f"cost unknown: {unknown}" if unknown else "no SageMaker job ran: nothing billed"
    parts = []
    if run.training is not None:
        spot = ""
        if run.training.spot and run.training.spot_savings_usd is not None:
            spot = f", spot saved {_usd(run.training.spot_savings_usd)} ({run.training.spot_savings_percent:g} %)"
        parts.append(f"training {_usd(run.training.cost_usd)}{spot}")
    if run.evaluation is not None:
        parts.append(f"evaluation {_usd(run.evaluation.cost_usd)}")
    if run.endpoint is not None:
        parts.append(f"endpoint {_usd(run.endpoint.cost_usd)} so far")
    line = f"{_usd(run.total_usd)} ({'; '.join(parts)}; {run.prices_region} prices of {run.prices_as_of})"
    return f"{line}; incomplete: {unknown}" if unknown else line


def subject_line(event: NotificationEvent, run: cost.RunCost | None, unknown: str | None) -> str:
    """ASCII, one line, fewer than 100 characters (SNS refuses anything else): dataset names may be neither."""
    ref = event.document.dataset
    dataset = f"{ref.name} {ref.version}" if ref is not None else "? ?"
    price = ("cost unknown" if unknown and (run is None or run.total_usd is None)
             else "nothing billed" if run is None else f"cost {_usd(run.total_usd)}")
    if event.outcome == "succeeded":
        text = f"d2ops: {dataset} deployed ({price})"
    else:
        error = event.document.failure.error if event.document.failure else "run failed"
        text = f"d2ops run failed: {error} ({dataset}, {price})"
    return sns_subject(text)


def compose(event: NotificationEvent, sagemaker: Any, env: Mapping[str, str] | None = None) -> Notification:
    document = event.document
    # A section the cost needs but could not read is part of why the cost is unknown.
    problems = [f"the run's {why}" for name, why in document.unreadable.items() if name in {"plan", "deployment"}]
    run: cost.RunCost | None = None
    try:
        table = cost.load_price_table(env)
    except cost.PriceTableError as exc:
        problems.append(str(exc))
    else:
        plan = document.plan
        names = plan.names if plan is not None else None
        training = _describe(sagemaker, "training", names.training_job if names else None, problems)
        evaluation = _describe(sagemaker, "processing", names.evaluation_job if names else None, problems)
        endpoint = None if plan is None else {"instance_type": plan.endpoint.instance_type,
                                              "instance_count": plan.endpoint.instance_count,
                                              "name": plan.names.endpoint_config}
        deployed_at = document.deployment.started_at if document.deployment else None
        run = cost.price_run(table, training, evaluation, endpoint, deployed_at, event.at)
        if run is not None and run.unpriced:
            problems.append(f"the price table ({table.region}, {table.as_of}) lists no price for "
                            f"{', '.join(run.unpriced)} (set {cost.PRICE_TABLE_ENV})")
    unknown = "; ".join(problems) or None
    diff = gate_refusal_diff(event)
    return Notification(subject=subject_line(event, run, unknown),
                        fields=NotificationFields(cost=run, cost_summary=summary_line(run, unknown),
                                                  cost_unknown=unknown,
                                                  data_changes=diff.line() if diff else None,
                                                  dataset_diff_uri=diff.uri if diff else None,
                                                  gate_comparison=gate_comparison(event),
                                                  review=review_line(event)))


def gate_comparison(event: NotificationEvent) -> str | None:
    """The gate's interval in one line (d2ops_core.gate.interval_line), when the run compared with a champion."""
    evaluation = event.document.evaluation
    if evaluation is None or evaluation.interval is None or evaluation.val_images is None:
        return None
    i = evaluation.interval
    return gate.interval_line(evaluation.primary_metric or "AP", i.difference, i.low, i.high, i.confidence,
                              evaluation.val_images, evaluation.more_val_images, evaluation.max_regression)


def review_line(event: NotificationEvent) -> str | None:
    """Who decided a model the gate sent to review, when and why; or, when nobody did, what ended the wait."""
    evaluation, gate = event.document.evaluation, event.document.gate
    if evaluation is None or (evaluation.model_extra or {}).get("decision") != "review" or gate is None:
        return None
    if gate.decided_by:
        return f"{gate.decision} by {gate.decided_by} at {gate.decided_at}: {gate.review_reason}"
    if gate.decision == "review":  # the run failed before the review ended (its request, say)
        return "waiting for a person's decision when the run failed: nobody decided"
    return gate.reason


def gate_refusal_diff(event: NotificationEvent) -> DatasetDiffSummary | None:
    """The run's dataset diff against the champion when the quality gate refused the model, else None."""
    document = event.document
    if event.outcome != "failed" or document.failure is None or document.failure.error != QUALITY_GATE_FAILED:
        return None
    return document.plan.dataset_diff if document.plan is not None else None
