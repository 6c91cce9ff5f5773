"""The per-class score threshold rule (model_code/evaluation/thresholds.py): known answers and properties.

Each test names the product mutation it catches.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools.coco import COCO as RefCOCO
from pycocotools.cocoeval import COCOeval as RefCOCOeval

from d2ops_core.score_thresholds import DEFAULT_SCORE_THRESHOLD
from model_code.evaluation.thresholds import (
    MATCH_IOU,
    ClassMatches,
    choose_threshold,
    choose_thresholds,
    match_classes,
    score_thresholds,
)

T, F = True, False


def matches(pairs: list[tuple[float, bool]], ground_truth: int) -> ClassMatches:
    return ClassMatches(scores=np.array([s for s, _ in pairs], dtype=float),
                        true_positive=np.array([t for _, t in pairs], dtype=bool), ground_truth=ground_truth)


def test_known_answer_cuts_at_the_best_f1_midway_between_kept_and_dropped() -> None:
    # Candidates (GT 3): keep 1 -> F1 2/4; keep 2 -> 4/5 (best); keep 3..5 -> 4/6, 4/7, 4/8; keep 6 -> 6/9.
    # Catches: F1 without the missed objects (precision only: keep 1), recall only (keep 6), the threshold
    # at the lowest kept (0.8) or highest dropped (0.7) score instead of between them.
    pairs = [(0.9, T), (0.8, T), (0.7, F), (0.6, F), (0.5, F), (0.4, T)]
    choice = choose_threshold(matches(pairs, 3))
    assert choice.threshold == pytest.approx(0.75)
    assert (choice.basis, choice.kept, choice.f1) == ("max_f1", 2, pytest.approx(0.8))
    assert (choice.precision, choice.recall) == (1.0, pytest.approx(2 / 3))
    # The input's order is not the rule's: shuffled, the same answer (catches: no sort by score).
    assert choose_threshold(matches(pairs[::-1], 3)).threshold == pytest.approx(0.75)


def test_ties_in_f1_go_to_the_higher_threshold() -> None:
    # GT 3: keep 1 -> 2/4 = 0.5; keep 9 (3 TP after 6 FP) -> 6/12 = 0.5; in between less. Catches '>=' for '>'
    # (the last of the tied candidates, threshold 0.15).
    pairs = [(0.9, T)] + [(0.8 - 0.05 * i, F) for i in range(6)] + [(0.3, T), (0.2, T)]
    choice = choose_threshold(matches(pairs, 3))
    assert choice.f1 == pytest.approx(0.5) and choice.kept == 1
    assert choice.threshold == pytest.approx(0.85)


def test_equal_scores_are_kept_or_dropped_together() -> None:
    # GT 2: 0.9 TP; then three detections at 0.8 (one TP). Keep 1 -> 2/3; keep 4 -> 4/6: a tie, so 0.85.
    # Catches cutting inside a group of equal scores (keep 0.9, 0.8 TP -> 4/4... would claim F1 0.8 at
    # threshold 0.8, which at serving keeps all three).
    choice = choose_threshold(matches([(0.9, T), (0.8, F), (0.8, T), (0.8, F)], 2))
    assert (choice.threshold, choice.kept) == (pytest.approx(0.85), 1)


def test_keeping_everything_halves_the_lowest_score() -> None:
    # Every detection helps: nothing dropped, so the threshold is midway between the lowest score and 0.
    choice = choose_threshold(matches([(0.9, T), (0.6, T)], 2))
    assert (choice.threshold, choice.kept, choice.f1) == (pytest.approx(0.3), 2, 1.0)


@pytest.mark.parametrize(("pairs", "gt", "basis"), [
    ([(0.9, F)], 0, "no_ground_truth"),
    ([], 4, "no_detections"),
    ([(0.9, F), (0.2, F)], 4, "no_true_positive"),
    ([], 0, "no_ground_truth"),
])
def test_classes_without_evidence_get_the_default(pairs: list[tuple[float, bool]], gt: int, basis: str) -> None:
    # Catches a fitted threshold from no evidence (e.g. 1.0 or above the highest score for an all-FP
    # class, or a crash on an empty class).
    choice = choose_threshold(matches(pairs, gt))
    assert (choice.threshold, choice.basis, choice.kept) == (DEFAULT_SCORE_THRESHOLD, basis, 0)


def test_inconsistent_matches_are_refused() -> None:
    with pytest.raises(ValueError, match="2 true positives for 1"):
        choose_threshold(matches([(0.9, T), (0.8, T)], 1))


# ----------------------------------------------------------------------------------- COCO's matching

def scene() -> dict[str, Any]:
    images = [{"id": i, "width": 100, "height": 100, "file_name": f"{i}.png"} for i in (1, 2)]
    cats = [{"id": 3, "name": "circle"}, {"id": 7, "name": "square"}, {"id": 9, "name": "star"}]
    anns = [
        {"id": 1, "image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 3, "bbox": [50, 50, 40, 40], "area": 1600, "iscrowd": 1},
        {"id": 3, "image_id": 2, "category_id": 3, "bbox": [0, 0, 20, 20], "area": 400, "iscrowd": 0},
        {"id": 4, "image_id": 2, "category_id": 7, "bbox": [40, 40, 20, 20], "area": 400, "iscrowd": 0},
    ]
    return {"images": images, "categories": cats, "annotations": anns}


RESULTS = [
    {"image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.95},   # TP
    {"image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.9},    # duplicate: FP
    {"image_id": 1, "category_id": 3, "bbox": [55, 55, 10, 10], "score": 0.85},  # on the crowd region: ignored
    {"image_id": 2, "category_id": 3, "bbox": [0, 0, 20, 12], "score": 0.6},    # IoU 0.6: TP at 0.5 (FP at 0.75)
    {"image_id": 2, "category_id": 3, "bbox": [70, 0, 20, 20], "score": 0.3},   # FP
    {"image_id": 2, "category_id": 7, "bbox": [0, 0, 20, 20], "score": 0.8},    # square on the circle: FP
]


def test_coco_matching_at_iou_50_known_answer() -> None:
    found = match_classes(scene(), RESULTS)
    circle = found["circle"]
    # Catches: the crowd-matched detection counted as FP (or TP), duplicates counted TP, matching at 0.75.
    assert circle.ground_truth == 2
    assert sorted(zip(circle.scores.tolist(), circle.true_positive.tolist(), strict=True)) == [
        (0.3, F), (0.6, T), (0.9, F), (0.95, T)]
    assert (found["square"].ground_truth, found["square"].true_positive.tolist()) == (1, [F])
    assert found["star"].ground_truth == 0 and found["star"].scores.size == 0
    # circle: keep 1 -> 2/3; keep 2 -> 2/4; keep 3 (2 TP) -> 4/5 best; keep 4 -> 4/6. Midway 0.6 / 0.3.
    # Support 1 so that circle (2 objects) and square (1) are fitted on their own; star (none) is pooled:
    # 0.95 T, 0.9 F, 0.8 F (square), 0.6 T, 0.3 F with GT 3 -> keep 4 (4/7) is best, midway 0.6 / 0.3 again.
    fits = choose_thresholds(scene(), RESULTS, min_class_instances=1)
    fitted = fits.classes["circle"]
    assert fitted.threshold == pytest.approx(0.45) and fitted.in_sample_f1 == pytest.approx(0.8)
    # Two val images make no two folds: the F1 reported is the in-sample one, and says so.
    assert (fitted.estimate, fitted.folds, fitted.f1) == ("in_sample", 0, pytest.approx(0.8))
    assert (fits.classes["square"].fitted_on, fits.classes["square"].basis) == ("class", "no_true_positive")
    assert (fits.classes["star"].fitted_on, fits.pooled_threshold) == ("pooled", pytest.approx(0.45))
    assert score_thresholds(scene(), RESULTS, min_class_instances=1) == {
        "circle": pytest.approx(0.45), "square": DEFAULT_SCORE_THRESHOLD, "star": pytest.approx(0.45)}
    # With the crowd detection counted as a false positive the answer would differ: that is what the test pins.
    assert choose_threshold(matches([(0.95, T), (0.9, F), (0.85, F), (0.6, T), (0.3, F)], 2)).threshold != \
        pytest.approx(0.45)


def test_no_detections_at_all() -> None:
    assert score_thresholds(scene(), []) == dict.fromkeys(["circle", "square", "star"], DEFAULT_SCORE_THRESHOLD)


def test_segm_matches_masks_not_boxes() -> None:
    # The box is right on the GT but the mask covers another place: at IoU type segm it is a FP.
    from pycocotools import mask as pmask

    gt = scene()
    gt["annotations"] = [a | {"segmentation": [[x0, y0, x0 + w, y0, x0 + w, y0 + h, x0, y0 + h]]}
                         for a in gt["annotations"] if not a["iscrowd"]
                         for x0, y0, w, h in [a["bbox"]]]
    elsewhere = np.zeros((100, 100, 1), dtype=np.uint8, order="F")
    elsewhere[80:95, 80:95] = 1
    rle = pmask.encode(elsewhere)[0]
    result = {"image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.9,
              "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()}}
    assert match_classes(gt, [result], "bbox")["circle"].true_positive.tolist() == [T]
    assert match_classes(gt, [result], "segm")["circle"].true_positive.tolist() == [F]


def reference_matches(gt: dict[str, Any], results: list[dict[str, Any]]) -> dict[int, list[tuple[float, bool]]]:
    """pycocotools' own evaluateImg at IoU 0.5, area all, maxDets 100: (score, TP) of non-ignored detections."""
    coco = RefCOCO()
    coco.dataset = copy.deepcopy(gt)
    coco.createIndex()
    ev = RefCOCOeval(coco, coco.loadRes(copy.deepcopy(results)), "bbox")
    ev.params.iouThrs = np.array([MATCH_IOU])
    ev.params.areaRng, ev.params.areaRngLbl, ev.params.maxDets = [ev.params.areaRng[0]], ["all"], [100]
    ev.evaluate()
    out: dict[int, list[tuple[float, bool]]] = {int(c["id"]): [] for c in gt["categories"]}
    for e in ev.evalImgs:
        if e is None:
            continue
        for score, matched, ignored in zip(e["dtScores"], e["dtMatches"][0], e["dtIgnore"][0], strict=True):
            if not ignored:
                out[int(e["category_id"])].append((float(score), bool(matched)))
    return out


