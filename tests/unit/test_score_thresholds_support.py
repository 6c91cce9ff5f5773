"""Per-class score thresholds with support, and an F1 that is not the one they were fitted on
(model_code/evaluation/thresholds.py), against a detector whose score distributions are known.

The simulated detector: each val image holds Poisson(1) objects of a class; each object is found with
probability Q, its detection scored with density 2s on [0, 1] (survival 1 - t^2); each image also gets
Poisson(1) false positives scored with density 2(1 - s) (survival (1 - t)^2). At a threshold t, per object,
E[TP] = Q (1 - t^2) and E[FP] = (1 - t)^2, so the F1 the threshold gets on new images is
2 Q (1 - t^2) / (Q (1 - t^2) + (1 - t)^2 + 1): best 0.715 at t = 0.382. Every test below compares a
reported number with this truth for the threshold actually shipped, averaged over seeds, with margins of
several standard errors (a seed's noise is 0.05-0.2), so no CPU's rounding decides them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from d2ops_core.gate import DEFAULT_MIN_CLASS_INSTANCES
from model_code.evaluation.thresholds import (
    FOLDS,
    ClassMatches,
    ClassThreshold,
    ThresholdFits,
    describe,
    fit_for_artifact,
    fit_thresholds,
    image_folds,
)
from model_code.training.config import ConfigError, parse_hyperparameters

Q = 0.9
SEEDS = 800


def true_f1(threshold: float) -> float:
    found, false = Q * (1 - threshold ** 2), (1 - threshold) ** 2
    return 2 * found / (found + false + 1)


def images(count: int) -> list[dict[str, Any]]:
    return [{"id": i, "file_name": f"img_{i:05d}.jpg"} for i in range(count)]


def simulate(rng: np.random.Generator, image_ids: np.ndarray, objects_per_image: float = 1.0) -> ClassMatches:
    """One class's matched detections on ``image_ids``: false positives per object as in the truth above."""
    gt_images = np.repeat(image_ids, rng.poisson(objects_per_image, image_ids.size))
    tp_images = gt_images[rng.random(gt_images.size) < Q]
    fp_images = np.repeat(image_ids, rng.poisson(objects_per_image, image_ids.size))
    scores = np.concatenate([np.sqrt(rng.random(tp_images.size)), 1 - np.sqrt(rng.random(fp_images.size))])
    return ClassMatches(scores=scores,
                        true_positive=np.concatenate([np.ones(tp_images.size, bool), np.zeros(fp_images.size, bool)]),
                        ground_truth=int(gt_images.size), detection_images=np.concatenate([tp_images, fp_images]),
                        ground_truth_images=gt_images)


