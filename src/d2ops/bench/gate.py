"""``make bench-gate``: how often the quality gate catches a real regression and refuses an equal model,
today's rule (point estimates) beside the new one (the paired bootstrap's interval), on simulated
detections whose truth is known.

No training and no images: each trial draws a val split of ``--images`` images and both models'
detections on it as :class:`~model_code.evaluation.bootstrap.ClassMatches` (what COCO's matching
yields), and judges it with both rules. The new rule is the product's own
:func:`~model_code.evaluation.bootstrap.compare`.

The simulation (the assumptions the figures rest on; see docs/benchmarks.md):

- Per class, objects per image are Poisson (classes of unequal frequency); confusers (background
  that looks like the class) too. Every object and confuser gets one detection from each model (a
  detector run at score threshold 0 scores everything; a weak one ranks low).
- A detection's *evidence* is the model's class skill ``mu`` plus ``spread`` x a unit-variance mix of
  a part **shared by the two models** (the object's difficulty, partly its image's: the same hard
  objects are missed by both) and a part of the model's own. ``--shared`` is the shared share of the
  variance (default 0.8): the correlation of the two models' evidence on the same object. The score
  is the evidence's rank; the box's IoU with its object is ``sigmoid(iou_bias + iou_slope * evidence
  + localisation noise)``, the localisation noise again shared in the same proportion, so a model
  that sees an object well also boxes it tightly. Confusers are false positives at every threshold.
- **The known truth** is each model's AP on a large population of images (``--population``). Case
  (a)'s challenger loses skill on one class only; how much is found by bisection on that population
  (common random numbers) so that its true primary AP is exactly 2 points under the champion's. Case
  (b)'s challenger has the champion's parameters: the same true AP, its own errors. Case (c)'s
  challenger loses the same 2 points spread over every class (``--spread-trials``).

Rules, as the gate applies them (MaxRegression 0.01, MaxClassRegression 0.10, MinClassInstances 30):
today's refuses when the point difference is below -0.01 overall or -0.10 on a class with at least
30 val instances; the new one when the interval's upper end is below those (confidence 0.95,
Bonferroni per class, 1000 resamples). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from d2ops.bench import cpu_model
from model_code.evaluation.bootstrap import IOU_THRESHOLDS, ClassMatches, compare, weighted_ap

MAX_REGRESSION = 0.01  # the stack's MaxRegression default
MAX_CLASS_REGRESSION = 0.10  # MaxClassRegression
MIN_CLASS_INSTANCES = 30  # MinClassInstances
DROP = 0.02  # case (a): the challenger's true primary AP this far under the champion's


@dataclass(frozen=True)
class Scenario:
    """The simulated world; the defaults are the figures in docs/benchmarks.md."""

    images: int = 500
    classes: int = 10
    objects_per_image: float = 2.5  # over all classes
    confusers_per_image: float = 2.5  # background detections over all classes
    shared: float = 0.8  # share of a detection's evidence variance the two models share
    image_share: float = 0.3  # of the shared part, the share that is the image's (hard images)
    spread: float = 1.5  # evidence standard deviation around a model's class skill
    skill: float = 0.8  # mean class skill (evidence units); classes spread around it
    confuser_skill: float = -1.2  # a confuser's mean evidence
    iou_bias: float = 1.0
    iou_slope: float = 0.35
    iou_noise: float = 0.6

    def class_rates(self) -> np.ndarray:
        """Objects per image of each class: frequencies from 1.5 down to 0.5 of the mean."""
        weights = np.linspace(1.5, 0.5, self.classes)
        return self.objects_per_image * weights / weights.sum()

    def class_skills(self) -> np.ndarray:
        return self.skill + np.linspace(0.6, -0.6, self.classes)


@dataclass
class World:
    """One draw of val images: per class, each object's and confuser's image and shared latents."""

    images: int
    objects: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per class: (image, difficulty, localisation)
    confusers: list[tuple[np.ndarray, np.ndarray]]  # per class: (image, strength)


def draw_world(s: Scenario, rng: np.random.Generator, images: int) -> World:
    image_difficulty = rng.standard_normal(images)
    objects, confusers = [], []
    confuser_rate = s.confusers_per_image / s.classes
    for rate in s.class_rates():
        img = np.repeat(np.arange(images), rng.poisson(rate, images))
        shared = math.sqrt(s.image_share) * image_difficulty[img] + math.sqrt(1 - s.image_share) * rng.standard_normal(
            img.size)
        objects.append((img, shared, rng.standard_normal(img.size)))
        fp_img = np.repeat(np.arange(images), rng.poisson(confuser_rate, images))
        confusers.append((fp_img, rng.standard_normal(fp_img.size)))
    return World(images, objects, confusers)


def detect(s: Scenario, world: World, rng: np.random.Generator, skills: np.ndarray,
           only: int | None = None) -> dict[str, ClassMatches]:
    """One model's ClassMatches on ``world`` (its own noise from ``rng``); ``only``: that class alone."""
    out: dict[str, ClassMatches] = {}
    streams = rng.spawn(len(world.objects))  # one per class: `only` draws the same noise for its class
    for c, ((img, difficulty, localisation), (fp_img, strength)) in enumerate(
            zip(world.objects, world.confusers, strict=True)):
        if only is not None and c != only:
            continue
        own = streams[c]
        own_object, own_loc, own_fp = (own.standard_normal(img.size), own.standard_normal(img.size),
                                       own.standard_normal(fp_img.size))
        share = s.shared
        evidence = skills[c] + s.spread * (math.sqrt(share) * difficulty + math.sqrt(1 - share) * own_object)
        loc = math.sqrt(share) * localisation + math.sqrt(1 - share) * own_loc
        iou = 1.0 / (1.0 + np.exp(-(s.iou_bias + s.iou_slope * evidence + s.iou_noise * loc)))
        fp_evidence = s.confuser_skill + s.spread * (math.sqrt(share) * strength + math.sqrt(1 - share) * own_fp)
        score = np.concatenate([evidence, fp_evidence])
        order = np.argsort(-score, kind="mergesort")
        tp = np.concatenate([iou, np.zeros(fp_img.size)])[order][None, :] >= IOU_THRESHOLDS[:, None]
        gt = np.bincount(img, minlength=world.images)
        out[f"class{c:02d}"] = ClassMatches(gt, np.concatenate([img, fp_img])[order], tp, np.zeros_like(tp))
    return out


