"""The drift statistics: a window of capture's features against the baseline's, one verdict each (pure).

docs/monitoring.md names and explains each one. In short:

- a DISTRIBUTION (score, boxes per image, box area fraction, image width and height, brightness) is
  compared with the two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``): its value is D, the
  largest gap between the two empirical CDFs (0-1);
- a RATE (each class's detections per image, the images' low-confidence fraction) with the population
  stability index over bins cut at the baseline's deciles: PSI = sum((w - b) * ln(w / b)) over the bins'
  window and baseline proportions (>= 0; 0.1 is commonly read as a small shift, 0.25 as a large one).
  Proportions are smoothed by half a count per bin (Jeffreys), so an empty bin is not an infinite PSI.

A statistic has drifted when its value passes the stack's threshold (``DriftKsThreshold`` for D,
``DriftPsiThreshold`` for PSI) AND the difference is significant (KS's own p-value; for PSI the
chi-square test of the window's bin counts against the baseline's proportions) at :data:`SIGNIFICANCE`
divided by the number of statistics compared (Bonferroni: the chance that an unshifted window raises
any alarm stays under 1%, however many classes the model has). The second condition keeps a small
window's sampling noise from raising alarms: with 20 records a D of 0.2 happens by chance about one
time in three, a PSI of 0.25 on a rare class about one time in ten.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from d2ops_core.documents.monitoring import (
    CLASS_RATE_PREFIX,
    DISTRIBUTIONS,
    LOW_CONFIDENCE,
    MonitoringBaseline,
    StatisticVerdict,
    WindowVerdict,
)
from d2ops_core.monitoring_features import FeatureSample, baseline_sample, mean

SIGNIFICANCE = 0.01  # family-wise, per window
PSI_QUANTILES = tuple(q / 10 for q in range(1, 10))  # the baseline's deciles cut the bins
_SMOOTHING = 0.5  # counts added to each bin before proportions are taken
MIN_EXPECTED = 5.0  # the chi-square test's usual rule: at least 5 expected counts in each bin


@dataclass(frozen=True)
class Thresholds:
    """The stack parameters: DriftKsThreshold, DriftPsiThreshold, MonitorMinRecords."""

    ks: float = 0.2
    psi: float = 0.25
    min_records: int = 20


def ks_verdict(statistic: str, baseline: Sequence[float], window: Sequence[float], threshold: float,
               alpha: float = SIGNIFICANCE) -> StatisticVerdict | None:
    """Two-sample KS of ``window`` against ``baseline``; None when either side has no values (a window
    without any detection has no score distribution: boxes per image and the class rates say so)."""
    if not baseline or not window:
        return None
    result = stats.ks_2samp(np.asarray(baseline, dtype=float), np.asarray(window, dtype=float))
    d, p = float(result.statistic), float(result.pvalue)
    return StatisticVerdict(statistic=statistic, test="ks", value=d, threshold=threshold, p_value=p,
                            drifted=d > threshold and p < alpha, baseline=mean(baseline), window=mean(window))


def psi_bins(baseline: Sequence[float]) -> np.ndarray:
    """The inner bin edges: the baseline's deciles, each once. Counts (a class's detections per image) have few
    distinct values, so their bins are those values: ``<= e0``, ``(e0, e1]``, ..., ``> e_last``."""
    return np.unique(np.quantile(np.asarray(baseline, dtype=float), PSI_QUANTILES))


def bin_counts(values: Sequence[float], edges: np.ndarray) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, np.asarray(values, dtype=float), side="left"),
                       minlength=len(edges) + 1)


def psi(baseline: Sequence[float], window: Sequence[float]) -> tuple[float, float]:
    """(PSI, chi-square p-value) of ``window`` against ``baseline`` over the baseline's decile bins."""
    edges = psi_bins(baseline)
    b_counts, w_counts = bin_counts(baseline, edges), bin_counts(window, edges)
    b = (b_counts + _SMOOTHING) / (b_counts.sum() + _SMOOTHING * len(b_counts))
    w = (w_counts + _SMOOTHING) / (w_counts.sum() + _SMOOTHING * len(w_counts))
    value = float(np.sum((w - b) * np.log(w / b)))
    observed, expected = _pooled(w_counts, b * w_counts.sum())
    if len(observed) < 2:
        return value, 1.0
    return value, float(stats.chisquare(observed, expected).pvalue)


def _pooled(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Adjacent bins pooled until each expects at least :data:`MIN_EXPECTED` counts (the chi-square test's
    approximation holds; on a small window a sparse bin would make it alarm on noise)."""
    groups: list[list[int]] = [[]]
    total = 0.0
    for i, e in enumerate(expected):
        groups[-1].append(i)
        total += e
        if total >= MIN_EXPECTED:
            groups.append([])
            total = 0.0
    if not groups[-1]:
        groups.pop()
    elif len(groups) > 1:  # a sparse tail joins the group before it
        groups[-2].extend(groups.pop())
    return (np.array([observed[g].sum() for g in groups], dtype=float),
            np.array([expected[g].sum() for g in groups], dtype=float))


def psi_verdict(statistic: str, baseline: Sequence[float], window: Sequence[float], threshold: float,
                alpha: float = SIGNIFICANCE) -> StatisticVerdict | None:
    if not baseline or not window:
        return None
    value, p = psi(baseline, window)
    return StatisticVerdict(statistic=statistic, test="psi", value=value, threshold=threshold, p_value=p,
                            drifted=value > threshold and p < alpha, baseline=mean(baseline),
                            window=mean(window))


def compare(baseline: FeatureSample, window: FeatureSample, thresholds: Thresholds) -> list[StatisticVerdict]:
    """Every statistic both sides have values for, in a fixed order: DISTRIBUTIONS, low-confidence, classes."""
    tests = [(ks_verdict, name, baseline.distributions.get(name, []), window.distributions.get(name, []),
              thresholds.ks) for name in DISTRIBUTIONS]
    tests.append((psi_verdict, LOW_CONFIDENCE, baseline.low_confidence, window.low_confidence, thresholds.psi))
    tests.extend((psi_verdict, f"{CLASS_RATE_PREFIX}{name}", baseline.class_rates.get(name, []),
                  window.class_rates.get(name, []), thresholds.psi) for name in baseline.class_names)
    compared = [t for t in tests if t[2] and t[3]]
    alpha = SIGNIFICANCE / max(1, len(compared))
    verdicts = [test(name, base, seen, threshold, alpha) for test, name, base, seen, threshold in compared]
    return [v for v in verdicts if v is not None]


def judge(baseline: MonitoringBaseline | None, window: FeatureSample,
          thresholds: Thresholds) -> tuple[WindowVerdict, list[StatisticVerdict]]:
    """The window's verdict and statistics: ``no_baseline`` without one, ``too_few_records`` below
    ``MonitorMinRecords`` usable records (no statistics: too few to mean anything), else ``drifted`` when
    any statistic drifted, ``ok`` otherwise."""
    if baseline is None:
        return "no_baseline", []
    if window.images < thresholds.min_records:
        return "too_few_records", []
    verdicts = compare(baseline_sample(baseline), window, thresholds)
    return ("drifted" if any(v.drifted for v in verdicts) else "ok"), verdicts
