"""The statistical gate: its rule on an interval, and its settings' defaults, bounds and environment names.

The stack's ``GateConfidence``/``GateResamples`` parameters (template.yaml, whose Default/MinValue/
MaxValue a test holds to these constants) reach ``prepare_training``, which writes them into the
plan's gate (``GateThresholds.confidence``/``resamples``) and into the evaluation job's Environment
(:func:`job_environment`); the job reads them back with :func:`read_job_environment`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

# The stack's defaults (template.yaml's MinMap, MaxRegression, MaxClassRegression; a test holds them equal),
# which `d2ops gate` applies where no option says otherwise. MaxRegression 0.05: in make bench-gate's worlds an
# equal challenger needs about 160-340 held-out val images (3 classes) to be approved 80 % of the time at 0.05,
# 440-1,030 at 0.03 and several thousand at 0.01, so a tighter default would send most runs of a few hundred
# val images to review (docs/pipeline.md); a stack with larger val sets can tighten it.
DEFAULT_MIN_MAP = 0.30
DEFAULT_MAX_REGRESSION = 0.05
DEFAULT_MAX_CLASS_REGRESSION = 0.10
DEFAULT_CONFIDENCE = 0.95
# Two-sided levels: at 0.5 or below an "interval" refuses on a coin toss; 1 is no interval at all.
MIN_CONFIDENCE_EXCLUSIVE = 0.5
MAX_CONFIDENCE_EXCLUSIVE = 1.0
DEFAULT_RESAMPLES = 1000
# Below 100 resamples the percentile ends rest on a handful of draws; above 10,000 the evaluation
# job spends minutes for digits the val images cannot support.
MIN_RESAMPLES = 100
MAX_RESAMPLES = 10_000
DEFAULT_SEED = 0

CONFIDENCE_ENV = "GATE_CONFIDENCE"
RESAMPLES_ENV = "GATE_RESAMPLES"
MIN_CLASS_INSTANCES_ENV = "GATE_MIN_CLASS_INSTANCES"
SEED_ENV = "GATE_SEED"
# The tolerances, so the job's report can say what the gate will make of its intervals.
MAX_REGRESSION_ENV = "GATE_MAX_REGRESSION"
MAX_CLASS_REGRESSION_ENV = "GATE_MAX_CLASS_REGRESSION"
# Differences read from JSON are rounded before the comparison: 0.49 - 0.5 stays -0.01, as a reader sees it.
DIGITS = 9
# The stack's MinClassInstances default (template.yaml): classes with fewer val instances are not judged.
DEFAULT_MIN_CLASS_INSTANCES = 30
# The stack's MinComparedImages default (template.yaml): with fewer held-out val images the gate never
# approves. Below 50 the paired bootstrap's intervals are too narrow to trust: at 40 images they held the true
# difference 88 % of the time for a nominal 95 % (make bench-gate), about nominal from 200 images on.
DEFAULT_MIN_COMPARED_IMAGES = 50


class GateSettingError(ValueError):
    """A GATE_* variable of the evaluation job's Environment is not a value the gate accepts."""


@dataclass(frozen=True)
class GateSettings:
    """What the evaluation job's bootstrap runs with."""

    confidence: float = DEFAULT_CONFIDENCE
    resamples: int = DEFAULT_RESAMPLES
    min_class_instances: int = DEFAULT_MIN_CLASS_INSTANCES
    seed: int = DEFAULT_SEED
    max_regression: float | None = None  # None: the report shows the intervals without the gate's verdict
    max_class_regression: float | None = None


def regression_beyond(high: float, tolerance: float) -> bool:
    """The refusal rule: the regression beyond ``tolerance`` is significant when even the interval's
    upper end (the best case for the challenger) is below -tolerance. Exactly -tolerance is within it."""
    return round(high, DIGITS) < -tolerance


def within_tolerance(low: float, tolerance: float) -> bool:
    """The approval rule (non-inferiority): even the interval's lower end (the worst case for the
    challenger) is at or above -tolerance. Between this and :func:`regression_beyond` lies "review"."""
    return round(low, DIGITS) >= -tolerance


def more_val_images(low: float, high: float, val_images: int, tolerance: float) -> int | None:
    """About how many more val images would narrow the interval ``[low, high]`` to ``tolerance``.

    The half-width shrinks with the square root of the number of images, so reaching ``tolerance``
    takes ``val_images * (half_width / tolerance)^2`` of them. None when the interval is already no
    wider; when it lies wholly on one side of -tolerance, where more images would not change the
    decision (refused beyond doubt, or within the tolerance beyond doubt); and for a tolerance of 0,
    which no number of images reaches.
    """
    half_width = round((high - low) / 2, DIGITS)
    if tolerance <= 0 or half_width <= tolerance:
        return None
    if regression_beyond(high, tolerance) or within_tolerance(low, tolerance):
        return None
    return max(1, math.ceil(val_images * (half_width / tolerance) ** 2) - val_images)


