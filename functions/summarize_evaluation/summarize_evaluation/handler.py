"""Step Functions task: evaluation.json -> the named numbers the quality gate compares."""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.typing import LambdaContext

from d2ops_core import pipeline_metrics as pm
from d2ops_core.lambda_task import task_handler
from summarize_evaluation.models import EvaluationSummary, SummarizeEvent
from summarize_evaluation.service import metric_decision, read_report, summarize

logger = Logger()
tracer = Tracer()


def record_metrics(summary: EvaluationSummary) -> None:
    """One gate decision and the challenger's AP (EMF; each its own document, as each has its own dimension)."""
    with single_metric(namespace=pm.NAMESPACE, name=pm.GATE_DECISIONS, unit=MetricUnit.Count, value=1) as metric:
        metric.add_dimension(name=pm.DECISION, value=metric_decision(summary))
    with single_metric(namespace=pm.NAMESPACE, name=pm.CHALLENGER_AP, unit=MetricUnit.NoUnit,
                       value=summary.challenger_value) as metric:
        metric.add_dimension(name=pm.PRIMARY_METRIC, value=summary.primary_metric)


@task_handler(SummarizeEvent, logger, tracer)
def handler(event: SummarizeEvent, context: LambdaContext) -> dict[str, Any]:
    summary = summarize(read_report(boto3.client("s3"), event.report_uri), event)
    logger.info("evaluation summary", extra=summary.model_dump(exclude={"challenger_metrics"}))
    record_metrics(summary)
    return summary.model_dump(mode="json")
