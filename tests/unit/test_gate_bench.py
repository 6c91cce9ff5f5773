"""make bench-gate's own code at a small size: its truth, its correlated models, the product's decision, its
val-size answer and its JSON line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from d2ops.bench import gate as bench
from d2ops.bench import gate_simulation as sim
from d2ops_core.gate import DEFAULT_MAX_REGRESSION
from model_code.evaluation.bootstrap import weighted_ap

SMALL = sim.Scenario(classes=3)


def _pair(s: sim.Scenario, images: int, seed: int) -> tuple[list[sim.ClassWorld], dict, dict, list[sim.ClassNoise]]:
    rng = np.random.default_rng(seed)
    world = sim.draw_world(s, rng, images)
    champion = sim.model_matches(s, world, sim.draw_noise(world, rng), s.class_skills())
    noise = sim.draw_noise(world, rng)
    return world, champion, sim.model_matches(s, world, noise, s.class_skills()), noise


def test_the_truth_is_the_products_coco_ap() -> None:
    # Catches a population AP that is not COCO's (another interpolation, recall thresholds, or IoU rule): the
    # curves' "true difference" would then be in other units than the gate's.
    s = replace(SMALL, classes=5)
    world, champion, _, _ = _pair(s, 300, 4)
    rng = np.random.default_rng(5)
    noise = sim.draw_noise(world, rng)
    for i, (c, n) in enumerate(zip(world, noise, strict=True)):
        ours = sim.population_ap(s, c, n, float(s.class_skills()[i]))
        matches = sim.class_matches(s, c, n, float(s.class_skills()[i]))
        assert ours == pytest.approx(float(weighted_ap(matches, np.ones((1, 300)))[0]), abs=1e-12)
    assert any(m.det_tp.any() for m in champion.values())


@pytest.mark.parametrize("location", ["median", "rare", "spread"])
def test_the_calibrated_challenger_is_the_true_difference_it_claims(location: sim.Location) -> None:
    # Catches a bisection that stops at the wrong skill, lowers the wrong class, or reports its target instead
    # of what it reached: the curves' x axis would not be the true difference.
    population, seed = 8_000, 3
    found, infeasible = sim.calibrate(SMALL, location, (-0.01, -0.04), population, seed)
    assert not infeasible and [c.target for c in found] == [-0.01, -0.04]
    world, noise = sim.population(SMALL, population, seed)
    ones = np.ones((1, population))
    skills = SMALL.class_skills()

    def primary(drop: float) -> float:  # recomputed with the product's own AP, independently of the bisection
        lowered = skills.copy()
        lowered[SMALL.damaged(location)] -= drop
        return float(np.mean([weighted_ap(sim.class_matches(SMALL, c, n, float(k)), ones)[0]
                              for c, n, k in zip(world, noise, lowered, strict=True)]))

    champion = primary(0.0)
    for c in found:
        assert primary(c.skill_drop) - champion == pytest.approx(c.difference, abs=1e-9)  # what it claims ...
        assert c.difference == pytest.approx(c.target, abs=2e-4)  # ... is the target, up to one AP step
    assert 0 < found[0].skill_drop < found[1].skill_drop < sim.MAX_SKILL_DROP
    # Another population (other objects, other noise) agrees within its sampling error: the truth is the
    # scenario's, not one draw's.
    other = sim.calibrate(SMALL, location, (-0.04,), population, seed + 1)[0][0]
    assert other.skill_drop == pytest.approx(found[1].skill_drop, rel=0.15)


def test_a_damage_out_of_one_class_reach_is_reported_not_faked() -> None:
    # Catches a bisection that returns its upper bound when no skill drop reaches the target: with 20 classes
    # one class's whole AP is about 2 points of the mean.
    s = replace(SMALL, classes=20)
    found, infeasible = sim.calibrate(s, "rare", (-0.01, -0.05), 5_000, 0)
    assert [c.target for c in found] == [-0.01] and infeasible == [("rare", -0.05)]


def test_the_two_models_make_correlated_errors_as_the_scenario_says() -> None:
    # Catches a simulation whose models do not share the objects' difficulty (independent errors make the
    # paired difference far noisier than two models trained on the same data).
    def spread(correlation: float) -> float:
        s = replace(SMALL, correlation=correlation)
        diffs = []
        for i in range(12):
            _, a, b, _ = _pair(s, 200, 100 + i)
            ones = np.ones((1, 200))
            diffs.append(np.mean([weighted_ap(a[c], ones)[0] - weighted_ap(b[c], ones)[0] for c in a]))
        return float(np.std(diffs))

    assert spread(0.95) < 0.5 * spread(0.0)


def test_the_bench_decides_with_the_products_thresholds() -> None:
    # Catches a bench that judges with other thresholds than it prints (MinComparedImages, MaxClassRegression)
    # or reads the decision from the wrong side of the interval.
    settings = bench.Settings(resamples=200)
    world, champion, _, noise = _pair(SMALL, 200, 7)
    same = bench.decide(champion, champion, settings, 0)
    assert same.decision == "approve" and same.interval is not None and same.interval.difference == 0.0
    rare = SMALL.damaged("rare")[0]
    lost = {**champion, sim.class_name(rare): sim.class_matches(SMALL, world[rare], noise[rare], -9.0)}
    worse = bench.decide(lost, champion, settings, 0)
    assert worse.decision != "approve" and worse.class_drop_count >= 1
    few = {name: replace(m, gt_per_image=m.gt_per_image[:40], det_image=m.det_image[m.det_image < 40],
                         det_tp=m.det_tp[:, m.det_image < 40], det_ignore=m.det_ignore[:, m.det_image < 40])
           for name, m in champion.items()}
    small = bench.decide(few, few, settings, 0)
    assert small.decision == "review" and small.review_because == ["too_few_images"]
    assert bench.Outcome(None, 0, 0.0, small.decision, tuple(small.review_because), None, 0, 0, 0) \
        .approved_with_enough_images


def _equal(images: int, low: float, dropped: bool = False) -> bench.EqualOutcome:
    approved = tuple(low >= -t and not dropped for t in bench.TOLERANCES)
    return bench.EqualOutcome(images, approved, tuple("approve" if a else "review" for a in approved), dropped,
                              low, 0.0)


def test_val_images_for_approval_interpolates_and_extrapolates() -> None:
    # Catches an answer read off the wrong side of the goal, interpolated on the wrong scale, or extrapolated
    # without the 1/sqrt(images) narrowing.
    t03 = bench.TOLERANCES.index(0.03)
    grid = {100: [_equal(100, -0.02)] * 5 + [_equal(100, -0.04)] * 5,  # approved 0.5 at 0.03
            400: [_equal(400, -0.01)] * 10}  # approved 1.0
    images, how = bench.images_for_approval(grid, t03)
    assert how == "interpolated" and images == round(100 * 4 ** 0.6)  # 0.8 is 60% of the way, in log images
    assert bench.images_for_approval({50: [_equal(50, -0.01)] * 4}, t03) == (50, "at most")
    t01 = bench.TOLERANCES.index(0.01)
    far = {1600: [_equal(1600, -0.02)] * 10}  # the lower end must shrink by 2: four times the images
    assert bench.images_for_approval(far, t01) == (6400, "extrapolated")
    dropped = {1600: [_equal(1600, 0.0, dropped=True)] * 3 + [_equal(1600, 0.0)] * 7}
    assert bench.images_for_approval(dropped, t01) == (None, "extrapolated")


def test_a_quick_run_ends_with_the_json_line_and_writes_the_plot(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    picture = tmp_path / "gate.png"
    assert bench.main(["--quick", "--workers", "1", "--plot", str(picture)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    for key in ("caught_rate", "false_block_rate", "approve_rate_at_minus_5pts_40_images",
                "approve_rate_equal_200_images", "approve_rate_equal_200_images_at_default"):
        assert 0.0 <= last[key] <= 1.0, key
        assert last[f"{key}_trials"] >= 2 and 0 < last[f"{key}_se"] <= 0.5, key
    assert last["settings"]["max_regression"] == DEFAULT_MAX_REGRESSION
    assert last["settings"]["min_compared_images"] == 50 and last["settings"]["max_class_regression"] == 0.10
    # 40 images are under MinComparedImages: the product never approves there.
    assert last["approve_rate_at_minus_5pts_40_images"] == 0.0
    assert 0.0 <= last["approve_rate_at_minus_5pts_40_images_without_min_compared_images"] <= 1.0
    assert last["false_block_rate"] == pytest.approx(1 - last["approve_rate_equal_200_images_at_default"])
    # the figure is at MaxRegression 0.03, whatever the default: never more approvals than at the default 0.05
    assert last["approve_rate_equal_200_images_max_regression"] == 0.03
    assert last["approve_rate_equal_200_images"] <= last["approve_rate_equal_200_images_at_default"]
    assert {(a["classes"], a["correlation"], a["tolerance"]) for a in last["val_images_for_80pct_approval"]} == {
        (k, r, t) for k in bench.CLASS_COUNTS for r in bench.CORRELATIONS for t in bench.TOLERANCES}
    for truth in last["truth"].values():  # the bench's own calibration hits the differences it claims
        assert truth["max_calibration_error"] < 2e-4
    assert "20 classes, r=0.8" in last["truth"] and "rare -5" in last["truth"]["20 classes, r=0.8"]["out_of_reach"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("approve / review / refuse" in line for line in out)


def test_the_standard_error_never_claims_certainty() -> None:
    assert bench.standard_error(0.5, 400) == pytest.approx(0.025)
    assert 0 < bench.standard_error(0.0, 400) < 0.02
    assert math.isclose(bench.standard_error(1.0, 100), bench.standard_error(0.0, 100))