def fitted_errors(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over SEEDS val splits of ``count`` images, one class fitted on its own: (reported - truth,
    in-sample - truth, truth), truth being the F1 the shipped threshold gets on new images."""
    reported, in_sample, truth = [], [], []
    for seed in range(SEEDS):
        matches = simulate(np.random.default_rng(seed), np.arange(count))
        fit = fit_thresholds({"c": matches}, images(count), min_class_instances=1).classes["c"]
        if fit.basis != "max_f1":  # no true positive drawn: nothing was fitted
            continue
        assert fit.f1 is not None and fit.in_sample_f1 is not None
        truth.append(true_f1(fit.threshold))
        reported.append(fit.f1 - truth[-1])
        in_sample.append(fit.in_sample_f1 - truth[-1])
    return np.array(reported), np.array(in_sample), np.array(truth)


def test_the_reported_f1_is_honest_where_the_in_sample_one_is_optimistic() -> None:
    """40 val images (~40 objects): the in-sample F1 overstates the shipped threshold's true F1 by ~0.045 on
    average (measured 0.037-0.047 over blocks of 400 seeds, s.e. 0.0025 at 800); the reported, out-of-fold
    one is within 0.015 of it (measured -0.011 to 0.000, a hair pessimistic: each fold's threshold is fitted
    on 4/5 of val). Catches: reporting the in-sample F1, fitting each fold's threshold on all of val (the
    held-out fold included)."""
    reported, in_sample, truth = fitted_errors(40)
    assert len(truth) > 0.95 * SEEDS
    assert in_sample.mean() > 0.025
    assert abs(reported.mean()) < 0.015
    # And seed by seed it is the better estimate more often than not (measured 0.56-0.63 of seeds).
    assert np.mean(np.abs(reported) < np.abs(in_sample)) > 0.5


def test_with_few_objects_the_in_sample_f1_lies_most_and_the_reported_one_does_not_flatter() -> None:
    """10 val images: the in-sample F1 reads ~0.78 against a true ~0.69 (+0.09 to +0.10; the issue's 0.80
    against 0.67 on 5 objects); out-of-fold is a little pessimistic (-0.023 to -0.005; each fold's threshold
    is fitted on 4/5 of the images), not optimistic. Catches reporting the in-sample F1 where the estimate
    is noisiest."""
    reported, in_sample, _ = fitted_errors(10)
    assert in_sample.mean() > 0.05
    assert -0.06 < reported.mean() < 0.02


def test_a_rare_class_does_better_on_the_pooled_threshold() -> None:
    """A class with ~5 val objects that behaves like the common one (200 images): fitted on its own, its
    threshold gets a true F1 of 0.667-0.682 (blocks of 200 seeds); the pooled threshold 0.711 (the best is
    0.715). Catches no minimum support (the rare class fitted on its own 5 objects)."""
    own, pooled = [], []
    for seed in range(SEEDS // 2):
        rng = np.random.default_rng(seed)
        common = simulate(rng, np.arange(200))
        rare = simulate(rng, rng.choice(200, size=5, replace=False))
        matches = {"common": common, "rare": rare}
        supported = fit_thresholds(matches, images(200), min_class_instances=DEFAULT_MIN_CLASS_INSTANCES)
        alone = fit_thresholds(matches, images(200), min_class_instances=1)
        assert supported.classes["rare"].fitted_on == "pooled"
        assert supported.classes["rare"].threshold == supported.pooled_threshold
        assert supported.classes["common"].fitted_on == "class"
        pooled.append(true_f1(supported.classes["rare"].threshold))
        if alone.classes["rare"].basis == "max_f1":
            own.append(true_f1(alone.classes["rare"].threshold))
    assert np.mean(pooled) > 0.70
    assert np.mean(pooled) - np.mean(own) > 0.02


def two_classes(rare_objects: int) -> dict[str, ClassMatches]:
    """'common': 40 objects on images 0-39, found at 0.9, false positives at 0.2: alone, cut at 0.55.
    'rare': ``rare_objects`` on images 40.., found at 0.15 below its false positives at 0.5: alone, keeping
    everything is best (F1 2/3), cut at 0.075. Pooled (GT 40 + n): keeping the 40 at 0.9 scores 80/(80 + n),
    better than anything lower for n < 40: cut at 0.7."""
    def build(ids: list[int], tp_score: float, fp_score: float) -> ClassMatches:
        n = len(ids)
        return ClassMatches(scores=np.array([tp_score] * n + [fp_score] * n),
                            true_positive=np.array([True] * n + [False] * n), ground_truth=n,
                            detection_images=np.array(ids * 2), ground_truth_images=np.array(ids))
    return {"common": build(list(range(40)), 0.9, 0.2), "rare": build(list(range(40, 40 + rare_objects)), 0.15, 0.5)}


@pytest.mark.parametrize(("rare_objects", "fitted_on", "threshold"), [(9, "pooled", 0.7), (10, "class", 0.075)])
def test_below_the_support_the_pooled_threshold_at_it_the_class_s_own(rare_objects: int, fitted_on: str,
                                                                      threshold: float) -> None:
    """Known answers either side of MinClassInstances 10. Catches no minimum support (9 objects cut at
    0.075), '<=' for '<' (10 objects pooled), the pooled fit on the rare classes only (it would cut at 0.075)."""
    fits = fit_thresholds(two_classes(rare_objects), images(60), min_class_instances=10)
    rare = fits.classes["rare"]
    assert (rare.fitted_on, rare.threshold, rare.instances) == (fitted_on, pytest.approx(threshold), rare_objects)
    assert fits.pooled_threshold == pytest.approx(0.7)
    assert (fits.classes["common"].fitted_on, fits.classes["common"].threshold) == ("class", pytest.approx(0.55))
    assert fits.score_thresholds() == {"common": pytest.approx(0.55), "rare": pytest.approx(threshold)}


def test_a_class_without_val_objects_gets_the_pooled_threshold() -> None:
    """A class the model has and val never shows (or shows fewer of than the support): pooled, with no F1 to
    report (nothing to find). Catches the old default 0.5 for it, and an F1 of 0 claimed from no objects."""
    fits = fit_thresholds(two_classes(9), images(60), ["common", "rare", "unseen"], min_class_instances=10)
    unseen = fits.classes["unseen"]
    assert (unseen.fitted_on, unseen.threshold, unseen.instances) == ("pooled", pytest.approx(0.7), 0)
    assert (unseen.f1, unseen.recall, unseen.in_sample_f1, unseen.kept) == (None, None, None, 0)


def test_folds_are_even_stable_and_keyed_on_the_file_name() -> None:
    """Catches folds by list position (reordering val moves images between folds), uneven folds, and
    folds at all where there are too few images to hold any out."""
    listed = images(23)
    folds = image_folds(listed)
    assert sorted(set(folds.values())) == list(range(FOLDS))
    sizes = np.bincount(list(folds.values()))
    assert sizes.max() - sizes.min() <= 1
    assert image_folds(listed[::-1]) == folds
    renamed = [dict(image, file_name="x" + image["file_name"]) for image in listed]
    assert image_folds(renamed) != folds  # the name decides, not the id
    assert len(set(image_folds(images(5)).values())) == 2  # at least two images a fold
    assert image_folds(images(3)) == {}


def test_too_few_images_report_the_in_sample_f1_and_say_it_is_optimistic() -> None:
    fits = fit_thresholds(two_classes(2), images(3), min_class_instances=1)
    rare = fits.classes["rare"]
    assert (fits.folds, rare.estimate, rare.folds) == (0, "in_sample", 0)
    assert rare.f1 == rare.in_sample_f1 == pytest.approx(2 / 3)
    assert "F1 0.667 in-sample, optimistic" in describe("rare", rare, 1)


# ----------------------------------------------------------------------------------- the job's log

_FITTED = re.compile(r"score threshold '(\w+)': [01]\.\d{4}, F1 ")  # what tests/integration/test_training_jobs reads


def coco_scene(count: int = 20) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """'circle' on every image (found at a score falling with the image, a false positive beside it);
    'square' on three images only."""
    listed = images(count)
    anns: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i in range(count):
        anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400,
                     "iscrowd": 0})
        results.append({"image_id": i, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.95 - 0.04 * i})
        results.append({"image_id": i, "category_id": 1, "bbox": [60, 60, 20, 20], "score": 0.05 + 0.04 * i})
        if i < 3:
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 2, "bbox": [60, 10, 20, 20],
                         "area": 400, "iscrowd": 0})
            results.append({"image_id": i, "category_id": 2, "bbox": [60, 10, 20, 20], "score": 0.6})
    gt = {"images": [dict(image, width=100, height=100) for image in listed], "annotations": anns,
          "categories": [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}]}
    return gt, results


def test_the_log_says_which_f1_it_shows_and_what_the_threshold_was_fitted_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Catches a log line that shows the in-sample F1 as the F1, or hides the pooled basis."""
    gt, results = coco_scene()
    fits = fit_for_artifact(gt, results, ["circle", "square"], has_masks=False, min_class_instances=10)
    lines = {m[1]: line for line in capsys.readouterr().out.splitlines() if (m := _FITTED.search(line))}
    assert set(lines) == {"circle", "square"}
    circle, square = fits.classes["circle"], fits.classes["square"]
    assert (circle.fitted_on, circle.estimate, circle.folds) == ("class", "out_of_fold", FOLDS)
    assert circle.f1 is not None and circle.in_sample_f1 is not None
    assert circle.f1 < circle.in_sample_f1  # fitted on val, it reads better there than held out
    assert f"F1 {circle.f1:.3f} out-of-fold over {FOLDS} folds by image" in lines["circle"]
    assert f"{circle.in_sample_f1:.3f} on the val it was fitted on (optimistic)" in lines["circle"]
    assert "its own best F1 on 20 val objects" in lines["circle"]
    assert (square.fitted_on, square.threshold) == ("pooled", fits.pooled_threshold)
    assert "pooled over all classes (3 val objects, fewer than MinClassInstances 10)" in lines["square"]
    # The report's copy (report/score_thresholds.json) reads back as what was fitted.
    assert ThresholdFits.model_validate_json(fits.model_dump_json()) == fits


