"""The per-class gate on real COCO numbers: the evaluation job's report, read back by the summarize Lambda.

No model is trained: detections are the ground truth, jittered, through the same scoring
(faster-coco-eval) and report writer the evaluation job uses.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from d2ops import synth
from d2ops_core.documents.evaluation import EvaluationReport, HeldOutImages
from d2ops_core.gate import GateSettings
from model_code.dataset_version import read_coco
from model_code.evaluation.coco import score_results
from model_code.evaluation.comparison import evaluation_report
from model_code.evaluation.documents import class_instances
from tests.fixtures.pipeline import support

support.function_path("summarize_evaluation")
from summarize_evaluation.models import SummarizeEvent  # noqa: E402
from summarize_evaluation.service import summarize  # noqa: E402


@pytest.fixture(scope="module")
def gt(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("ds")
    synth.generate(root, images=40, size=96, seed=3, val_fraction=0.5)
    doc = read_coco(root / "annotations" / "val.json")
    doc["annotations"][0]["iscrowd"] = 1  # a crowd region: COCO's AP ignores it, so it is not counted
    return doc


def detections(gt: dict, seed: int) -> list[dict]:
    """Every non-crowd ground-truth box, jittered, with a random score."""
    rng = random.Random(seed)
    out = []
    for ann in gt["annotations"]:
        if ann.get("iscrowd"):
            continue
        x, y, w, h = ann["bbox"]
        j = [rng.uniform(-0.2, 0.2) * s for s in (w, h, w, h)]
        out.append({"image_id": ann["image_id"], "category_id": ann["category_id"], "score": rng.uniform(0.3, 1.0),
                    "bbox": [max(0.0, x + j[0]), max(0.0, y + j[1]), w + j[2], h + j[3]]})
    return out


def gate(report: dict, max_class_regression: float, min_class_instances: int) -> dict:
    parsed = EvaluationReport.model_validate_json(json.dumps(report))  # as the Lambda reads evaluation.json
    event = SummarizeEvent(report_uri="s3://bucket/evaluation.json", dataset={"name": "shapes", "version": "v1"}, gate={
        "primary_metric": "bbox_AP", "min_map": 0.0, "max_regression": 1.0, "min_compared_images": 1,
        "max_class_regression": max_class_regression, "min_class_instances": min_class_instances})
    return summarize(parsed, event).model_dump(mode="json")


def test_the_class_a_challenger_stopped_detecting_is_named_with_real_aps_and_counts(gt: dict) -> None:
    names = {c["id"]: c["name"] for c in gt["categories"]}
    lost_id = gt["categories"][1]["id"]
    champion_dets = detections(gt, seed=0)
    challenger_dets = [d for d in champion_dets if d["category_id"] != lost_id]
    champion, challenger = (score_results(gt, champion_dets, ["bbox"]), score_results(gt, challenger_dets, ["bbox"]))
    instances = class_instances(gt)
    parsed = evaluation_report(gt, challenger, champion, "bbox_AP", GateSettings(resamples=200, min_class_instances=1))
    comparison = parsed.comparison
    assert comparison is not None and parsed.held_out == HeldOutImages(compared=len(gt["images"]))
    report = parsed.model_dump(mode="json")
    # The interval is of these very APs, and each class's level is Bonferroni-adjusted over the judged
    # classes (mutations: the point estimates from another scorer; the adjustment dropped).
    assert comparison.overall.challenger == pytest.approx(challenger.metrics["bbox_AP"], abs=1e-9)
    judged = [name for name, count in instances.items() if count >= 1]
    bonferroni = pytest.approx(1 - 0.05 / len(judged))
    assert [i.confidence for i in comparison.per_class.values()] == [bonferroni] * len(judged)

    counts = Counter(a["category_id"] for a in gt["annotations"] if not a.get("iscrowd"))
    assert report["class_instances"] == {names[i]: counts.get(i, 0) for i in names}
    assert sum(report["class_instances"].values()) == len(gt["annotations"]) - 1  # the crowd region left out
    lost = names[lost_id]
    champion_ap = champion.per_class[lost]["bbox_AP"]
    assert champion_ap > 0.3 and challenger.per_class[lost]["bbox_AP"] == 0.0

    summary = gate(report, max_class_regression=0.1, min_class_instances=1)
    # Per-class AP is computed class by class: the other classes score exactly as before.
    (regression,) = summary["class_regressions"]
    # The APs are the interval's point estimates: the bootstrap's own scorer, equal to COCO's to 1e-9.
    assert {k: v for k, v in regression.items() if k != "interval"} == {
        "class_name": lost, "metric": "bbox_AP", "challenger_ap": 0.0,
        "champion_ap": pytest.approx(champion_ap, abs=1e-9), "drop": pytest.approx(champion_ap, abs=1e-9),
        "instances": counts[lost_id]}
    assert f"{lost} 0.000 vs {champion_ap:.3f}, difference {-champion_ap:.3f}" in summary["class_gate_reason"]
    # With fewer val instances than MinClassInstances the class is not judged, and a margin above
    # the drop lets it pass.
    assert gate(report, max_class_regression=0.1, min_class_instances=counts[lost_id] + 1)["class_regressed"] is False
    assert gate(report, max_class_regression=1.0, min_class_instances=1)["class_regressed"] is False
