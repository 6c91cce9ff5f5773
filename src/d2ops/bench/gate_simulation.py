"""The world ``make bench-gate`` judges: simulated val images, two models' detections on them, and the truth.

No training and no images. A val split is drawn as objects and confusers (background that looks like a
class) per class; each model gives every one of them a detection, and COCO's matching of those is
:class:`~model_code.evaluation.bootstrap.ClassMatches`, what the evaluation job hands the gate.

- **Classes of unequal frequency.** Objects of class ``c`` per image are Poisson with a rate that is
  itself Gamma-distributed over images (``cluster_shape``: objects of a class come in clusters, so a rare
  class sits on fewer images than it has objects); the classes' mean rates are log-spaced, the most
  frequent ``frequency_ratio`` times the rarest. Confusers follow the same class shares. Frequent classes
  are also the better detected (``skill_range``).
- **Correlated models.** A detection's *evidence* is the model's class skill plus ``spread`` x a
  unit-variance mix of a part **shared by the two models** (the object's difficulty, ``image_share`` of it
  its image's, so hard images are hard for both) and a part of the model's own; ``correlation`` is the
  shared share of the variance, i.e. the correlation of the two models' evidence on one object. The
  score ranks by evidence; the box's IoU with its object is ``sigmoid(iou_bias + iou_slope x evidence +
  iou_noise x localisation)``, the localisation noise shared in the same proportion, so a model that sees
  an object well also boxes it tightly. A confuser is a false positive at every IoU threshold.
- **The truth** is a model's AP on a large population of images (:func:`population_ap`, COCO's AP with
  every image once), its noise held fixed (common random numbers), so the skill a challenger must lose
  for a given true AP difference is found by bisection (:func:`calibrate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from model_code.evaluation.bootstrap import IOU_THRESHOLDS, RECALL_THRESHOLDS, ClassMatches

Location = Literal["median", "rare", "spread"]
LOCATIONS: tuple[Location, ...] = ("median", "rare", "spread")
# The largest skill drop the bisection tries (evidence units; 8 standard deviations of the evidence): a
# class that far down scores below nearly every confuser and boxes nothing at IoU 0.5.
MAX_SKILL_DROP = 12.0
# The bisection stops when the bracket is this narrow (evidence units) ...
SKILL_TOLERANCE = 1e-5
# ... or the difference is this close to its target (AP): far below the bootstrap's resolution.
AP_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Scenario:
    """The simulated world; the defaults are the figures in docs/benchmarks.md."""

    classes: int = 3
    correlation: float = 0.8  # share of a detection's evidence variance the two models share
    objects_per_image: float = 2.5  # over all classes
    confusers_per_image: float = 2.5  # background detections over all classes
    frequency_ratio: float = 10.0  # the most frequent class's objects per image over the rarest's
    cluster_shape: float = 1.0  # Gamma shape of a class's per-image rate (smaller: more clustered)
    image_share: float = 0.3  # of the shared part, the share that is the image's (hard images)
    spread: float = 1.5  # evidence standard deviation around a model's class skill
    skill: float = 0.8  # mean class skill (evidence units)
    skill_range: float = 0.6  # the most frequent class's skill is skill + this, the rarest's skill - this
    confuser_skill: float = -1.2  # a confuser's mean evidence
    iou_bias: float = 1.0
    iou_slope: float = 0.35
    iou_noise: float = 0.6

    def shares(self) -> np.ndarray:
        """Each class's share of the objects (and of the confusers), most frequent first."""
        weights = np.logspace(0.0, -math.log10(self.frequency_ratio), self.classes)
        return weights / weights.sum()

    def class_skills(self) -> np.ndarray:
        if self.classes == 1:
            return np.array([self.skill])
        return self.skill + np.linspace(self.skill_range, -self.skill_range, self.classes)

    def damaged(self, location: Location) -> list[int]:
        """The classes a challenger damaged at ``location`` loses skill on: the median-frequency class, the
        rarest, or every class."""
        if location == "median":
            return [self.classes // 2]
        if location == "rare":
            return [self.classes - 1]
        return list(range(self.classes))


@dataclass(frozen=True)
class ClassWorld:
    """One class on a set of images: its objects and confusers, with the latents both models share."""

    images: int
    object_image: np.ndarray  # (N,) the image of each object
    difficulty: np.ndarray  # (N,) shared evidence latent, unit variance
    localisation: np.ndarray  # (N,) shared localisation latent, unit variance
    confuser_image: np.ndarray  # (F,)
    strength: np.ndarray  # (F,) shared confuser latent, unit variance


@dataclass(frozen=True)
class ClassNoise:
    """One model's own noise on one class: what it does not share with the other model."""

    evidence: np.ndarray  # (N,)
    localisation: np.ndarray  # (N,)
    confuser: np.ndarray  # (F,)


def _counts(rng: np.random.Generator, rate: float, images: int, shape: float) -> np.ndarray:
    if math.isinf(shape):
        return rng.poisson(rate, images)
    return rng.poisson(rate * rng.gamma(shape, 1.0 / shape, images))


def draw_world(s: Scenario, rng: np.random.Generator, images: int) -> list[ClassWorld]:
    """A val split (or a population) of ``images`` images, class by class."""
    image_difficulty = rng.standard_normal(images)
    world = []
    for share in s.shares():
        img = np.repeat(np.arange(images), _counts(rng, s.objects_per_image * share, images, s.cluster_shape))
        own = rng.standard_normal(img.size)
        difficulty = math.sqrt(s.image_share) * image_difficulty[img] + math.sqrt(1 - s.image_share) * own
        fp_img = np.repeat(np.arange(images), rng.poisson(s.confusers_per_image * share, images))
        world.append(ClassWorld(images, img, difficulty, rng.standard_normal(img.size), fp_img,
                                rng.standard_normal(fp_img.size)))
    return world


def draw_noise(world: Sequence[ClassWorld], rng: np.random.Generator) -> list[ClassNoise]:
    """One model's own noise on every class of ``world``."""
    return [ClassNoise(rng.standard_normal(c.object_image.size), rng.standard_normal(c.object_image.size),
                       rng.standard_normal(c.confuser_image.size)) for c in world]


def _detections(s: Scenario, c: ClassWorld, noise: ClassNoise, skill: float) -> tuple[np.ndarray, np.ndarray]:
    """(image of each detection, (T, D) true positive at each IoU threshold), in COCO's score order."""
    shared, own = math.sqrt(s.correlation), math.sqrt(1 - s.correlation)
    evidence = skill + s.spread * (shared * c.difficulty + own * noise.evidence)
    localisation = shared * c.localisation + own * noise.localisation
    iou = 1.0 / (1.0 + np.exp(-(s.iou_bias + s.iou_slope * evidence + s.iou_noise * localisation)))
    confuser = s.confuser_skill + s.spread * (shared * c.strength + own * noise.confuser)
    order = np.argsort(-np.concatenate([evidence, confuser]), kind="mergesort")
    ious = np.concatenate([iou, np.zeros(c.confuser_image.size)])[order]
    return np.concatenate([c.object_image, c.confuser_image])[order], ious[None, :] >= IOU_THRESHOLDS[:, None]


def class_matches(s: Scenario, c: ClassWorld, noise: ClassNoise, skill: float) -> ClassMatches:
    """What COCO's matching yields for one model on one class (one detection per object and confuser)."""
    det_image, tp = _detections(s, c, noise, skill)
    return ClassMatches(np.bincount(c.object_image, minlength=c.images), det_image, tp, np.zeros_like(tp))


def model_matches(s: Scenario, world: Sequence[ClassWorld], noise: Sequence[ClassNoise],
                  skills: np.ndarray) -> dict[str, ClassMatches]:
    return {class_name(i): class_matches(s, c, n, float(skills[i]))
            for i, (c, n) in enumerate(zip(world, noise, strict=True))}


def class_name(index: int) -> str:
    return f"class{index:02d}"


def coco_ap(tp: np.ndarray, n_gt: int) -> float:
    """COCO's AP (101-point interpolated precision, averaged over the IoU thresholds) of detections in score
    order with no crowd regions, every image once: pycocotools' ``accumulate`` for one class, vectorised.

    The bench's truth on a population of 100,000 images; the product's
    :func:`~model_code.evaluation.bootstrap.weighted_ap` gives the same on a split (a test holds them equal),
    but walks its running sums row by row, made for 1,000 resamples at once."""
    if n_gt == 0:
        return math.nan
    total = 0.0
    for row in tp:
        tp_sum = np.cumsum(row, dtype=np.float64)
        fp_sum = np.cumsum(~row, dtype=np.float64)
        recall = tp_sum / n_gt
        precision = tp_sum / (tp_sum + fp_sum + np.spacing(1))
        envelope = np.maximum.accumulate(precision[::-1])[::-1]  # COCO's interpolation: best precision at or after
        first = np.searchsorted(recall, RECALL_THRESHOLDS, side="left")
        reached = first < recall.size
        total += float(envelope[first[reached]].sum()) / len(RECALL_THRESHOLDS)
    return total / tp.shape[0]


def population_ap(s: Scenario, c: ClassWorld, noise: ClassNoise, skill: float) -> float:
    """One class's AP on the population ``c`` for a model of ``skill`` (its noise held fixed)."""
    _, tp = _detections(s, c, noise, skill)
    return coco_ap(tp, c.object_image.size)


@dataclass(frozen=True)
class Calibrated:
    """A challenger whose true primary AP is ``difference`` from the champion's."""

    location: Location
    target: float  # the difference asked for (AP, negative: worse)
    skill_drop: float  # the skill (evidence units) each damaged class loses
    difference: float  # the true difference reached on the population (within AP steps of the target)


@dataclass(frozen=True)
class Truth:
    """A scenario's champion on the population, and the challengers calibrated against it."""

    scenario: Scenario
    population: int
    champion_ap: float  # the champion's true primary AP (the mean of its class APs on the population)
    class_aps: tuple[float, ...]
    class_instances: tuple[int, ...]  # objects of each class on the population
    challengers: tuple[Calibrated, ...]
    infeasible: tuple[tuple[Location, float], ...]  # (location, target) no skill drop reaches

    def skill_drop(self, location: Location, target: float) -> float | None:
        """The calibrated skill drop for ``target`` at ``location`` (None: out of the damage's reach)."""
        for c in self.challengers:
            if c.location == location and math.isclose(c.target, target, abs_tol=1e-12):
                return c.skill_drop
        return None


def population(s: Scenario, size: int, seed: int) -> tuple[list[ClassWorld], list[ClassNoise]]:
    """The truth's population and the model noise on it, the same for every challenger (common random
    numbers): the champion at skill drop 0 is that noise, so an undamaged challenger's truth is the champion's."""
    world = draw_world(s, np.random.default_rng([seed, 1]), size)
    return world, draw_noise(world, np.random.default_rng([seed, 2]))


def bisect_drop(value: Callable[[float], float], target: float, low: float = 0.0) -> tuple[float, float] | None:
    """(skill drop, value there) at which the decreasing ``value`` meets ``target``, searched in
    [``low``, MAX_SKILL_DROP]; None when even MAX_SKILL_DROP leaves it above ``target``."""
    high = MAX_SKILL_DROP
    at_high = value(high)
    if at_high > target:
        return None
    at_low = value(low)
    if at_low <= target:
        return low, at_low
    while high - low > SKILL_TOLERANCE:
        mid = (low + high) / 2
        at_mid = value(mid)
        if abs(at_mid - target) <= AP_TOLERANCE:
            return mid, at_mid
        if at_mid > target:
            low, at_low = mid, at_mid
        else:
            high, at_high = mid, at_mid
    return (low, at_low) if abs(at_low - target) <= abs(at_high - target) else (high, at_high)


def calibrate(s: Scenario, location: Location, targets: Sequence[float], size: int,
              seed: int) -> tuple[list[Calibrated], list[tuple[Location, float]]]:
    """The skill drop on ``location``'s classes that puts a challenger's true primary AP exactly ``target``
    (negative) from the champion's, for each target, on a population of ``size`` images."""
    world, noise = population(s, size, seed)
    skills = s.class_skills()
    base = [population_ap(s, c, n, float(k)) for c, n, k in zip(world, noise, skills, strict=True)]
    damaged = s.damaged(location)

    def primary_difference(drop: float) -> float:
        return sum(population_ap(s, world[i], noise[i], float(skills[i] - drop)) - base[i]
                   for i in damaged) / s.classes

    found, infeasible = [], []
    low = 0.0
    for target in sorted(targets, reverse=True):  # smallest drop first: each bracket starts at the last one
        hit = bisect_drop(primary_difference, target, low)
        if hit is None:
            infeasible.append((location, target))
            continue
        low = hit[0]
        found.append(Calibrated(location, target, hit[0], hit[1]))
    return found, infeasible


def champion_truth(s: Scenario, size: int, seed: int) -> tuple[float, tuple[float, ...], tuple[int, ...]]:
    """The champion's true primary AP, its class APs and the population's objects per class."""
    world, noise = population(s, size, seed)
    aps = tuple(population_ap(s, c, n, float(k)) for c, n, k in zip(world, noise, s.class_skills(), strict=True))
    return float(np.mean(aps)), aps, tuple(int(c.object_image.size) for c in world)