def true_class_ap(s: Scenario, world: World, seed: int, skills: np.ndarray, c: int) -> float:
    """Class ``c``'s AP on a population ``world`` (a model's noise drawn from ``seed``)."""
    matches = detect(s, world, np.random.default_rng(seed), skills, only=c)[f"class{c:02d}"]
    return float(weighted_ap(matches, np.ones((1, world.images)))[0])


@dataclass(frozen=True)
class Truth:
    champion_ap: float  # the champion's true primary AP (mean of the class APs on the population)
    class_drop: float  # case (a): the degraded class's true AP drop
    skill_drop: float  # how much class skill (evidence units) that took
    challenger_ap: float  # case (a)'s challenger's true primary AP
    spread_skill_drop: float = 0.0  # case (c): the skill every class loses for the same primary drop
    spread_challenger_ap: float = 0.0  # case (c)'s challenger's true primary AP


def _bisect(value: Any, target: float, high: float = 4.0, steps: int = 24) -> float:
    """The skill drop in [0, high] at which the decreasing ``value(drop)`` meets ``target``."""
    low = 0.0
    if value(high) > target:
        raise SystemExit(f"no skill drop up to {high} brings the AP down to {target:.4f} in this scenario")
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (mid, high) if value(mid) > target else (low, mid)
    return (low + high) / 2


def true_aps(s: Scenario, world: World, seed: int, skills: np.ndarray) -> np.ndarray:
    """Every class's AP on a population ``world`` (a model's noise drawn from ``seed``)."""
    matches = detect(s, world, np.random.default_rng(seed), skills)
    ones = np.ones((1, world.images))
    return np.array([float(weighted_ap(m, ones)[0]) for m in matches.values()])


def calibrate(s: Scenario, population: int, seed: int, spread: bool = False) -> Truth:
    """The skill drops that put the challengers exactly ``DROP`` under the champion on a population.

    Case (a): class 0 alone loses skill. Case (c) (``spread``): every class loses the same skill.
    Common random numbers: the same population and noise at every step of the bisection.
    """
    world = draw_world(s, np.random.default_rng([seed, 1]), population)
    skills = s.class_skills()
    per_class = [true_class_ap(s, world, seed, skills, c) for c in range(s.classes)]
    champion = float(np.mean(per_class))

    def degraded(skill_drop: float) -> float:
        lowered = skills.copy()
        lowered[0] -= skill_drop
        return true_class_ap(s, world, seed, lowered, 0)

    drop = _bisect(degraded, per_class[0] - DROP * s.classes)  # the whole drop on class 0
    class_ap = degraded(drop)
    truth = Truth(champion_ap=champion, class_drop=per_class[0] - class_ap, skill_drop=drop,
                  challenger_ap=champion + (class_ap - per_class[0]) / s.classes)
    if not spread:
        return truth
    spread_drop = _bisect(lambda d: float(np.mean(true_aps(s, world, seed, skills - d))), champion - DROP)
    return replace(truth, spread_skill_drop=spread_drop,
                   spread_challenger_ap=float(np.mean(true_aps(s, world, seed, skills - spread_drop))))


