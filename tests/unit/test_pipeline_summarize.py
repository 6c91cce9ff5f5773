"""The evaluation summary Lambda: named metrics for the quality gate, clear errors for bad reports."""

from __future__ import annotations

import json
import re
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
    if isinstance(report, dict) and "class_instances" not in report:  # every class plenty of instances
        classes = {c for who in ("challenger", "champion") for c in (report.get(who) or {}).get("per_class", {})}
        report = {**report, "class_instances": dict.fromkeys(sorted(classes), 100)}
    if isinstance(report, dict) and isinstance(report.get("champion"), dict) and "comparison" not in report:
        report = {**report, "comparison": support.point_comparison(report), "held_out": support.held_out(report)}
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
    ({"primary_metric": "bbox_AP", "val_images": 5, "class_instances": {}, "challenger": scores(0.4)},
     "challenger.per_class names classes missing from class_instances: \\['square'\\]"),
    (json.dumps({"primary_metric": "bbox_AP", "val_images": 5, "challenger": {"metrics": {"bbox_AP": 0.4}}}).encode(),
     "class_instances: Field required"),
    ({"primary_metric": "bbox_AP", "val_images": 5, "class_instances": {"disc": 50},
      "challenger": {"metrics": {"bbox_AP": 0.4}, "per_class": {"disc": {"bbox_AP": 0.1}}},
      "champion": {"metrics": {"bbox_AP": 0.4}, "per_class": {"disc": {"bbox_AP": 7.0}}}},
     r"classes\.disc\.champion: Input should be less than or equal to 1"),
])
def test_malformed_reports_raise_evaluation_report_invalid(s3: Any, report: Any, message: str) -> None:
    with pytest.raises(EvaluationReportInvalid, match=message):
        summarize(s3, report)


def test_a_missing_report_raises_evaluation_report_not_found(s3: Any) -> None:
    with pytest.raises(EvaluationReportNotFound, match="does not exist"):
        summarize_handler.handler(EVENT, support.FakeLambdaContext())


def per_class_report(challenger: dict[str, float], champion: dict[str, float] | None,
                     instances: dict[str, int]) -> dict[str, Any]:
    def side(aps: dict[str, float]) -> dict[str, Any]:
        return {"metrics": {"bbox_AP": 0.6}, "per_class": {c: {"bbox_AP": ap} for c, ap in aps.items()}}
    report = {"primary_metric": "bbox_AP", "val_images": 40, "class_instances": instances,
              "challenger": side(challenger), "champion": side(champion) if champion is not None else None}
    return ({**report, "comparison": support.point_comparison(report), "held_out": support.held_out(report)}
            if champion is not None else report)


def test_a_class_that_regressed_beyond_the_margin_is_named_with_both_aps_and_its_count(s3: Any) -> None:
    report = per_class_report({"square": 0.9, "disc": 0.44, "star": 0.0, "tiny": 0.1},
                              {"square": 0.8, "disc": 0.6, "star": 0.7, "tiny": 0.9},
                              {"square": 50, "disc": 31, "star": 40, "tiny": 29})
    summary = summarize(s3, report, max_class_regression=0.15, min_class_instances=30)
    # star drops 0.7, disc 0.16 (> 0.15); tiny drops 0.8 but has 29 < 30 instances; square improved.
    assert summary["class_regressed"] is True and summary["class_regression_count"] == 2
    assert [{k: v for k, v in r.items() if k != "interval"} for r in summary["class_regressions"]] == [
        {"class_name": "star", "metric": "bbox_AP", "challenger_ap": 0.0, "champion_ap": 0.7, "drop": 0.7,
         "instances": 40},
        {"class_name": "disc", "metric": "bbox_AP", "challenger_ap": 0.44, "champion_ap": 0.6, "drop": 0.16,
         "instances": 31}]
    assert {k: summary["class_regressions"][1]["interval"][k] for k in report["comparison"]["per_class"]["disc"]} \
        == report["comparison"]["per_class"]["disc"]
    assert summary["class_gate_reason"] == (
        "challenger bbox_AP trails the champion by more than 0.15 on 2 classes (challenger vs champion): "
        "star 0.000 vs 0.700, difference -0.700, 95% interval [-0.700, -0.700] (40 instances); "
        "disc 0.440 vs 0.600, difference -0.160, 95% interval [-0.160, -0.160] (31 instances)")