BOX = st.tuples(st.integers(0, 80), st.integers(0, 80), st.integers(4, 30), st.integers(4, 30))


@st.composite
def scenes(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    gt = scene()
    anns: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for image_id in (1, 2):
        for _ in range(draw(st.integers(0, 5))):
            x, y, w, h = draw(BOX)
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": draw(st.sampled_from([3, 7])),
                         "bbox": [x, y, w, h], "area": w * h, "iscrowd": int(draw(st.integers(0, 5)) == 0)})
            for _ in range(draw(st.integers(0, 2))):  # detections near it: jittered, maybe the wrong class
                dx, dy = draw(st.integers(-6, 6)), draw(st.integers(-6, 6))
                results.append({"image_id": image_id, "category_id": draw(st.sampled_from([3, 7])),
                                "bbox": [x + dx, y + dy, w, h], "score": draw(st.integers(1, 20)) / 20})
        for _ in range(draw(st.integers(0, 2))):
            x, y, w, h = draw(BOX)
            results.append({"image_id": image_id, "category_id": 3, "bbox": [x, y, w, h],
                            "score": draw(st.integers(1, 20)) / 20})
    gt["annotations"] = anns
    return gt, results


@settings(max_examples=60, deadline=None)
@given(scenes())
def test_matching_agrees_with_pycocotools_evaluate_img(case: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    # Catches any misreading of faster-coco-eval's matches: crowd regions, duplicates, classes mixed up,
    # the IoU threshold. Equal scores make pycocotools' order a tie-break, so compare as multisets.
    gt, results = case
    if not results:
        return
    ours = match_classes(gt, results)
    reference = reference_matches(gt, results)
    names = {int(c["id"]): c["name"] for c in gt["categories"]}
    for cid, name in names.items():
        mine = sorted(zip(ours[name].scores.tolist(), ours[name].true_positive.tolist(), strict=True))
        theirs = sorted(reference[cid])
        # Same counts per score: tied scores may swap which of two detections takes a box, never how many.
        assert _per_score(mine) == _per_score(theirs), name


def _per_score(pairs: list[tuple[float, bool]]) -> dict[float, tuple[int, int]]:
    out: dict[float, tuple[int, int]] = {}
    for score, tp in pairs:
        n, t = out.get(score, (0, 0))
        out[score] = (n + 1, t + tp)
    return out


# ----------------------------------------------------------------------------------- properties

CLASS = st.lists(st.tuples(st.integers(0, 1000).map(lambda v: v / 1000), st.booleans()), max_size=40).flatmap(
    lambda pairs: st.tuples(st.just(pairs), st.integers(sum(t for _, t in pairs), sum(t for _, t in pairs) + 10)))


def f1_at(pairs: list[tuple[float, bool]], gt: int, threshold: float) -> Fraction:
    kept = [t for s, t in pairs if s >= threshold]
    return Fraction(2 * sum(kept), len(kept) + gt) if kept or gt else Fraction(0)


@settings(max_examples=300, deadline=None)
@given(CLASS)
def test_the_threshold_is_the_best_f1_and_the_fewest_detections(case: tuple[list[tuple[float, bool]], int]) -> None:
    # Brute force over every threshold that matters (each score, and above them all). Catches a wrong F1,
    # a wrong cumulative count, a wrong tie rule, a threshold that lands on the wrong side of a score.
    pairs, gt = case
    choice = choose_threshold(matches(pairs, gt))
    assert 0.0 <= choice.threshold <= 1.0
    if choice.basis != "max_f1":
        assert choice.threshold == DEFAULT_SCORE_THRESHOLD
        assert gt == 0 or not any(t for _, t in pairs)
        return
    candidates = sorted({s for s, _ in pairs}, reverse=True)
    best = max(f1_at(pairs, gt, s) for s in candidates)
    achieved = f1_at(pairs, gt, choice.threshold)
    assert achieved == best and float(achieved) == pytest.approx(choice.f1)
    kept = sum(1 for s, _ in pairs if s >= choice.threshold)
    assert kept == choice.kept == min(sum(1 for s, _ in pairs if s >= c) for c in candidates
                                      if f1_at(pairs, gt, c) == best)
    # Midway: strictly between the lowest score kept and the highest dropped (or 0).
    lowest_kept = min(s for s, _ in pairs if s >= choice.threshold)
    dropped = [s for s, _ in pairs if s < choice.threshold]
    assert choice.threshold == pytest.approx((lowest_kept + (max(dropped) if dropped else 0.0)) / 2)


@settings(max_examples=100, deadline=None)
@given(CLASS, st.integers(1, 5))
def test_more_missed_objects_never_raise_the_threshold(case: tuple[list[tuple[float, bool]], int], more: int) -> None:
    # With more objects the detector never found, keeping more detections can only look better (recall weighs
    # more): the threshold never goes up. Catches F1 computed without the missed objects (FN).
    pairs, gt = case
    first, second = choose_threshold(matches(pairs, gt)), choose_threshold(matches(pairs, gt + more))
    if first.basis == second.basis == "max_f1":
        assert second.kept >= first.kept
