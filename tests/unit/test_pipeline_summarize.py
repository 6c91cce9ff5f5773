"""The evaluation summary Lambda: named metrics for the quality gate, clear errors for bad reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation import handler as summarize_handler  # noqa: E402
from summarize_evaluation.service import EvaluationReportInvalid, EvaluationReportNotFound  # noqa: E402

EVENT = support.load_event("summarize_evaluation", "report")
KEY = EVENT["report_uri"].removeprefix(f"s3://{support.ARTIFACTS_BUCKET}/")


def scores(ap: float, **more: float) -> dict[str, Any]:
    return {"metrics": {"bbox_AP": ap, "bbox_AP50": min(1.0, ap + 0.2), "bbox_APs": -1.0, **more},
            "per_class": {"square": {"bbox_AP": ap}}}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    support.aws_env(monkeypatch)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=support.ARTIFACTS_BUCKET)
        yield client


def summarize(s3: Any, report: dict[str, Any] | bytes, **gate: float | str) -> dict[str, Any]:
    body = report if isinstance(report, bytes) else json.dumps(report).encode()
    s3.put_object(Bucket=support.ARTIFACTS_BUCKET, Key=KEY, Body=body)
    if isinstance(report, dict) and report.get("primary_metric") in {"bbox_AP", "segm_AP"}:
        gate.setdefault("primary_metric", report["primary_metric"])  # the plan of a run of that task
    event = {**EVENT, "gate": {**EVENT["gate"], **gate}}
    return dict(summarize_handler.handler(event, support.FakeLambdaContext()))


def test_a_first_model_is_compared_with_the_threshold_only(s3: Any) -> None:
    report = {"primary_metric": "bbox_AP", "val_images": 12, "challenger": scores(0.42), "champion": None}
    summary = summarize(s3, report)
    assert summary["primary_metric"] == "bbox_AP" and summary["challenger_value"] == 0.42
    assert summary["has_champion"] is False and summary["champion_value"] is None and summary["champion_floor"] == 0.0
    assert (summary["min_map"], summary["max_regression"]) == (0.3, 0.01)
    assert summary["report_uri"] == EVENT["report_uri"]


def test_the_champion_floor_is_exact_for_decimal_thresholds(s3: Any) -> None:
    report = {"primary_metric": "bbox_AP", "val_images": 12, "challenger": scores(0.49), "champion": scores(0.5)}
    summary = summarize(s3, report)
    assert summary["champion_floor"] == 0.49  # 0.5 - 0.01 without the float residue that would fail the gate
    assert summary["challenger_value"] >= summary["champion_floor"]


def test_the_primary_metric_is_read_by_name(s3: Any) -> None:
    report = {"primary_metric": "segm_AP", "val_images": 5,
              "challenger": {"metrics": {"bbox_AP": 0.9, "segm_AP": 0.35}},
              "champion": {"metrics": {"segm_AP": 0.4, "bbox_AP": 0.1}}}
    summary = summarize(s3, report, max_regression=0.1)
    assert (summary["challenger_value"], summary["champion_value"]) == (0.35, 0.4)
    assert summary["champion_floor"] == 0.3


def test_the_plan_s_metric_wins_over_the_report_s_primary_metric(s3: Any) -> None:
    """A segmentation run is gated on segm_AP even when the report calls bbox_AP primary."""
    report = {"primary_metric": "bbox_AP", "val_images": 5,
              "challenger": {"metrics": {"bbox_AP": 0.9, "segm_AP": 0.2}}, "champion": None}
    summary = summarize(s3, report, primary_metric="segm_AP")
    assert (summary["primary_metric"], summary["challenger_value"]) == ("segm_AP", 0.2)
    with pytest.raises(EvaluationReportInvalid, match="challenger has no 'segm_AP'"):
        summarize(s3, {**report, "challenger": scores(0.9)}, primary_metric="segm_AP")
    # Without a metric in the gate (older plans), the report's primary metric is used.
    legacy = {**EVENT, "gate": {"min_map": 0.3, "max_regression": 0.01}}
    assert summarize_handler.handler(legacy, support.FakeLambdaContext())["primary_metric"] == "bbox_AP"


@pytest.mark.parametrize(("report", "message"), [
    ({"primary_metric": "segm_AP", "val_images": 5, "challenger": scores(0.4)}, "challenger has no 'segm_AP'"),
    ({"primary_metric": "bbox_AP", "val_images": 5, "challenger": scores(42.0)}, "not a fraction"),
    ({"primary_metric": "bbox_AP", "val_images": 5, "challenger": scores(0.4), "champion": {"metrics": {}}},
     "champion has no 'bbox_AP'"),
    ({"primary_metric": "mAP", "val_images": 5, "challenger": scores(0.4)}, "primary_metric"),
    (b"{not json", "Invalid JSON"),
])
def test_malformed_reports_raise_evaluation_report_invalid(s3: Any, report: Any, message: str) -> None:
    with pytest.raises(EvaluationReportInvalid, match=message):
        summarize(s3, report)


def test_a_missing_report_raises_evaluation_report_not_found(s3: Any) -> None:
    with pytest.raises(EvaluationReportNotFound, match="does not exist"):
        summarize_handler.handler(EVENT, support.FakeLambdaContext())
