"""The gate's three-way rule on the interval (approve, refuse, review), decided once by the summarize Lambda (on
moto's S3; d2ops_core.gate_decision.judge) and taken by the "Quality gate" Choice state (the ASL interpreter's
own rule evaluation).

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
from d2ops_core.pipeline_stages import all_states
from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation import handler as summarize_handler  # noqa: E402
from summarize_evaluation.service import EvaluationReportInvalid  # noqa: E402

from d2ops_core.gate import more_val_images, regression_beyond, within_tolerance  # noqa: E402

EVENT = support.load_event("summarize_evaluation", "report")  # MinMap 0.3, MaxRegression 0.01, per class 0.1 / 30
KEY = EVENT["report_uri"].removeprefix(f"s3://{support.ARTIFACTS_BUCKET}/")
DEFINITION = support.machine().definition
QUALITY_GATE = all_states(DEFINITION)["Quality gate"]


def interval(challenger: float, champion: float, low: float, high: float, confidence: float = 0.95) -> dict[str, Any]:
    return {"challenger": challenger, "champion": champion, "difference": challenger - champion, "low": low,
            "high": high, "confidence": confidence, "half_width": (high - low) / 2}


def report(overall: dict[str, Any], per_class: dict[str, dict[str, Any]] | None = None,
           instances: dict[str, int] | None = None, val_images: int = 200, *, compared: int | None = None,
           unverified: list[str] | None = None) -> dict[str, Any]:
    """A report whose every class (with ``instances``) is listed in ``classes``; ``per_class`` holds the judged."""
    per_class = per_class if per_class is not None else {"disc": interval(0.5, 0.5, -0.05, 0.05, 0.975),
                                                         "square": interval(0.6, 0.6, -0.05, 0.05, 0.975)}
    instances = instances or dict.fromkeys(per_class, 100)

    def side(who: str) -> dict[str, Any]:
        return {"metrics": {"bbox_AP": overall[who]},
                "per_class": {c: {"bbox_AP": i[who]} for c, i in per_class.items()}}
    classes = {c: {"challenger": i["challenger"], "champion": i["champion"], "difference": i["difference"],
                   "instances": instances[c], "images": instances[c]} for c, i in per_class.items()}
    judged = {c: i for c, i in per_class.items() if instances[c] >= 30}
    compared = val_images if compared is None else compared
    excluded = [{"reason": "champion_trained_on", "images": val_images - compared, "examples": ["a.jpg"]}] \
        if compared < val_images else []
    return {"primary_metric": "bbox_AP", "val_images": val_images, "class_instances": instances,
            "challenger": side("challenger"), "champion": side("champion"),
            "held_out": {"compared": compared, "excluded": excluded, "unverified": unverified or []},
            "comparison": {"metric": "bbox_AP", "val_images": compared, "resamples": 1000, "seed": 0,
                           "confidence": 0.95, "overall": overall, "per_class": judged, "classes": classes}}


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
    assert (summary["decision"], summary["refused_by"]) == ("refuse", "regressed")
    assert choice(summary) == "Worse than champion"
    assert summary["gate_reason"] == ("challenger bbox_AP 0.512 vs champion 0.530: difference -0.018, 95% interval "
                                      "[-0.031, -0.011] on 200 held-out val images: surely worse than the champion "
                                      "by more than the tolerance 0.01")


def test_an_interval_reaching_past_the_tolerance_is_left_to_a_person(gate: Any) -> None:
    """Mutation: the old rule (refuse only on the upper end, approve the rest): a wide interval always passed.
    The burden of proof is on the challenger: its worst case, -0.031, is beyond the tolerance."""
    summary = gate(report(interval(0.512, 0.530, -0.031, -0.006)))
    assert (summary["decision"], summary["refused_by"], summary["review_because"]) == ("review", None, ["uncertain"])
    assert summary["gate_reason"].startswith("needs a person's review: the interval's lower end -0.031 is below "
                                             "-0.01")
    assert "95% interval [-0.031, -0.006]" in summary["gate_reason"]


def test_an_interval_within_the_tolerance_is_approved(gate: Any) -> None:
    """Mutation: approving only challengers surely better than the champion (low >= 0), which no equal model is."""
    summary = gate(report(interval(0.525, 0.530, -0.009, 0.004)))
    assert (summary["decision"], summary["review_because"]) == ("approve", [])
    assert choice(summary) == "Quality gate passed"
    assert summary["gate_reason"].endswith("on 200 held-out val images, within the tolerance 0.01")


def test_the_ends_exactly_at_the_tolerance(gate: Any) -> None:
    """Mutations: '<=' for '<' in either rule, and no rounding (-0.5 + 0.49 is -0.010000000000000009 in floats):
    an upper end exactly at -tolerance is not surely worse; a lower end exactly there is within it."""
    assert regression_beyond(0.49 - 0.5, 0.01) is False and regression_beyond(-0.0101, 0.01) is True
    assert within_tolerance(0.49 - 0.5, 0.01) is True and within_tolerance(-0.0101, 0.01) is False
    assert gate(report(interval(0.49, 0.5, -0.02, 0.49 - 0.5)))["decision"] == "review"
    assert gate(report(interval(0.5, 0.5, 0.49 - 0.5, 0.01)))["decision"] == "approve"


def test_the_tolerance_is_subtracted_not_added(gate: Any) -> None:
    """Mutation: low >= +tolerance (would send a challenger whose interval is [-0.004, 0.005] to review)."""
    summary = gate(report(interval(0.5, 0.5, -0.004, 0.005)))
    assert summary["decision"] == "approve" and summary["more_val_images"] is None  # half-width 0.0045 <= 0.01


def test_the_floor_stays_on_the_challenger_s_point_ap(gate: Any) -> None:
    """MinMap is judged on the point AP, first; the reason still quotes the interval."""
    summary = gate(report(interval(0.29, 0.2, 0.05, 0.13)))
    assert summary["below_min_map"] is True and choice(summary) == "Below quality threshold"
    assert summary["decision"] == "refuse" and summary["refused_by"] == "below_min_map"
    assert summary["gate_reason"].startswith("challenger bbox_AP 0.290 is below the threshold 0.3; vs champion 0.200")


def test_more_val_images_follows_the_square_root_law() -> None:
    """Mutation: the ratio not squared, or the images already there counted as more."""
    assert more_val_images(-0.02, 0.02, 40, 0.01) == 120  # half-width 0.02 = 2 x tolerance: 4 x 40 in all
    assert more_val_images(-0.02, 0.02, 40, 0.02) is None and more_val_images(-0.02, 0.02, 40, 0.0) is None
    assert more_val_images(-0.013, 0.013, 333, 0.01) == math.ceil(333 * 1.3 ** 2) - 333


def test_no_more_images_are_asked_for_a_settled_decision() -> None:
    """Mutation: the count asked for whenever the interval is wide, though more images could not change the
    decision (a challenger within the tolerance beyond doubt, or refused beyond doubt)."""
    assert more_val_images(0.03, 0.12, 40, 0.01) is None  # better: half-width 0.045, wholly above -0.01
    assert more_val_images(-0.16, -0.04, 40, 0.01) is None  # wholly below -0.01
    assert more_val_images(-0.05, 0.04, 40, 0.01) == math.ceil(40 * 4.5 ** 2) - 40


def test_the_review_says_how_many_more_images_an_undecided_interval_needs(gate: Any) -> None:
    summary = gate(report(interval(0.5, 0.52, -0.05, 0.01), val_images=400))
    assert summary["decision"] == "review" and summary["more_val_images"] == 3200  # (0.03 / 0.01)^2 x 400 - 400
    assert "(about 3200 more held-out val images would narrow it)" in summary["gate_reason"]
    assert summary["interval"]["half_width"] == pytest.approx(0.03) and summary["images_compared"] == 400


def test_a_class_is_refused_on_its_own_bonferroni_interval(gate: Any) -> None:
    """Mutation: per-class rule judged on the overall interval, or on the class's point drop alone."""
    per_class = {"disc": interval(0.40, 0.60, -0.31, -0.12, 0.975),  # beyond 0.1 even at its best
                 "square": interval(0.45, 0.60, -0.30, -0.01, 0.975),  # point drop 0.15 > 0.1, not significant
                 "tiny": interval(0.0, 0.9, -0.95, -0.85, 0.975)}  # 12 instances: not judged
    summary = gate(report(interval(0.55, 0.56, -0.005, 0.0), per_class, {"disc": 40, "square": 40, "tiny": 12}))
    assert summary["regressed"] is False and summary["class_regressed"] is True
    assert [r["class_name"] for r in summary["class_regressions"]] == ["disc"]
    assert summary["class_regressions"][0]["interval"]["confidence"] == 0.975
    assert (summary["decision"], summary["refused_by"]) == ("refuse", "class_regressed")
    assert choice(summary) == "Worse than champion on a class"
    assert ("disc 0.400 vs 0.600, difference -0.200, 97.5% interval [-0.310, -0.120] (40 instances)"
            in summary["gate_reason"])