@dataclass(frozen=True)
class Verdicts:
    old: bool  # today's rule refuses
    new: bool  # the interval rule refuses
    difference: float  # the point difference of the primary AP
    half_width: float  # the overall interval's half width
    seconds: float  # compare()'s time


def judge(challenger: dict[str, ClassMatches], champion: dict[str, ClassMatches], *, resamples: int,
          confidence: float, seed: int) -> Verdicts:
    instances = {c: int(m.gt_per_image.sum()) for c, m in champion.items()}
    judged = [c for c, n in instances.items() if n >= MIN_CLASS_INSTANCES]
    n_images = next(iter(champion.values())).gt_per_image.size
    start = time.perf_counter()
    comparison = compare(challenger, champion, metric="bbox_AP", n_images=n_images, resamples=resamples,
                         confidence=confidence, seed=seed, judged_classes=judged)
    seconds = time.perf_counter() - start
    # The rules compare with a margin of float noise so that an exact tie at the tolerance is not a drop.
    old = (comparison.overall.difference < -MAX_REGRESSION - 1e-12
           or any(comparison.per_class[c].difference < -MAX_CLASS_REGRESSION - 1e-12 for c in judged))
    new = (comparison.overall.high < -MAX_REGRESSION
           or any(comparison.per_class[c].high < -MAX_CLASS_REGRESSION for c in judged))
    return Verdicts(old=old, new=new, difference=comparison.overall.difference,
                    half_width=comparison.overall.half_width, seconds=seconds)


def trial(s: Scenario, truth: Truth, case: str, index: int, seed: int, resamples: int,
          confidence: float) -> Verdicts:
    """One val split and both models on it; case "regressed" (a), "equal" (b) or "spread" (c)."""
    rng = np.random.default_rng([seed, 2, index])
    world = draw_world(s, rng, s.images)
    skills = s.class_skills()
    champion = detect(s, world, rng, skills)
    challenger_skills = skills.copy()
    if case == "regressed":
        challenger_skills[0] -= truth.skill_drop
    elif case == "spread":
        challenger_skills -= truth.spread_skill_drop
    challenger = detect(s, world, rng, challenger_skills)
    return judge(challenger, champion, resamples=resamples, confidence=confidence, seed=index)


def _trial_star(job: tuple[Scenario, Truth, str, int, int, int, float]) -> Verdicts:
    return trial(*job)


