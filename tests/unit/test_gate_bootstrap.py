"""The gate's paired bootstrap (model_code.evaluation.bootstrap): COCO's AP per resample, paired intervals."""

from __future__ import annotations

import random
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from d2ops import synth
from d2ops_core.documents.evaluation import EvaluationReport
from model_code.dataset_version import read_coco
from model_code.evaluation import bootstrap
from model_code.evaluation.bootstrap import ClassMatches, compare, weighted_ap
from model_code.evaluation.coco import score_iou_type
from model_code.evaluation.matching import matches_from_coco
from tests.unit.test_training_coco_eval import noisy_detections


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A synthetic COCO split with crowd regions, and noisy detections (one image with more than 100)."""
    root = tmp_path_factory.mktemp("ds")
    synth.generate(root, images=60, size=96, seed=3, val_fraction=0.5)
    gt = read_coco(root / "annotations" / "val.json")
    rng = random.Random(7)
    for ann in gt["annotations"]:
        if rng.random() < 0.12:
            ann["iscrowd"] = 1
    dets = noisy_detections(gt, seed=5)
    first = gt["images"][0]["id"]
    for k in range(130):  # past maxDets: COCO keeps the 100 best-scored of the image and class
        like = next(d for d in dets if d["image_id"] == first)
        dets.append({**like, "bbox": [k % 60, k % 50, 9.0, 9.0], "score": 0.001 * (k + 1) / 131})
    return gt, dets


def coco_per_class(gt: dict[str, Any], dets: list[dict[str, Any]], iou_type: str) -> tuple[dict[str, float], float]:
    names = {int(c["id"]): str(c["name"]) for c in gt["categories"]}
    wanted = dets if iou_type == "segm" else [{k: v for k, v in d.items() if k != "segmentation"} for d in dets]
    scores = score_iou_type(gt, wanted, iou_type, names)
    return scores.per_class, scores.metrics.get(f"{iou_type}_AP", float("nan"))


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_unit_weights_give_faster_coco_evals_per_class_ap_and_their_mean_the_reports_ap(
        crowded: tuple[dict[str, Any], list[dict[str, Any]]], iou_type: str) -> None:
    # Catches: crowd matches counted as FPs, no maxDets cut, another interpolation, a wrong score order.
    gt, dets = crowded
    matches = matches_from_coco(gt, dets, iou_type)
    assert any(m.det_ignore.any() for m in matches.values())  # crowd regions were really matched
    reference, overall = coco_per_class(gt, dets, iou_type)
    ones = np.ones((1, len(gt["images"])))
    ours = {name: float(weighted_ap(m, ones)[0]) for name, m in matches.items()}
    assert set(ours) == set(reference) and len(ours) >= 3
    for name, ap in reference.items():
        assert ours[name] == pytest.approx(ap, abs=1e-9), name
    assert float(np.mean(list(ours.values()))) == pytest.approx(overall, abs=1e-9)


def test_a_model_without_detections_has_every_class_at_zero(crowded: tuple[dict[str, Any], list[dict[str, Any]]]
                                                              ) -> None:
    gt, _ = crowded
    matches = matches_from_coco(gt, [], "bbox")
    assert {m.det_image.size for m in matches.values()} == {0}
    assert {float(weighted_ap(m, np.ones((1, len(gt["images"]))))[0]) for m in matches.values()} == {0.0}


def small_split(seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Six images, two classes, some crowd, detections with distinct scores (some matching, some not)."""
    rng = random.Random(seed)
    images = [{"id": i + 1, "width": 64, "height": 64, "file_name": f"{i}.png"} for i in range(6)]
    anns: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    for img in images:
        for _ in range(rng.randint(0, 3)):
            x, y, w, h = rng.uniform(0, 40), rng.uniform(0, 40), rng.uniform(6, 20), rng.uniform(6, 20)
            cat = rng.choice([1, 2])
            anns.append({"id": len(anns) + 1, "image_id": img["id"], "category_id": cat, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": int(rng.random() < 0.15)})
            if rng.random() < 0.8:
                j = [rng.uniform(-0.3, 0.3) * s for s in (w, h, w, h)]
                box = [x + j[0], y + j[1], w + j[2], h + j[3]]
                dets.append({"image_id": img["id"], "category_id": cat, "bbox": box, "score": rng.random()})
        for _ in range(rng.randint(0, 2)):
            dets.append({"image_id": img["id"], "category_id": rng.choice([1, 2]),
                         "bbox": [rng.uniform(0, 40), rng.uniform(0, 40), 10.0, 10.0], "score": rng.random()})
    return {"images": images, "annotations": anns,
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}, dets


def repeated(gt: dict[str, Any], dets: list[dict[str, Any]], counts: list[int]
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The split in which image i appears counts[i] times (fresh ids for each copy)."""
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for img, n in zip(gt["images"], counts, strict=True):
        for _ in range(n):
            new_id = len(images) + 1
            images.append({**img, "id": new_id})
            anns += [{**a, "id": len(anns) + k + 1, "image_id": new_id}
                     for k, a in enumerate(a for a in gt["annotations"] if a["image_id"] == img["id"])]
            out += [{**d, "image_id": new_id} for d in dets if d["image_id"] == img["id"]]
    return {**gt, "images": images, "annotations": anns}, out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), counts=st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_weights_score_the_split_with_images_repeated_that_many_times(seed: int, counts: list[int]) -> None:
    # The bootstrap's premise: a resample (image multiplicities) is scored as if those images were
    # really there so many times. Catches: weights applied to TPs but not FPs (or not to the GT count).
    gt, dets = small_split(seed)
    big_gt, big_dets = repeated(gt, dets, counts)
    matches = matches_from_coco(gt, dets, "bbox")
    ours = {name: float(weighted_ap(m, np.asarray([counts]))[0]) for name, m in matches.items()}
    if not big_gt["images"] or not big_dets:
        return
    reference, _ = coco_per_class(big_gt, big_dets, "bbox")
    for name, ap in ours.items():
        if name in reference:
            assert ap == pytest.approx(reference[name], abs=1e-9), name
        else:  # no GT of the class among the repeated images: COCO leaves it out, we say NaN
            assert np.isnan(ap), name


def test_thresholds_reached_is_a_searchsorted_on_cocos_own_floats() -> None:
    # Catches: floor(100 * recall) + 1 alone, which is off by one where k/100 is not exact in binary.
    recall = np.concatenate([np.arange(0, 101) / 100, np.linspace(0, 1, 10_007), [0.07, 0.29, 0.57, 0.58]])
    expected = np.searchsorted(bootstrap.RECALL_THRESHOLDS, recall, side="right")
    assert np.array_equal(bootstrap._thresholds_reached(recall), expected)


def synthetic(seed: int, n_images: int = 120, classes: int = 3, drop: str | None = None) -> dict[str, ClassMatches]:
    """One model's ClassMatches on a fixed GT: each GT found with probability .7 at a random IoU, plus FPs."""
    truth = np.random.default_rng(0)
    rng = np.random.default_rng(seed)
    out = {}
    for k in range(classes):
        gt = truth.poisson(1.0, n_images)
        img = np.repeat(np.arange(n_images), gt)
        found = rng.random(img.size) < (0.0 if drop == f"c{k}" else 0.7)
        fp_img = rng.integers(0, n_images, n_images // 2)
        det_image = np.concatenate([img[found], fp_img])
        iou = np.concatenate([rng.uniform(0.45, 1.0, found.sum()), np.zeros(fp_img.size)])
        score = np.concatenate([rng.uniform(0.3, 1.0, found.sum()), rng.uniform(0.0, 0.8, fp_img.size)])
        order = np.argsort(-score, kind="mergesort")
        tp = iou[order][None, :] >= bootstrap.IOU_THRESHOLDS[:, None]
        out[f"c{k}"] = ClassMatches(gt, det_image[order], tp, np.zeros_like(tp))
    return out


def run(challenger: dict[str, ClassMatches], champion: dict[str, ClassMatches], **options: Any) -> Any:
    n = next(iter(challenger.values())).gt_per_image.size
    kwargs: dict[str, Any] = {"metric": "bbox_AP", "n_images": n, "resamples": 300, "confidence": 0.9, "seed": 4,
                              "judged_classes": list(challenger)}
    return compare(challenger, champion, **{**kwargs, **options})


def test_a_model_compared_with_itself_has_a_zero_width_interval_at_zero() -> None:
    # Paired: the same resample scores both. Catches drawing the two models' resamples apart.
    model = synthetic(1)
    result = run(model, model)
    for interval in [result.overall, *result.per_class.values()]:
        assert (interval.difference, interval.low, interval.high, interval.half_width) == (0.0, 0.0, 0.0, 0.0)


def test_the_overall_interval_is_percentile_and_each_class_s_is_normal_at_a_bonferroni_level() -> None:
    # Catches: champion - challenger, alpha instead of alpha / 2, no Bonferroni, percentile ends per class (which
    # rest on the one or two most extreme resamples), a fixed or ignored seed.
    challenger, champion = synthetic(2), synthetic(3)
    result = run(challenger, champion, confidence=0.9, judged_classes=["c0", "c2"])
    weights = bootstrap.resample_weights(120, 300, 4)
    diff = {c: weighted_ap(challenger[c], weights) - weighted_ap(champion[c], weights) for c in challenger}
    ones = np.ones((1, 120))
    point = {c: float(weighted_ap(challenger[c], ones)[0] - weighted_ap(champion[c], ones)[0]) for c in challenger}
    overall = np.mean([np.where(np.isnan(diff[c]), point[c], diff[c]) for c in challenger], axis=0)
    assert (result.overall.low, result.overall.high) == pytest.approx(tuple(np.quantile(overall, [0.05, 0.95])))
    assert result.overall.method == "percentile"
    assert set(result.per_class) == {"c0", "c2"}
    c2 = result.per_class["c2"]
    assert c2.confidence == pytest.approx(1 - 0.1 / 2) and c2.method == "normal"
    z = NormalDist().inv_cdf(1 - 0.05 / 2)
    sd = float(np.std(diff["c2"][~np.isnan(diff["c2"])], ddof=1))
    assert (c2.low, c2.high) == pytest.approx((point["c2"] - z * sd, point["c2"] + z * sd))
    assert result.overall.difference == pytest.approx(np.mean(list(point.values())))
    assert c2.difference == pytest.approx(point["c2"])
    # every listed class's own upper end, at the Bonferroni level over all three (judged or not)
    z_all = NormalDist().inv_cdf(1 - 0.1 / 3 / 2)
    assert result.classes["c2"].high == pytest.approx(point["c2"] + z_all * sd)
    assert run(challenger, champion, judged_classes=["c0", "c2"], confidence=0.9) == result  # seeded
    assert run(challenger, champion, judged_classes=["c0", "c2"], confidence=0.9, seed=5).overall != result.overall


def test_a_lost_class_is_a_significant_regression_of_that_class_and_overall() -> None:
    champion = synthetic(6)
    challenger = {**champion, "c1": synthetic(6, drop="c1")["c1"]}
    result = run(challenger, champion)
    lost = result.per_class["c1"]
    assert lost.challenger == 0.0 and lost.champion > 0.15 and lost.low <= lost.difference <= lost.high < -0.1
    assert result.per_class["c0"].difference == 0.0  # the other classes are the same detections
    assert result.overall.high < 0 and result.overall.difference == pytest.approx(-result.per_class["c1"].champion / 3)
    assert {c: r.difference for c, r in result.classes.items()} == {c: r.difference for c, r in
                                                                   result.per_class.items()}


def rare(model: dict[str, ClassMatches], images: list[int], found: bool) -> ClassMatches:
    """A class with 4 GT on each of ``images`` (of 40), found at IoU 0.9 by a model that finds it."""
    gt = np.zeros(40, dtype=np.int64)
    gt[images] = 4
    det_image = np.repeat(np.asarray(images), 4) if found else np.zeros(0, dtype=np.int64)
    tp = np.ones((len(bootstrap.IOU_THRESHOLDS), det_image.size), dtype=bool)
    return ClassMatches(gt, det_image, tp, np.zeros_like(tp))


def test_a_rare_class_wiped_out_weighs_in_every_resample() -> None:
    """A class on 2 of 40 images is missing from about e^-2 = 14 % of resamples; averaging over the classes
    present there let those resamples show no loss, and the interval's top reached 0 (issue 30: a class falling
    from 0.68 to 0 was approved). Mutation: the overall of a resample averaged over the classes present only."""
    base = {name: ClassMatches(m.gt_per_image[:40], m.det_image[m.det_image < 40], m.det_tp[:, m.det_image < 40],
                               m.det_ignore[:, m.det_image < 40]) for name, m in synthetic(6, n_images=120).items()}
    champion = {**base, "rare": rare(base, [3, 17], found=True)}
    challenger = {**base, "rare": rare(base, [3, 17], found=False)}
    result = compare(challenger, champion, metric="bbox_AP", n_images=40, resamples=1000, confidence=0.95, seed=0,
                     judged_classes=[])
    drop = result.classes["rare"].champion / len(champion)  # the rare class's whole AP, over 4 classes
    assert result.classes["rare"].challenger == 0.0 and result.classes["rare"].images == 2
    assert result.overall.difference == pytest.approx(-drop)
    # Every resample carries the rare class's loss: the interval is the point (the other classes are identical).
    assert result.overall.high == pytest.approx(-drop) and result.overall.high < -0.2
    assert result.classes["rare"].high == pytest.approx(result.classes["rare"].difference)  # lost in every resample


def test_each_end_carries_its_monte_carlo_error_and_it_shrinks_with_more_resamples() -> None:
    """The report says how far another seed could move each end. Mutation: no error reported, or one that does
    not fall with the resamples (about 1 / sqrt(resamples))."""
    challenger, champion = synthetic(2), synthetic(3)
    few = run(challenger, champion, resamples=200, judged_classes=["c0"])
    many = run(challenger, champion, resamples=3200, judged_classes=["c0"])
    for interval in (few.overall, few.per_class["c0"]):
        assert interval.low_mc_error is not None and 0 < interval.low_mc_error < interval.half_width
        assert interval.high_mc_error is not None and 0 < interval.high_mc_error < interval.half_width
    assert many.per_class["c0"].low_mc_error < few.per_class["c0"].low_mc_error / 2.5  # 4 = sqrt(3200 / 200)
    assert many.overall.low_mc_error < few.overall.low_mc_error
    # The ends of different seeds differ by about that much (several errors at most, not tens).
    seeds = [run(challenger, champion, resamples=400, judged_classes=["c0"], seed=s).per_class["c0"].low
             for s in range(8)]
    error = run(challenger, champion, resamples=400, judged_classes=["c0"]).per_class["c0"].low_mc_error
    assert float(np.std(seeds, ddof=1)) < 4 * error


def test_a_class_that_a_resample_misses_contributes_its_point_difference() -> None:
    # Catches NaN poisoning the mean, or a missing class counted as a difference of 0.
    differences = np.array([0.1, np.nan, -0.2])
    assert np.allclose(bootstrap.class_differences(differences, -0.5), [0.1, -0.5, -0.2])


def test_bad_inputs_name_the_problem() -> None:
    model = synthetic(1)
    with pytest.raises(ValueError, match="classes differ"):
        run(model, {k: v for k, v in model.items() if k != "c0"})
    with pytest.raises(ValueError, match=r"judged classes with no matches: \['zebra'\]"):
        run(model, model, judged_classes=["zebra"])
    c0 = model["c0"]
    other = {**model, "c0": ClassMatches(c0.gt_per_image + 1, c0.det_image, c0.det_tp, c0.det_ignore)}
    with pytest.raises(ValueError, match="different ground truth"):
        run(other, model)
    with pytest.raises(ValueError, match="both a true positive and ignored"):
        ClassMatches(np.ones(2, int), np.zeros(1, int), np.ones((10, 1), bool), np.ones((10, 1), bool))


def report(**extra: Any) -> dict[str, Any]:
    side = {"metrics": {"bbox_AP": 0.5}, "per_class": {}}
    return {"primary_metric": "bbox_AP", "val_images": 10, "class_instances": {}, "challenger": side, **extra}


def test_a_report_with_a_champion_must_say_which_images_it_compared() -> None:
    # Catches the gate judging a champion's comparison without knowing which val images were held out.
    side = {"metrics": {"bbox_AP": 0.4}, "per_class": {}}
    with pytest.raises(ValidationError, match="held_out is required when there is a champion"):
        EvaluationReport.model_validate(report(champion=side))
    model = synthetic(1, n_images=10)
    comparison = run(model, model).model_dump()
    held = {"compared": 10}
    assert EvaluationReport.model_validate(report(champion=side, comparison=comparison,
                                                  held_out=held)).comparison is not None
    with pytest.raises(ValidationError, match="without a champion"):
        EvaluationReport.model_validate(report(comparison=comparison))
    with pytest.raises(ValidationError, match=r"is not held_out\.compared 9"):
        EvaluationReport.model_validate(report(champion=side, comparison=comparison, held_out={"compared": 9}))


def test_resamples_scored_in_blocks_equal_resamples_scored_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Large splits are scored a block of resamples at a time (memory). Catches a block paired with
    # another block's GT counts or weights.
    matches = synthetic(8)["c1"]
    weights = bootstrap.resample_weights(120, 50, 9)
    whole = weighted_ap(matches, weights)
    monkeypatch.setattr(bootstrap, "_BLOCK_ELEMENTS", 7 * matches.det_image.size)  # 7 resamples a block
    assert np.allclose(weighted_ap(matches, weights), whole, rtol=0, atol=1e-12)  # summation order aside
    assert len(set(np.round(whole, 12))) > 10  # the resamples really differ