def test_a_class_wiped_out_is_reviewed_even_when_too_rare_to_judge(gate: Any) -> None:
    """Mutation: only judged classes considered (a rare class's collapse waved through with the overall)."""
    per_class = {"disc": interval(0.61, 0.60, -0.02, 0.04, 0.975), "rare": interval(0.0, 0.68, -0.68, -0.68)}
    summary = gate(report(interval(0.305, 0.64, -0.009, 0.01), per_class, {"disc": 100, "rare": 8}))
    assert (summary["decision"], summary["review_because"]) == ("review", ["class_dropped"])
    assert [(d["class_name"], d["judged"], d["instances"]) for d in summary["class_drops"]] == [("rare", False, 8)]
    assert "rare 0.000 vs 0.680 (8 instances on 8 images, too few to judge)" in summary["gate_reason"]


def test_a_class_s_drop_within_its_noise_is_not_a_review_but_a_collapse_or_a_sure_loss_is(gate: Any) -> None:
    """Mutations: the point drop alone (with many classes an equal challenger has some class 0.10 down most of the
    time), or the drop ignored once the class is noisy (a wiped-out rare class is noisy too)."""
    per_class = {"disc": interval(0.61, 0.60, -0.02, 0.04, 0.975), "noisy": interval(0.45, 0.57, -0.12, -0.12),
                 "collapsed": interval(0.20, 0.45, -0.25, -0.25), "lost": interval(0.40, 0.55, -0.15, -0.15)}
    document = report(interval(0.40, 0.40, -0.005, 0.005), per_class, {"disc": 100, "noisy": 25, "collapsed": 6,
                                                                      "lost": 20})
    highs = {"disc": 0.04, "noisy": 0.05, "collapsed": 0.1, "lost": -0.01}  # each class's own Bonferroni upper end
    for name, high in highs.items():
        document["comparison"]["classes"][name]["high"] = high
    summary = gate(document)
    assert summary["review_because"] == ["class_dropped"]
    assert [d["class_name"] for d in summary["class_drops"]] == ["collapsed", "lost"]  # worst first; noisy not
    document["comparison"]["classes"]["collapsed"]["challenger"] = 0.23  # now keeps more than half: noise
    document["comparison"]["classes"]["lost"]["high"] = 0.0  # not below 0: could be no loss at all
    assert gate(document)["decision"] == "approve"