def run(s: Scenario, *, trials: int, resamples: int, confidence: float, population: int, seed: int,
        workers: int, spread_trials: int = 0) -> dict[str, Any]:
    truth = calibrate(s, population, seed, spread=spread_trials > 0)
    jobs = [(s, truth, case, i, seed, resamples, confidence) for case in ("regressed", "equal") for i in range(trials)]
    jobs += [(s, truth, "spread", i, seed, resamples, confidence) for i in range(spread_trials)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            verdicts = list(pool.map(_trial_star, jobs, chunksize=max(1, len(jobs) // (8 * workers))))
    else:
        verdicts = [_trial_star(job) for job in jobs]
    regressed, equal, spread = verdicts[:trials], verdicts[trials:2 * trials], verdicts[2 * trials:]

    def rate(vs: list[Verdicts], rule: str) -> float:
        return sum(getattr(v, rule) for v in vs) / len(vs)

    return {"truth": truth, "caught_rate": rate(regressed, "new"), "false_block_rate": rate(equal, "new"),
            "old_caught_rate": rate(regressed, "old"), "old_false_block_rate": rate(equal, "old"),
            "spread_caught_rate": rate(spread, "new") if spread else None,
            "old_spread_caught_rate": rate(spread, "old") if spread else None,
            "mean_difference_regressed": float(np.mean([v.difference for v in regressed])),
            "mean_difference_equal": float(np.mean([v.difference for v in equal])),
            "sd_difference_equal": float(np.std([v.difference for v in equal])),
            "mean_half_width": float(np.mean([v.half_width for v in verdicts])),
            "compare_seconds": float(np.mean([v.seconds for v in verdicts]))}


def standard_error(rate: float, trials: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 0.25 / trials) / trials)  # no zero for a 0 or 1 rate


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d2ops.bench.gate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=500, help="trials of cases (a) and (b) (default 500)")
    parser.add_argument("--spread-trials", type=int, default=250,
                        help="trials of case (c), the same drop spread over every class (default 250; 0: skip)")
    parser.add_argument("--images", type=int, default=Scenario.images, help="val images (default 500)")
    parser.add_argument("--classes", type=int, default=Scenario.classes, help="classes (default 10)")
    parser.add_argument("--shared", type=float, default=Scenario.shared,
                        help="share of the evidence variance the two models share (default 0.8)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--population", type=int, default=100_000, help="images of the truth's population")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if args.trials < 1 or args.images < 10 or args.classes < 1 or not 0 <= args.shared < 1:
        parser.error("--trials >= 1, --images >= 10, --classes >= 1 and 0 <= --shared < 1")
    s = replace(Scenario(), images=args.images, classes=args.classes, shared=args.shared)
    load = os.getloadavg()[0]
    print(f"{args.trials} trials a case, {s.images} val images, {s.classes} classes, shared {s.shared}; "
          f"{args.resamples} resamples at {args.confidence}; CPU {cpu_model()}, {os.cpu_count()} cores, "
          f"load {load:.1f}", flush=True)
    start = time.perf_counter()
    result = run(s, trials=args.trials, resamples=args.resamples, confidence=args.confidence,
                 population=args.population, seed=args.seed, workers=args.workers, spread_trials=args.spread_trials)
    seconds = time.perf_counter() - start
    truth: Truth = result["truth"]
    n = args.trials
    print(f"truth ({args.population:,} images): champion AP {truth.champion_ap:.4f}; case (a) challenger "
          f"{truth.challenger_ap:.4f} (class 0 -{truth.class_drop:.3f}, skill -{truth.skill_drop:.3f})")
    print(f"observed point difference: (a) mean {result['mean_difference_regressed']:+.4f}; (b) mean "
          f"{result['mean_difference_equal']:+.4f}, sd {result['sd_difference_equal']:.4f}; mean interval half "
          f"width {result['mean_half_width']:.4f}")
    rows = [("caught (a)", "caught_rate", n), ("refused equal (b)", "false_block_rate", n)]
    if args.spread_trials:
        print(f"case (c): every class loses skill {truth.spread_skill_drop:.3f}, true primary AP "
              f"{truth.spread_challenger_ap:.4f}")
        rows.append(("caught spread (c)", "spread_caught_rate", args.spread_trials))
    for label, key, count in rows:
        new, old = result[key], result[f"old_{key}"]
        print(f"{label:>18}: today's rule {old:.3f} +/- {standard_error(old, count):.3f}   interval rule "
              f"{new:.3f} +/- {standard_error(new, count):.3f}   (1 standard error, {count} trials)")
    print(f"compare(): {result['compare_seconds']:.3f} s a trial; {seconds:.0f} s in all, load "
          f"{os.getloadavg()[0]:.1f}")
    out = {"bench": "gate", "trials": n, "images": s.images, "classes": s.classes, "shared": s.shared,
           "resamples": args.resamples, "confidence": args.confidence, "scenario": asdict(s),
           "true_champion_ap": round(truth.champion_ap, 4), "true_challenger_ap": round(truth.challenger_ap, 4),
           "true_class_drop": round(truth.class_drop, 4),
           "old_caught_rate": result["old_caught_rate"], "old_false_block_rate": result["old_false_block_rate"],
           "caught_rate_se": round(standard_error(result["caught_rate"], n), 4),
           "false_block_rate_se": round(standard_error(result["false_block_rate"], n), 4),
           "caught_ratio_new_old": _ratio(result["caught_rate"], result["old_caught_rate"]),
           "false_block_ratio_new_old": _ratio(result["false_block_rate"], result["old_false_block_rate"]),
           "spread_trials": args.spread_trials, "spread_caught_rate": result["spread_caught_rate"],
           "old_spread_caught_rate": result["old_spread_caught_rate"],
           "mean_half_width": round(result["mean_half_width"], 4),
           "compare_seconds": round(result["compare_seconds"], 3), "seconds": round(seconds, 1),
           "cpu": cpu_model(), "load": round(load, 1),
           "caught_rate": result["caught_rate"], "false_block_rate": result["false_block_rate"]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
