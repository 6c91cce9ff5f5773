"""The gate's rule on the interval, decided once by the summarize Lambda (on moto's S3) and taken by the
"Quality gate" Choice state (the ASL interpreter's own rule evaluation).

Each test names the product mutation it catches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from d2ops.asl.choice import evaluate_rule
from d2ops_core.documents.evaluation import DifferenceInterval
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation import handler as summarize_handler  # noqa: E402
from summarize_evaluation.service import EvaluationReportInvalid, beyond, more_val_images  # noqa: E402

EVENT = support.load_event("summarize_evaluation", "report")  # MinMap 0.3, MaxRegression 0.01, per class 0.1 / 30
KEY = EVENT["report_uri"].removeprefix(f"s3://{support.ARTIFACTS_BUCKET}/")
DEFINITION = support.machine().definition
QUALITY_GATE = all_states(DEFINITION)["Quality gate"]


def interval(challenger: float, champion: float, low: float, high: float, confidence: float = 0.95) -> dict[str, Any]:
    return {"challenger": challenger, "champion": champion, "difference": challenger - champion, "low": low,
            "high": high, "confidence": confidence, "half_width": (high - low) / 2}


def report(overall: dict[str, Any], per_class: dict[str, dict[str, Any]] | None = None,
           instances: dict[str, int] | None = None, val_images: int = 200) -> dict[str, Any]:
    per_class = per_class if per_class is not None else {"disc": interval(0.5, 0.5, -0.05, 0.05, 0.975),
                                                         "square": interval(0.6, 0.6, -0.05, 0.05, 0.975)}
    instances = instances or dict.fromkeys(per_class, 100)

    def side(who: str) -> dict[str, Any]:
        return {"metrics": {"bbox_AP": overall[who]},
                "per_class": {c: {"bbox_AP": i[who]} for c, i in per_class.items()}}
    return {"primary_metric": "bbox_AP", "val_images": val_images, "class_instances": instances,
            "challenger": side("challenger"), "champion": side("champion"),
            "comparison": {"metric": "bbox_AP", "val_images": val_images, "resamples": 1000, "seed": 0,
                           "confidence": 0.95, "overall": overall, "per_class": per_class}}


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Put a report in moto's S3, run the real handler on the sample event, return its summary."""
    support.aws_env(monkeypatch)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=support.ARTIFACTS_BUCKET)

        def run(document: dict[str, Any], **thresholds: Any) -> dict[str, Any]:
            s3.put_object(Bucket=support.ARTIFACTS_BUCKET, Key=KEY, Body=json.dumps(document).encode())
            event = {**EVENT, "gate": {**EVENT["gate"], **thresholds}}
            return dict(summarize_handler.handler(event, support.FakeLambdaContext()))
        yield run


def choice(summary: dict[str, Any]) -> str:
    """Where the ASL's "Quality gate" goes on this summary."""
    document = {"evaluation": summary}
    return next((r["Next"] for r in QUALITY_GATE["Choices"] if evaluate_rule(r, document, {})),
                QUALITY_GATE["Default"])


def test_a_regression_whose_whole_interval_is_beyond_the_tolerance_is_refused_quoting_it(gate: Any) -> None:
    """Mutation: judging the point estimate (-0.018 < -0.01 would refuse both this and the next case alike)."""
    summary = gate(report(interval(0.512, 0.530, -0.031, -0.011)))
    assert summary["regressed"] is True and choice(summary) == "Worse than champion"
    assert summary["gate_reason"] == ("challenger bbox_AP 0.512 vs champion 0.530: difference -0.018, 95% interval "
                                      "[-0.031, -0.011], beyond the tolerance 0.01")


def test_the_same_drop_with_an_interval_reaching_the_tolerance_is_approved(gate: Any) -> None:
    """Mutation: low instead of high (low -0.031 is beyond the tolerance; the best case, -0.006, is not)."""
    summary = gate(report(interval(0.512, 0.530, -0.031, -0.006)))
    assert summary["regressed"] is False and choice(summary) == "Quality gate passed"
    assert "no significant regression beyond the tolerance 0.01" in summary["gate_reason"]
    assert "95% interval [-0.031, -0.006]" in summary["gate_reason"]


def test_an_upper_end_exactly_at_the_tolerance_is_not_a_significant_regression(gate: Any) -> None:
    """Mutation: '<=' for '<' (and no rounding: -0.5 + 0.49 is -0.010000000000000009 in floats)."""
    exact = DifferenceInterval.model_validate(interval(0.49, 0.5, -0.02, 0.49 - 0.5))
    assert beyond(exact, 0.01) is False
    assert beyond(exact.model_copy(update={"high": -0.0101}), 0.01) is True
    assert gate(report(interval(0.49, 0.5, -0.02, 0.49 - 0.5)))["regressed"] is False


def test_the_tolerance_is_subtracted_not_added(gate: Any) -> None:
    """Mutation: high < +tolerance (would refuse a challenger whose interval is [-0.004, 0.005])."""
    summary = gate(report(interval(0.5, 0.5, -0.004, 0.005)))
    assert summary["regressed"] is False and summary["more_val_images"] is None  # half-width 0.0045 <= 0.01


def test_the_floor_stays_on_the_challenger_s_point_ap(gate: Any) -> None:
    """MinMap is judged on the point AP, first; the reason still quotes the interval."""
    summary = gate(report(interval(0.29, 0.2, 0.05, 0.13)))
    assert summary["below_min_map"] is True and choice(summary) == "Below quality threshold"
    assert summary["gate_reason"].startswith("challenger bbox_AP 0.290 is below the threshold 0.3; vs champion 0.200")