def test_too_few_held_out_images_are_a_review_however_good_the_interval(gate: Any) -> None:
    """Mutation: MinComparedImages ignored, or judged on all val images rather than the held-out ones."""
    summary = gate(report(interval(0.6, 0.5, 0.05, 0.15), val_images=200, compared=49), min_compared_images=50)
    assert (summary["decision"], summary["review_because"]) == ("review", ["too_few_images"])
    assert (summary["images_compared"], summary["images_excluded"], summary["val_images"]) == (49, 151, 200)
    assert "only 49 held-out val images could be compared, fewer than the 50" in summary["gate_reason"]
    assert "(151 of 200 left out: 151 the champion trained on)" in summary["gate_reason"]
    assert gate(report(interval(0.6, 0.5, 0.05, 0.15), val_images=200, compared=50),
                min_compared_images=50)["decision"] == "approve"


def test_a_champion_that_does_not_say_what_it_trained_on_is_a_review(gate: Any) -> None:
    """Mutation: an unverifiable held-out set treated as verified."""
    summary = gate(report(interval(0.6, 0.5, 0.05, 0.15), unverified=["champion"]))
    assert summary["review_because"] == ["champion_training_unknown"] and summary["decision"] == "review"
    assert summary["unverified"] == ["champion"]


def test_refusal_wins_over_review(gate: Any) -> None:
    """A challenger surely worse is refused even where a review would also apply (few images, a rare drop)."""
    summary = gate(report(interval(0.4, 0.5, -0.2, -0.05), val_images=30))
    assert (summary["decision"], summary["refused_by"], summary["review_because"]) == ("refuse", "regressed", [])


def test_without_a_champion_the_floor_alone_decides() -> None:
    """No champion: approve or refuse, never review (the first deployment of a stack cannot wait for a person)."""
    from d2ops_core.documents.evaluation import EvaluationReport, GateThresholds
    from d2ops_core.gate_decision import judge

    first = EvaluationReport.model_validate({"primary_metric": "bbox_AP", "val_images": 3, "class_instances": {},
                                             "challenger": {"metrics": {"bbox_AP": 0.31}}})
    thresholds = GateThresholds(min_map=0.3, max_regression=0.01)
    assert judge(first, thresholds).decision == "approve"
    assert judge(first, thresholds.model_copy(update={"min_map": 0.32})).decision == "refuse"


def test_a_judged_class_missing_from_the_comparison_is_an_invalid_report(gate: Any) -> None:
    """Mutation: a class the job left out (or a report edited to drop it) waved through."""
    document = report(interval(0.5, 0.5, -0.01, 0.01))
    del document["comparison"]["per_class"]["disc"]
    with pytest.raises(EvaluationReportInvalid, match=r"comparison\.per_class lacks 'disc'"):
        gate(document)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("held_out"), "held_out is required when there is a champion"),
    (lambda d: d["comparison"].update(metric="segm_AP"), "comparison is of segm_AP, the gate judges bbox_AP"),
    (lambda d: d["comparison"]["overall"].update(challenger=0.7), "comparison.overall.challenger 0.7 is not"),
    (lambda d: d["held_out"].update(compared=150), "comparison.val_images 200 is not held_out.compared 150"),
])
def test_a_report_whose_interval_is_missing_or_of_something_else_is_invalid(gate: Any, change: Any,
                                                                           message: str) -> None:
    """Mutation: a champion without a held-out account judged anyway; an interval of another metric or other
    images used."""
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
