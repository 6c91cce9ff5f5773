"""template.yaml's CloudWatch dashboard against the metric names' homes (d2ops_core's pipeline_metrics, metrics)."""

from __future__ import annotations

import json
import re
from typing import Any

from d2ops import dashboard
from d2ops.template import load_template
from d2ops_core import metrics as training_metrics
from d2ops_core import pipeline_metrics as pm

TEMPLATE = load_template()
PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


def _body_text() -> str:
    properties = TEMPLATE.resource("PipelineDashboard")["Properties"]
    return str(properties["DashboardBody"]["Fn::Sub"])


def _metric_names(body: dict[str, Any]) -> dict[str, set[str]]:
    """namespace -> metric names the widgets plot (rows and SEARCH expressions)."""
    found: dict[str, set[str]] = {}
    for widget in body["widgets"]:
        for row in widget["properties"]["metrics"]:
            if isinstance(row[0], dict):
                match = re.search(r"SEARCH\('\{([^,}]+)[^}]*\} MetricName=\"([^\"]+)\"", row[0]["expression"])
                assert match, row
                found.setdefault(match[1], set()).add(match[2])
            else:
                found.setdefault(row[0], set()).add(row[1])
    return found


def test_the_template_holds_the_generated_body() -> None:
    assert _body_text() == dashboard.dashboard_body(dashboard.endpoint_expression(TEMPLATE)), (
        "template.yaml's PipelineDashboard is stale: paste `python -m d2ops.dashboard` into its DashboardBody")


def test_every_pipeline_and_training_metric_the_dashboard_plots_is_defined_in_one_place() -> None:
    text = _body_text()
    known = {"AWS::Region", "AWS::StackName", *TEMPLATE.resources, *TEMPLATE.parameters()}
    # CloudFormation can fill in every ${...}: a parameter, a resource, or a resource's attribute
    assert {p.partition(".")[0] for p in PLACEHOLDER.findall(text)} <= known
    body = json.loads(text)  # ${...} sit inside JSON strings: the body is JSON before substitution too
    names = _metric_names(body)
    assert names[pm.NAMESPACE] == set(pm.PIPELINE_METRICS)  # every pipeline metric, nothing else
    training = names[dashboard.TRAINING_NAMESPACE]
    assert "train:loss" in training and training <= set(training_metrics.METRIC_NAMES)
    assert {f"val:{m}" for m in training_metrics.PRIMARY_METRIC_BY_TASK.values()} <= training
    assert {"ModelLatency", "Invocation4XXErrors", "Invocation5XXErrors"} <= names["AWS/SageMaker"]
    assert {"ExecutionsFailed", "ExecutionsSucceeded"} <= names["AWS/States"]


def test_the_functions_namespace_setting_is_the_metrics_namespace() -> None:
    variables = TEMPLATE.document["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == pm.NAMESPACE


def test_the_dashboard_plots_the_endpoint_the_pipeline_deploys() -> None:
    endpoint = dashboard.endpoint_expression(TEMPLATE)  # the EndpointName output, e.g. ${...}-detector
    rows = [row for widget in json.loads(_body_text())["widgets"] for row in widget["properties"]["metrics"]
            if row[0] == "AWS/SageMaker"]
    assert rows and {row[row.index("EndpointName") + 1] for row in rows} == {endpoint}
    assert {row[row.index("VariantName") + 1] for row in rows} == {"AllTraffic"}
