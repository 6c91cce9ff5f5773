"""The drift statistics: a window of capture's features against the baseline's, one verdict each (pure).

docs/monitoring.md names and explains each one. In short:

- a DISTRIBUTION (score, boxes per image, box area fraction, image width and height, brightness) is
  compared with the two-sample Kolmogorov-Smirnov test (:func:`ks_2samp`): its value is D, the largest gap
  between the two empirical CDFs (0-1);
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

Standard library only (numpy and scipy would take the Lambda over its 250 MB, see
:mod:`monitor_endpoint.distributions`): the results are scipy's and numpy's (``scipy.stats.ks_2samp(...,
method="asymp")``, ``numpy.quantile``, ``numpy.searchsorted``, ``scipy.stats.chisquare``), which
tests/unit/test_monitor_distributions.py holds them to.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from d2ops_core.documents.monitoring import (
    CLASS_RATE_PREFIX,
    DISTRIBUTIONS,
    LOW_CONFIDENCE,
    MonitoringBaseline,
    StatisticVerdict,
    WindowVerdict,
)
from d2ops_core.monitoring_features import FeatureSample, baseline_sample, mean
from monitor_endpoint.distributions import chi2_sf, kolmogorov_sf

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


def ks_2samp(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """(D, two-sided p-value) of the two-sample Kolmogorov-Smirnov test, as ``scipy.stats.ks_2samp(first,
    second, method="asymp")`` answers them.

    D is the largest |F1(v) - F2(v)| over every value v of either sample, each empirical CDF counting the
    values <= v (so tied values move both CDFs at once, as scipy's ``searchsorted(side="right")``), each
    gap computed as i/n1 - j/n2 like scipy's, so D is equal to the bit. The p-value is P(D_N >= D) of the
    one-sample statistic at N = round(n1 n2 / (n1 + n2)) (``kstwo.sf``), scipy's "asymp" method.

    scipy's default ("auto") would count lattice paths exactly whenever both samples have at most 10,000
    values: O(n1 n2) steps, seconds in pure Python for a 5,000-value baseline. The asymptotic p-value it
    falls back to differs from the exact one by a few percent of itself where the decision is taken
    (p near 0.01 / the number of statistics, D near the 0.2 threshold: docs/monitoring.md has the figures),
    and a drift alarm needs D above its threshold as well, so the guard's false-alarm rate stays near its
    1% (measured there). Values that are not numbers give (nan, nan), as scipy's; a one-value-each pair
    (N would be 0) gives p 1.0: nothing to test.
    """
    x, y = sorted(map(float, first)), sorted(map(float, second))
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        raise ValueError("the KS test needs values on both sides")
    if any(math.isnan(v) for v in (*x, *y)):
        return math.nan, math.nan
    d, i, j = 0.0, 0, 0
    while i < n1 or j < n2:  # each distinct value once, in order: both CDFs past it
        v = y[j] if i == n1 else x[i] if j == n2 else min(x[i], y[j])
        while i < n1 and x[i] <= v:
            i += 1
        while j < n2 and y[j] <= v:
            j += 1
        d = max(d, abs(i / n1 - j / n2))
    big, small = max(n1, n2), min(n1, n2)
    effective = round(float(big) * float(small) / (float(big) + float(small)))  # half to even, as np.round
    return d, (kolmogorov_sf(effective, d) if effective >= 1 else 1.0)


def ks_verdict(statistic: str, baseline: Sequence[float], window: Sequence[float], threshold: float,
               alpha: float = SIGNIFICANCE) -> StatisticVerdict | None:
    """Two-sample KS of ``window`` against ``baseline``; None when either side has no values (a window
    without any detection has no score distribution: boxes per image and the class rates say so)."""
    if not baseline or not window:
        return None
    d, p = ks_2samp(baseline, window)
    return StatisticVerdict(statistic=statistic, test="ks", value=d, threshold=threshold, p_value=p,
                            drifted=d > threshold and p < alpha, baseline=mean(baseline), window=mean(window))


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of the sorted ``ordered`` by numpy.quantile's default ("linear", Hyndman & Fan's
    7th): position (n - 1) q, interpolated between its neighbours from the nearer one, as numpy's lerp."""
    position = (len(ordered) - 1) * q
    if position >= len(ordered) - 1:
        return ordered[-1]
    below = math.floor(position)
    fraction = position - below
    lower, upper = ordered[below], ordered[below + 1]
    step = upper - lower
    return upper - step * (1 - fraction) if fraction >= 0.5 else lower + step * fraction


def psi_bins(baseline: Sequence[float]) -> list[float]:
    """The inner bin edges: the baseline's deciles, each once. Counts (a class's detections per image) have few
    distinct values, so their bins are those values: ``<= e0``, ``(e0, e1]``, ..., ``> e_last``."""
    ordered = sorted(map(float, baseline))
    return sorted({quantile(ordered, q) for q in PSI_QUANTILES})


def bin_counts(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """Values per bin: bin i holds edges[i-1] < v <= edges[i] (numpy.searchsorted(edges, v, side="left"))."""
    counts = [0] * (len(edges) + 1)
    for value in values:
        counts[bisect_left(edges, float(value))] += 1
    return counts


def _proportions(counts: Sequence[int]) -> list[float]:
    total = sum(counts) + _SMOOTHING * len(counts)
    return [(c + _SMOOTHING) / total for c in counts]


def psi(baseline: Sequence[float], window: Sequence[float]) -> tuple[float, float]:
    """(PSI, chi-square p-value) of ``window`` against ``baseline`` over the baseline's decile bins."""
    edges = psi_bins(baseline)
    b_counts, w_counts = bin_counts(baseline, edges), bin_counts(window, edges)
    b, w = _proportions(b_counts), _proportions(w_counts)
    value = sum((wi - bi) * math.log(wi / bi) for wi, bi in zip(w, b, strict=True))
    observed, expected = _pooled(w_counts, [bi * sum(w_counts) for bi in b])
    if len(observed) < 2:
        return value, 1.0
    chi_square = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    return value, chi2_sf(chi_square, len(observed) - 1)


def _pooled(observed: Sequence[int], expected: Sequence[float]) -> tuple[list[float], list[float]]:
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
    return ([float(sum(observed[i] for i in g)) for g in groups],
            [float(sum(expected[i] for i in g)) for g in groups])


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
