"""make bench-gate's own code at a small size: its known truth, its correlated models, its two rules."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from d2ops.bench import gate as bench

SMALL = replace(bench.Scenario(), images=200, classes=4)


def test_the_calibrated_challenger_is_exactly_the_drop_under_the_champion_on_the_population() -> None:
    # Catches a bisection that stops at the wrong skill (or lowers the wrong class): the bench's "2 points"
    # would not be 2 points.
    truth = bench.calibrate(SMALL, population=5_000, seed=1)
    assert truth.champion_ap - truth.challenger_ap == pytest.approx(bench.DROP, abs=1e-4)  # AP moves in steps
    assert truth.class_drop == pytest.approx(bench.DROP * SMALL.classes, abs=4e-4)
    assert 0 < truth.skill_drop < 4 and 0.2 < truth.champion_ap < 0.8
    # Another population (other objects, other noise) agrees within its sampling error: the truth is the
    # scenario's, not one draw's.
    other = bench.calibrate(SMALL, population=5_000, seed=2)
    assert other.skill_drop == pytest.approx(truth.skill_drop, abs=0.05)


def test_the_two_models_make_correlated_errors_as_the_scenario_says() -> None:
    # Catches a simulation whose models do not share the objects' difficulty (independent errors make
    # the paired difference far noisier than two models trained on the same data).
    def spread(shared: float) -> float:
        s = replace(SMALL, shared=shared)
        skills = s.class_skills()
        diffs = []
        for i in range(12):
            rng = np.random.default_rng([7, i])
            world = bench.draw_world(s, rng, s.images)
            a, b = bench.detect(s, world, rng, skills), bench.detect(s, world, rng, skills)
            ones = np.ones((1, s.images))
            diffs.append(np.mean([bench.weighted_ap(a[c], ones)[0] - bench.weighted_ap(b[c], ones)[0] for c in a]))
        return float(np.std(diffs))

    assert spread(0.95) < 0.5 * spread(0.0)


def test_the_rules_refuse_a_lost_class_and_approve_the_same_model() -> None:
    # Catches rules compared with the wrong sign or on the wrong side of the interval.
    rng = np.random.default_rng(3)
    world = bench.draw_world(SMALL, rng, SMALL.images)
    champion = bench.detect(SMALL, world, rng, SMALL.class_skills())
    same = bench.judge(champion, champion, resamples=200, confidence=0.95, seed=0)
    assert not same.old and not same.new and same.difference == 0.0
    lost = {**champion, "class00": bench.detect(SMALL, world, rng, SMALL.class_skills() - np.array([9, 0, 0, 0]))[
        "class00"]}
    worse = bench.judge(lost, champion, resamples=200, confidence=0.95, seed=0)
    assert worse.old and worse.new and worse.difference < -0.05


def test_a_small_run_ends_with_one_json_line_of_rates(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--trials", "3", "--spread-trials", "2", "--images", "150", "--classes", "3",
                       "--resamples", "100", "--population", "3000", "--workers", "1"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("caught_rate", "false_block_rate", "old_caught_rate", "old_false_block_rate"):
        assert last[key] in {0.0, 1 / 3, 2 / 3, 1.0}, key
    assert last["trials"] == 3 and last["images"] == 150 and last["resamples"] == 100
    assert last["spread_caught_rate"] in {0.0, 0.5, 1.0} and last["spread_trials"] == 2
    assert last["true_champion_ap"] - last["true_challenger_ap"] == pytest.approx(bench.DROP, abs=1e-3)


def test_the_standard_error_never_claims_certainty() -> None:
    assert bench.standard_error(0.5, 400) == pytest.approx(0.025)
    assert bench.standard_error(0.0, 400) > 0
