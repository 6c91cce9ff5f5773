"""The stack's CloudWatch dashboard body, built from the metric names' homes.

``python -m d2ops.dashboard`` prints the body that template.yaml's ``PipelineDashboard`` holds
(a ``!Sub`` string: ``${AWS::Region}``, ``${PipelineStateMachine}`` and the endpoint name, as
the template's ``EndpointName`` output spells it, are filled in by CloudFormation); a test keeps
the two equal, so a metric renamed in d2ops_core.pipeline_metrics or d2ops_core.metrics cannot leave a
widget plotting nothing.
"""

from __future__ import annotations

import json
from typing import Any

from d2ops_core import metrics as training_metrics
from d2ops_core import pipeline_metrics as pm

REGION = "${AWS::Region}"
VARIANT = "AllTraffic"
STATE_MACHINE = "${PipelineStateMachine}"
# Where SageMaker puts the metrics its MetricDefinitions scrape from training logs (per "Host").
TRAINING_NAMESPACE = "/aws/sagemaker/TrainingJobs"
WIDTH = 8
HEIGHT = 6


def _pipeline(name: str, *dimension: str, **options: Any) -> list[Any]:
    return [pm.NAMESPACE, name, *dimension, pm.SERVICE_DIMENSION, pm.NAMESPACE, *([options] if options else [])]


def _search(namespace: str, dimensions: str, metric: str, stat: str, ident: str, period: int = 300) -> list[Any]:
    """A metrics row holding a SEARCH expression: every series of ``metric`` (all error codes, all jobs)."""
    expression = f"SEARCH('{{{namespace},{dimensions}}} MetricName=\"{metric}\"', '{stat}', {period})"
    return [{"expression": expression, "id": ident, "label": metric}]


def _widget(title: str, metric_rows: list[list[Any]], x: int, y: int, stat: str = "Sum", period: int = 300,
            **extra: Any) -> dict[str, Any]:
    return {"type": "metric", "x": x, "y": y, "width": WIDTH, "height": HEIGHT,
            "properties": {"title": title, "region": REGION, "view": "timeSeries", "stat": stat, "period": period,
                           "metrics": metric_rows, **extra}}


def widgets(endpoint: str) -> list[dict[str, Any]]:
    """``endpoint``: the endpoint's name as a ``!Sub`` string (the template's EndpointName output)."""

    def _endpoint(name: str, **options: Any) -> list[Any]:
        return ["AWS/SageMaker", name, "EndpointName", endpoint, "VariantName", VARIANT,
                *([options] if options else [])]

    states = [["AWS/States", name, "StateMachineArn", STATE_MACHINE]
              for name in ("ExecutionsSucceeded", "ExecutionsFailed", "ExecutionsTimedOut")]
    gate = [_pipeline(pm.GATE_DECISIONS, pm.DECISION, decision, label=decision) for decision in pm.DECISIONS]
    ap = [_pipeline(pm.CHALLENGER_AP, pm.PRIMARY_METRIC, metric, label=metric)
          for metric in training_metrics.PRIMARY_METRIC_BY_TASK.values()]
    val_ap = [f"val:{metric}" for metric in training_metrics.PRIMARY_METRIC_BY_TASK.values()]
    return [
        _widget("Runs started, duplicate S3 deliveries, outcomes",
                [_pipeline(pm.RUNS_STARTED), _pipeline(pm.DUPLICATE_DELIVERIES), *states], 0, 0),
        _widget("Datasets validated and rejected",
                [_pipeline(pm.DATASETS_VALIDATED), _pipeline(pm.DATASETS_REJECTED),
                 _pipeline(pm.IMAGES_VALIDATED, yAxis="right"), _pipeline(pm.INSTANCES_VALIDATED, yAxis="right")],
                WIDTH, 0),
        _widget("Dataset errors by code",
                [_search(pm.NAMESPACE, f"{pm.ERROR_CODE},{pm.SERVICE_DIMENSION}", pm.DATASET_ERRORS, "Sum", "codes")],
                2 * WIDTH, 0),
        _widget("Quality gate decisions", gate, 0, HEIGHT),
        _widget("Challenger AP (primary metric)", ap, WIDTH, HEIGHT, stat="Maximum",
                yAxis={"left": {"min": 0, "max": 1}}),
        _widget("Training loss (per job and host)",
                [_search(TRAINING_NAMESPACE, "Host", "train:loss", "Average", "loss", 60)], 2 * WIDTH, HEIGHT,
                stat="Average", period=60),
        _widget("Validation AP during training",
                [_search(TRAINING_NAMESPACE, "Host", name, "Maximum", f"ap{i}", 60) for i, name in enumerate(val_ap)],
                0, 2 * HEIGHT, stat="Maximum", period=60, yAxis={"left": {"min": 0, "max": 1}}),
        _widget("Endpoint model latency (microseconds)",
                [_endpoint("ModelLatency", stat="p50", label="p50"), _endpoint("ModelLatency", stat="p90", label="p90"),
                 _endpoint("OverheadLatency", stat="p90", label="overhead p90")], WIDTH, 2 * HEIGHT, stat="p90",
                period=60),
        _widget("Endpoint invocations and errors",
                [_endpoint("Invocations"), _endpoint("Invocation4XXErrors"), _endpoint("Invocation5XXErrors")],
                2 * WIDTH, 2 * HEIGHT, period=60),
    ]


def dashboard_body(endpoint: str) -> str:
    """The DashboardBody text: one widget per line, so a diff of the template shows which one changed."""
    rows = ",\n".join("  " + json.dumps(w, separators=(",", ":")) for w in widgets(endpoint))
    return "{\"widgets\": [\n" + rows + "\n]}\n"


def endpoint_expression(template: Any) -> str:
    """The template's EndpointName output as a ``!Sub`` string: ``${Resource.Attribute}`` where the output is a
    ``!GetAtt`` (of the parameter the endpoint's name has its home in), its own string where it is a ``!Sub``."""
    value = template.document["Outputs"]["EndpointName"]["Value"]
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        target = value["Fn::GetAtt"]
        return "${" + (target if isinstance(target, str) else ".".join(target)) + "}"
    return str(value["Fn::Sub"] if isinstance(value, dict) else value)


if __name__ == "__main__":
    from d2ops.template import load_template

    print(dashboard_body(endpoint_expression(load_template())), end="")