def test_a_default_threshold_says_why_and_shows_no_f1() -> None:
    c = ClassThreshold(threshold=0.5, fitted_on="class", basis="no_true_positive", instances=40,
                       estimate="out_of_fold", folds=5, f1=0.0, precision=0.0, recall=0.0, in_sample_f1=0.0, kept=3)
    assert describe("x", c, 30) == "score threshold 'x': 0.5000, the default: no true positive on its 40 val objects"
    pooled = describe("x", c.model_copy(update={"fitted_on": "pooled", "instances": 4}), 30)
    assert pooled == ("score threshold 'x': 0.5000, the default: no true positive on val, pooled over all classes "
                      "(4 val objects, fewer than MinClassInstances 30)")


# ----------------------------------------------------------------------------------- the support's way in

def test_the_support_is_a_string_hyperparameter_defaulting_to_the_gate_s() -> None:
    """prepare_training passes the plan's gate.min_class_instances as a string (tests/unit/test_pipeline_prepare);
    a job started without it gets d2ops_core.gate's default, the stack parameter's."""
    assert parse_hyperparameters({"min_class_instances": "12"}).min_class_instances == 12
    assert parse_hyperparameters({}).min_class_instances == DEFAULT_MIN_CLASS_INSTANCES
    with pytest.raises(ConfigError, match="min_class_instances"):
        parse_hyperparameters({"min_class_instances": "0"})