def test_more_val_images_follows_the_square_root_law() -> None:
    """Mutation: the ratio not squared, or the images already there counted as more."""
    wide = DifferenceInterval.model_validate(interval(0.5, 0.5, -0.02, 0.02))  # half-width 0.02 = 2 x tolerance
    assert more_val_images(wide, 40, 0.01) == 120  # 4 x 40 in all, 120 more
    assert more_val_images(wide, 40, 0.02) is None and more_val_images(wide, 40, 0.0) is None
    odd = DifferenceInterval.model_validate(interval(0.5, 0.5, -0.013, 0.013))
    assert more_val_images(odd, 333, 0.01) == math.ceil(333 * 1.3 ** 2) - 333


def test_no_more_images_are_asked_for_a_settled_decision() -> None:
    """Mutation: the count asked for whenever the interval is wide, though more images could not change the
    decision (a challenger better beyond doubt, or refused beyond doubt)."""
    better = DifferenceInterval.model_validate(interval(0.6, 0.5, 0.03, 0.12))  # half-width 0.045, above -0.01
    refused = DifferenceInterval.model_validate(interval(0.4, 0.5, -0.16, -0.04))  # wholly below -0.01
    straddling = DifferenceInterval.model_validate(interval(0.5, 0.5, -0.05, 0.04))
    assert more_val_images(better, 40, 0.01) is None and more_val_images(refused, 40, 0.01) is None
    assert more_val_images(straddling, 40, 0.01) == math.ceil(40 * 4.5 ** 2) - 40


def test_the_summary_says_how_many_more_images_an_undecided_interval_needs(gate: Any) -> None:
    summary = gate(report(interval(0.5, 0.52, -0.05, 0.01), val_images=40))
    assert summary["regressed"] is False and summary["more_val_images"] == 320  # (0.03 / 0.01)^2 x 40 - 40
    assert summary["gate_reason"].endswith("about 320 more val images (40 now) would narrow it to \u00b10.01")
    assert summary["interval"]["half_width"] == pytest.approx(0.03) and summary["val_images"] == 40


def test_a_class_is_refused_on_its_own_bonferroni_interval(gate: Any) -> None:
    """Mutation: per-class rule judged on the overall interval, or on the class's point drop alone."""
    per_class = {"disc": interval(0.40, 0.60, -0.31, -0.12, 0.975),  # beyond 0.1 even at its best
                 "square": interval(0.45, 0.60, -0.30, -0.01, 0.975),  # point drop 0.15 > 0.1, not significant
                 "tiny": interval(0.0, 0.9, -0.95, -0.85, 0.975)}  # 12 instances: not judged
    summary = gate(report(interval(0.55, 0.56, -0.02, 0.0), per_class, {"disc": 40, "square": 40, "tiny": 12}))
    assert summary["regressed"] is False and summary["class_regressed"] is True
    assert [r["class_name"] for r in summary["class_regressions"]] == ["disc"]
    assert summary["class_regressions"][0]["interval"]["confidence"] == 0.975
    assert choice(summary) == "Worse than champion on a class"
    assert ("disc 0.400 vs 0.600, difference -0.200, 97.5% interval [-0.310, -0.120] (40 instances)"
            in summary["gate_reason"])


def test_a_judged_class_missing_from_the_comparison_is_an_invalid_report(gate: Any) -> None:
    """Mutation: a class the job left out (or a report edited to drop it) waved through."""
    document = report(interval(0.5, 0.5, -0.01, 0.01))
    del document["comparison"]["per_class"]["disc"]
    with pytest.raises(EvaluationReportInvalid, match=r"comparison\.per_class lacks 'disc'"):
        gate(document)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("comparison"), "comparison is required when there is a champion"),
    (lambda d: d["comparison"].update(metric="segm_AP"), "comparison is of segm_AP, the gate judges bbox_AP"),
    (lambda d: d["comparison"]["overall"].update(challenger=0.7), "comparison.overall.challenger 0.7 is not"),
])
def test_a_report_whose_interval_is_missing_or_of_something_else_is_invalid(gate: Any, change: Any,
                                                                           message: str) -> None:
    """Mutation: a champion without an interval judged on point estimates; an interval of another metric used."""
    document = report(interval(0.5, 0.5, -0.01, 0.01))
    change(document)
    with pytest.raises(EvaluationReportInvalid, match=message):
        gate(document)


def test_the_quality_gate_records_the_lambda_s_reason_through_the_interpreter() -> None:
    """The Choice and the verdict Pass states on the interpreter: $.gate.reason is the Lambda's gate_reason."""
    from d2ops.asl.mock import MockConfig, MockTestCase

    sm = support.machine()
    case = MockConfig.from_file(support.MOCK_CONFIG).test_case(sm.name, "GateFailedRegression")
    execution = sm.run(support.INPUT, mock=MockTestCase(case.state_machine, case.name, case.responses),
                       execution_name=support.RUN_ID, executors={"arn:aws:*": support._unexpected,
                                                                 "arn:aws:states:::lambda:invoke":
                                                                     support._describe_failure})
    assert execution.error == "QualityGateFailed"
    assert "95% interval [-0.034, -0.012], beyond the tolerance 0.01" in execution.cause
