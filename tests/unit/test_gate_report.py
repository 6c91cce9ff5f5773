"""The evaluation report's section on the gate's comparison (model_code.evaluation.comparison.comparison_html)."""

from __future__ import annotations

from d2ops_core.documents.evaluation import Comparison, HeldOutImages
from d2ops_core.gate import GateSettings
from model_code.evaluation.comparison import comparison_html


def _interval(diff: float, low: float, high: float, confidence: float) -> dict[str, float]:
    return {"challenger": 0.5 + diff, "champion": 0.5, "difference": diff, "low": low, "high": high,
            "confidence": confidence, "half_width": (high - low) / 2}


COMPARISON = Comparison.model_validate({
    "metric": "bbox_AP", "val_images": 40, "resamples": 1000, "seed": 0, "confidence": 0.95,
    "overall": {**_interval(-0.02, -0.05, 0.01, 0.95), "low_mc_error": 0.0021, "high_mc_error": 0.0019},
    "per_class": {"disc": {**_interval(-0.3, -0.4, -0.2, 0.975), "method": "normal"},
                  "star<b>": {**_interval(0.0, -0.005, 0.005, 0.975), "method": "normal"}},
    "classes": {"disc": {"challenger": 0.2, "champion": 0.5, "difference": -0.3, "instances": 40, "images": 30},
                "star<b>": {"challenger": 0.5, "champion": 0.5, "difference": 0.0, "instances": 35, "images": 20},
                "rare": {"challenger": 0.0, "champion": 0.7, "difference": -0.7, "instances": 4, "images": 1}}})
HELD = HeldOutImages(compared=40, excluded=[{"reason": "champion_trained_on", "images": 12,
                                             "examples": ["a.jpg", "b<.jpg"]}])


def test_the_section_shows_each_interval_the_gate_s_reading_and_the_images_it_would_need() -> None:
    page = comparison_html(COMPARISON, HELD, GateSettings(max_regression=0.01, max_class_regression=0.1))
    assert "paired bootstrap over 40 held-out val images" in page and "1000 resamples (seed 0)" in page
    assert "<li>12 champion trained on (e.g. a.jpg, b&lt;.jpg)</li>" in page  # escaped, and said why
    # overall: [-0.05, +0.01] reaches below -0.01: review; half-width 0.03 = 3 x 0.01 -> 9 x 40 images, 320 more
    assert ("<td>[-0.0500, +0.0100]</td><td>percentile &plusmn;0.0021 / &plusmn;0.0019</td><td>0.95</td>"
            "<td>may be worse by more than 0.01: review</td><td>about 320 more</td>") in page
    # disc: its whole interval below -0.1 (mutation: the overall tolerance used per class would say the same,
    # but star's row must then not read 'not surely worse')
    assert "<td>[-0.4000, -0.2000]</td><td>normal</td><td>0.975</td><td>surely worse by more than 0.1: refused" in page
    assert "<th>star&lt;b&gt;</th>" in page and "<td>not surely worse by more than 0.1</td>" in page
    # every class, judged or not; the rare one's drop is flagged for review
    assert "<th>rare</th><td>0.0000</td><td>0.7000</td><td>-0.7000</td><td>4</td><td>1</td><td>no</td>" in page
    assert "drops by more than 0.1: review" in page


def test_without_the_tolerances_the_intervals_are_shown_without_a_verdict() -> None:
    page = comparison_html(COMPARISON, HELD, GateSettings())
    assert "[-0.4000, -0.2000]" in page and "surely" not in page and "approvable" not in page
    assert comparison_html(None, None, GateSettings()) == ""  # a first model: nothing to compare
    nothing = comparison_html(None, HeldOutImages(compared=0, excluded=[{"reason": "champion_trained_on",
                                                                         "images": 8}]), GateSettings())
    assert "0 held-out val images compared" in nothing and "nothing to compare" in nothing


def test_d2ops_status_shows_the_interval_and_the_images_it_would_need() -> None:
    """The run's $.evaluation as the definition selects it from the Lambda (a mocked review)."""
    from d2ops.commands.status import format_run
    from tests.fixtures.pipeline import support

    evaluation = support.state_output(support.run_case("ReviewApproved"), "Read evaluation report")["evaluation"]
    lines = format_run({"run_id": "r", "status": "SUCCEEDED", "timeline": [], "evaluation": evaluation})
    assert ("    bbox_AP challenger - champion: difference 0.020, 95% interval [-0.025, 0.065] on 40 val images; "
            "wider than the tolerance \u00b10.01: about 770 more val images would narrow it") in lines
    assert "    decision: review (uncertain, too_few_images)" in lines
    first = {**evaluation, "interval": None, "more_val_images": None}  # no champion: no comparison line
    assert not any("interval" in line for line in format_run({"run_id": "r", "status": "FAILED", "timeline": [],
                                                                "evaluation": first}))


def test_the_status_api_s_evaluation_answer_keeps_the_report_s_comparison() -> None:
    """Mutation: EvaluationView without the field drops the interval from GET /runs/{runId}/evaluation."""
    from tests.fixtures.pipeline import support

    support.function_path("status_api")
    from status_api.models import EvaluationView

    report = {"report_uri": "s3://a/runs/r/evaluation/evaluation.json", "primary_metric": "bbox_AP",
              "val_images": 40, "challenger": {"metrics": {"bbox_AP": 0.48}},
              "champion": {"metrics": {"bbox_AP": 0.5}}, "comparison": COMPARISON.model_dump(mode="json")}
    answer = EvaluationView.model_validate(report).model_dump(mode="json")
    assert answer["comparison"] == COMPARISON.model_dump(mode="json")