def test_the_per_class_margin_is_exact_for_decimal_values(s3: Any) -> None:
    # 0.6 - 0.5 is 0.09999999999999998 in floats: exactly the margin, so not a regression.
    report = per_class_report({"disc": 0.5}, {"disc": 0.6}, {"disc": 100})
    summary = summarize(s3, report, max_class_regression=0.1, min_class_instances=1)
    assert summary["class_regressed"] is False and summary["class_gate_reason"] == ""
    assert summarize(s3, report, max_class_regression=0.09, min_class_instances=1)["class_regressed"] is True


def test_a_class_the_challenger_has_no_ap_for_counts_as_zero(s3: Any) -> None:
    report = per_class_report({"square": 0.9}, {"square": 0.9, "disc": 0.5}, {"square": 50, "disc": 50})
    (regression,) = summarize(s3, report, max_class_regression=0.1, min_class_instances=1)["class_regressions"]
    assert (regression["class_name"], regression["challenger_ap"], regression["drop"]) == ("disc", 0.0, 0.5)


def test_no_champion_or_no_per_class_thresholds_judges_no_class(s3: Any) -> None:
    first = per_class_report({"disc": 0.0}, None, {"disc": 50})
    assert summarize(s3, first, max_class_regression=0.0, min_class_instances=1)["class_regressed"] is False
    # A plan from before the per-class gate (no thresholds in $.plan.gate) is judged as it was then.
    older = per_class_report({"disc": 0.0}, {"disc": 0.9}, {"disc": 50})
    s3.put_object(Bucket=support.ARTIFACTS_BUCKET, Key=KEY, Body=json.dumps(older).encode())
    legacy = summarize_handler.handler({**EVENT, "gate": {"min_map": 0.3, "max_regression": 0.01}},
                                       support.FakeLambdaContext())
    assert legacy["class_regressed"] is False and legacy["max_class_regression"] is None
    assert summarize(s3, older)["class_regressed"] is True  # the event's (a current plan's) thresholds judge it


def test_only_the_worst_ten_classes_travel_in_the_state_payload(s3: Any) -> None:
    names = [f"c{i:02d}" for i in range(25)]
    report = per_class_report(dict.fromkeys(names, 0.0), {n: 0.5 + i / 100 for i, n in enumerate(names)},
                              dict.fromkeys(names, 40))
    summary = summarize(s3, report, max_class_regression=0.1, min_class_instances=30)
    assert summary["class_regression_count"] == 25 and len(summary["class_regressions"]) == 10
    assert summary["class_regressions"][0]["class_name"] == "c24"  # worst first
    assert summary["class_gate_reason"].endswith("and 15 more")


def test_reasons_quote_numbers_as_people_read_them_and_the_document_keeps_them_exact(s3: Any) -> None:
    """Catches a reason made with a raw float (issue 23: 16-digit floats in the gate's reasons): the APs and the
    interval to three decimals, the thresholds as the operator set them, the summary's fields untouched."""
    challenger, champion = 0.1 + 0.2, 2 / 3  # 0.30000000000000004 and 0.6666666666666666
    report: dict[str, Any] = {
        "primary_metric": "bbox_AP", "val_images": 40, "class_instances": {"disc": 100},
        "challenger": {"metrics": {"bbox_AP": challenger}, "per_class": {"disc": {"bbox_AP": challenger}}},
        "champion": {"metrics": {"bbox_AP": champion}, "per_class": {"disc": {"bbox_AP": champion}}}}
    report["comparison"] = support.point_comparison(report)
    report["held_out"] = support.held_out(report)
    summary = summarize(s3, report, min_map=0.1 + 0.2, max_regression=0.1 + 0.05, max_class_regression=0.1 + 0.2,
                        min_class_instances=1)
    assert summary["challenger_value"] == challenger and summary["champion_value"] == champion  # exact values
    assert summary["min_map"] == 0.1 + 0.2 and summary["regressed"] is True
    for reason in (summary["gate_reason"], summary["class_gate_reason"]):
        assert reason and not re.search(r"\d\.\d{4,}", reason), reason
    assert summary["gate_reason"].startswith("challenger bbox_AP 0.300 vs champion 0.667: difference -0.367, ")
    assert summary["gate_reason"].endswith("by more than the tolerance 0.15")
    assert summary["class_gate_reason"].startswith("challenger bbox_AP trails the champion by more than 0.3 on 1 class")
    assert "disc 0.300 vs 0.667, difference -0.367" in summary["class_gate_reason"]