def confidence_problem(value: float) -> str | None:
    if not MIN_CONFIDENCE_EXCLUSIVE < value < MAX_CONFIDENCE_EXCLUSIVE:
        return f"must be a fraction strictly between {MIN_CONFIDENCE_EXCLUSIVE:g} and {MAX_CONFIDENCE_EXCLUSIVE:g}"
    return None


def resamples_problem(value: int) -> str | None:
    if not MIN_RESAMPLES <= value <= MAX_RESAMPLES:
        return f"must be a whole number from {MIN_RESAMPLES} to {MAX_RESAMPLES}"
    return None


def _number(env: Mapping[str, str], name: str, kind: type[float] | type[int]) -> float | int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise GateSettingError(f"{name}={raw!r} is not a {'number' if kind is float else 'whole number'}") from None


def read_job_environment(env: Mapping[str, str]) -> GateSettings:
    """The job's GATE_* variables (absent ones take the defaults); a bad one raises naming the variable."""
    settings = GateSettings()
    confidence = _number(env, CONFIDENCE_ENV, float)
    if confidence is not None:
        problem = confidence_problem(confidence)
        if problem:
            raise GateSettingError(f"{CONFIDENCE_ENV}={env[CONFIDENCE_ENV]!r} {problem}")
        settings = replace(settings, confidence=float(confidence))
    resamples = _number(env, RESAMPLES_ENV, int)
    if resamples is not None:
        problem = resamples_problem(int(resamples))
        if problem:
            raise GateSettingError(f"{RESAMPLES_ENV}={env[RESAMPLES_ENV]!r} {problem}")
        settings = replace(settings, resamples=int(resamples))
    instances = _number(env, MIN_CLASS_INSTANCES_ENV, int)
    if instances is not None:
        if instances < 1:
            raise GateSettingError(f"{MIN_CLASS_INSTANCES_ENV}={env[MIN_CLASS_INSTANCES_ENV]!r} must be at least 1")
        settings = replace(settings, min_class_instances=int(instances))
    seed = _number(env, SEED_ENV, int)
    if seed is not None:
        if not 0 <= seed < 2**32:
            raise GateSettingError(f"{SEED_ENV}={env[SEED_ENV]!r} must be a whole number from 0 to {2**32 - 1}")
        settings = replace(settings, seed=int(seed))
    return replace(settings, max_regression=_tolerance(env, MAX_REGRESSION_ENV),
                   max_class_regression=_tolerance(env, MAX_CLASS_REGRESSION_ENV))


def _tolerance(env: Mapping[str, str], name: str) -> float | None:
    tolerance = _number(env, name, float)
    if tolerance is not None and not 0 <= tolerance <= 1:
        raise GateSettingError(f"{name}={env[name]!r} must be a fraction in [0, 1]")
    return None if tolerance is None else float(tolerance)


def job_environment(confidence: float, resamples: int, min_class_instances: int | None, max_regression: float,
                    max_class_regression: float | None) -> dict[str, str]:
    """The evaluation job's GATE_* Environment (strings, as SageMaker passes them) from the plan's gate."""
    env = {CONFIDENCE_ENV: repr(confidence), RESAMPLES_ENV: str(resamples), SEED_ENV: str(DEFAULT_SEED),
           MAX_REGRESSION_ENV: repr(max_regression)}
    if min_class_instances is not None:
        env[MIN_CLASS_INSTANCES_ENV] = str(min_class_instances)
    if max_class_regression is not None:
        env[MAX_CLASS_REGRESSION_ENV] = repr(max_class_regression)
    return env


def percent(confidence: float) -> str:
    """0.95 -> '95%'; a Bonferroni-adjusted 0.9916666 -> '99.17%'."""
    return f"{confidence * 100:.4g}%"


def ap_text(value: float) -> str:
    """An AP, or a difference of two, as every reason quotes it: three decimals ('0.512', '-0.018'); the
    documents keep the exact values."""
    return f"{value:.3f}"


def limit_text(value: float) -> str:
    """A gate threshold as a reason quotes it, as the operator wrote it: 0.3, 0.01 (never a float's residue,
    0.30000000000000004)."""
    return f"{value:g}"


def interval_text(difference: float, low: float, high: float, confidence: float) -> str:
    """'difference -0.018, 95% interval [-0.031, -0.006]': how every reader of the gate quotes an interval."""
    return f"difference {ap_text(difference)}, {percent(confidence)} interval [{ap_text(low)}, {ap_text(high)}]"


def interval_line(metric: str, difference: float, low: float, high: float, confidence: float, val_images: int,
                  more: int | None, tolerance: float | None) -> str:
    """One line on the comparison for people (the notification, ``d2ops status``): the interval, and how
    many more val images would narrow it to the tolerance when it is wider."""
    line = (f"{metric} challenger - champion: {interval_text(difference, low, high, confidence)} on {val_images} "
            "val images")
    if more is not None and tolerance is not None:
        line += (f"; wider than the tolerance \u00b1{limit_text(tolerance)}: about {more} more val images would "
                 "narrow it")
    return line
