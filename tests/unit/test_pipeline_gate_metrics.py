"""The evaluation summary's CloudWatch metrics (gate decision, challenger AP) as EMF, and their agreement
with the ASL's "Quality gate" Choice state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from d2ops.asl.choice import evaluate_rule
from d2ops_core import pipeline_metrics as pm
from d2ops_core.documents.evaluation import EvaluationReport
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.emf import emf_metrics
from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation import handler as summarize_handler  # noqa: E402
from summarize_evaluation.models import SummarizeEvent  # noqa: E402
from summarize_evaluation.service import metric_decision, summarize  # noqa: E402

SUMMARIZE_EVENT = support.load_event("summarize_evaluation", "report")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    support.aws_env(monkeypatch)
    with mock_aws():
        yield


def _report(challenger: float, champion: float | None) -> dict[str, Any]:
    def scores(ap: float) -> dict[str, Any]:
        return {"metrics": {"bbox_AP": ap, "bbox_AP50": ap}, "per_class": {"square": {"bbox_AP": ap}}}

    report: dict[str, Any] = {"primary_metric": "bbox_AP", "val_images": 10, "challenger": scores(challenger),
                              "class_instances": {"square": 100}}
    if champion is not None:
        report["champion"] = scores(champion)
        report["comparison"] = support.point_comparison(report)
        report["held_out"] = support.held_out(report)
    return report


@pytest.mark.parametrize(("challenger", "champion", "decision"), [
    (0.5, None, "approved"), (0.2, None, "rejected"), (0.5, 0.6, "rejected"), (0.6, 0.55, "approved"),
    (0.6, 0.65, "review")])
def test_the_summary_reports_the_gate_decision_and_the_challenger_ap(
        aws: None, capsys: pytest.CaptureFixture[str], challenger: float, champion: float | None,
        decision: str) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
    key = SUMMARIZE_EVENT["report_uri"].removeprefix(f"s3://{support.ARTIFACTS_BUCKET}/")
    event = {**SUMMARIZE_EVENT, "gate": {**SUMMARIZE_EVENT["gate"], "min_map": 0.3, "max_regression": 0.01,
                                         "min_compared_images": 10}}
    report = _report(challenger, champion)
    if decision == "review":  # an interval from clearly worse to equal: it cannot show the challenger is within 0.01
        report["comparison"]["overall"].update(low=-0.09, high=-0.0, half_width=0.045)
    s3.put_object(Bucket=support.ARTIFACTS_BUCKET, Key=key, Body=json.dumps(report).encode())
    summarize_handler.handler(event, support.FakeLambdaContext())
    found = emf_metrics(capsys.readouterr().out)
    assert [(n, d[pm.DECISION], v) for n, d, v in found if n == pm.GATE_DECISIONS] == [(pm.GATE_DECISIONS, decision,
                                                                                        1.0)]
    assert [(d[pm.PRIMARY_METRIC], v) for n, d, v in found if n == pm.CHALLENGER_AP] == [("bbox_AP", challenger)]


_FRACTION = st.sampled_from([0.0, 0.29, 0.3, 0.31, 0.5, 0.59, 0.6, 1.0])
QUALITY_GATE = all_states(support.machine().definition)["Quality gate"]


_WIDTH = st.sampled_from([0.0, 0.005, 0.01, 0.02, 0.2])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(challenger=_FRACTION, min_map=_FRACTION, champion=st.none() | _FRACTION, width=_WIDTH,
       class_drop=st.sampled_from([0.0, 0.05, 0.3]))
def test_the_metric_s_decision_is_the_quality_gate_choice_state_s(challenger: float, min_map: float,
                                                                  champion: float | None, width: float,
                                                                  class_drop: float) -> None:
    """The label on GateDecisions must be what the ASL's "Quality gate" Choice decides on the same summary
    (the summary made by the Lambda's own rule from a report with an interval of the given width)."""
    report = _report(challenger, champion)
    if champion is not None:
        diff = challenger - champion
        report["comparison"]["overall"].update(low=diff - width, high=diff + width, half_width=width)
        square = report["comparison"]["per_class"]["square"]
        square.update(champion=min(1.0, challenger + class_drop), difference=-class_drop, low=-class_drop - width,
                      high=-class_drop + width, half_width=width)
    event = SummarizeEvent.model_validate({**SUMMARIZE_EVENT, "gate": {**SUMMARIZE_EVENT["gate"], "min_map": min_map}})
    summary = summarize(EvaluationReport.model_validate(report), event)
    gate = QUALITY_GATE
    document = {"evaluation": summary.model_dump(mode="json")}
    taken = next((rule["Next"] for rule in gate["Choices"] if evaluate_rule(rule, document, {})), gate["Default"])
    expected = {gate["Default"]: "approved", "Needs review": "review"}.get(taken, "rejected")
    assert metric_decision(summary) == expected
    # ...and the refusal its reason is written for is the branch the Choice takes.
    assert taken == {None: "Needs review" if summary.decision == "review" else gate["Default"],
                     "below_min_map": "Below quality threshold", "regressed": "Worse than champion",
                     "class_regressed": "Worse than champion on a class"}[summary.refused_by]
