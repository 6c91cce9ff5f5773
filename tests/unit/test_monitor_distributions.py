"""The monitor's statistics in the standard library (monitor_endpoint.statistics, .distributions) held to scipy
and numpy, which stay in the dev environment as the oracle only: numpy + scipy would take the Lambda over its
250 MB (docs/monitoring.md). D and the quantile edges equal to the bit; p-values within 1e-9 relative (the
largest gap seen in 44,000 random draws was 4e-11: lgamma's rounding in Birnbaum-Tingey sums of up to 16,000
terms); PSI within 1e-12 (numpy sums pairwise, we in
order). And the Lambda's code imports neither."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from scipy import special, stats

from d2ops_core.documents.monitoring import DISTRIBUTIONS
from tests.fixtures.monitoring_synthetic import CLASSES
from tests.fixtures.pipeline import support

support.function_path("monitor_endpoint")
from monitor_endpoint.distributions import chi2_sf, kolmogorov_sf, smirnov_sf  # noqa: E402
from monitor_endpoint.statistics import (  # noqa: E402
    MIN_EXPECTED,
    PSI_QUANTILES,
    bin_counts,
    ks_2samp,
    psi,
    psi_bins,
    quantile,
)

P_RTOL = 1e-9
TAIL_FLOOR = 1e-290  # below it both sides are (sub)normal dust: compared as absolutely small only
FAST = settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])

values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
# Few distinct values, so ties between and within the samples are common (the KS tie rule shows only then).
tied = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 7.5])
sample = st.one_of(st.lists(values, min_size=1, max_size=300), st.lists(tied, min_size=1, max_size=300))


def close(ours: float, theirs: float, rtol: float = P_RTOL) -> bool:
    if theirs < TAIL_FLOOR:
        return ours < 1e-280
    return abs(ours - theirs) <= rtol * theirs


@FAST
@given(sample, sample)
@example([0.0, 1.0, 1.0], [1.0, 1.0, 2.0])  # ties across the samples: side="left" would give D 1/3, not 0
def test_ks_d_is_scipys_to_the_bit_and_p_its_asymptotic_one(first: list[float], second: list[float]) -> None:
    """Mutations caught: the empirical CDFs counting values < v instead of <= v (ties), D taken one-sided,
    the effective n not rounded half-to-even or taken as n1 + n2, the limiting Kolmogorov distribution
    (kstwobign) used instead of kstwo at that n."""
    assume(len(first) + len(second) > 2)  # one value each: N = round(0.5) = 0, scipy answers nan, we 1.0
    d, p = ks_2samp(first, second)
    theirs = stats.ks_2samp(first, second, method="asymp")
    assert d == float(theirs.statistic)
    assert close(p, float(theirs.pvalue))


# One (n, x) for each branch of the method choice, so every branch is compared whatever Hypothesis draws.
BRANCHES = [
    (10, 0.04),  # n x <= 0.5: 1
    (10, 0.08),  # Ruben-Gambino, n x <= 1
    (10, 0.95),  # Ruben-Gambino, n x >= n - 1
    (30, 0.6),  # x >= 0.5: twice the one-sided tail
    (100, 0.05),  # n <= 140, n x^2 <= 0.754693 (scipy: Durbin)
    (100, 0.15),  # n <= 140, n x^2 <= 4 (scipy: Pomeranz; we: Durbin)
    (140, 0.169),  # the same, at its largest matrix (47 x 47)
    (100, 0.3),  # n <= 140, n x^2 > 4: Miller
    (5000, 0.3),  # n x^2 >= 370: 0
    (5000, 0.03),  # n x^2 >= 2.2: twice the one-sided tail
    (5000, 0.005),  # n x^1.5 <= 1.4: Durbin
    (5000, 0.015),  # Pelz-Good
    (200_000, 0.002),  # n > 100,000: Pelz-Good
]


@pytest.mark.parametrize(("n", "x"), BRANCHES)
def test_kolmogorov_sf_equals_kstwo_on_each_branch(n: int, x: float) -> None:
    """Mutations caught: any one method wrong (the Durbin matrix's corner term, a Pelz-Good coefficient, the
    Ruben-Gambino factor), or the branch cut-offs moved (a method used outside the range where it is accurate)."""
    assert close(kolmogorov_sf(n, x), float(stats.kstwo.sf(x, n)))


@FAST
@given(st.integers(min_value=1, max_value=20_000), st.floats(min_value=0.0, max_value=1.0))
def test_kolmogorov_sf_equals_kstwo(n: int, x: float) -> None:
    """Mutations caught: as above, at the points between the cut-offs (a scaling step that loses precision
    as n grows, a sum stopped early)."""
    assert close(kolmogorov_sf(n, x), float(stats.kstwo.sf(x, n)))


@FAST
@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0.0, max_value=1.0))
@example(7, 0.999999997)  # 1 - x - j/n as (n - j - n x)/n loses 7 digits here (n x rounded)
@example(1, 2.225073858507e-311)  # a subnormal x: x * x**-1 must not overflow
def test_smirnov_sf_equals_scipys(n: int, x: float) -> None:
    """Mutations caught: a Birnbaum-Tingey term's exponent off by one (j - 1 vs j), the sum's last term
    (1 - x - j/n = 0) taken as 1, 1 - x - j/n computed with a cancellation that costs digits near x = 1."""
    assert close(smirnov_sf(n, x), float(special.smirnov(n, x)))


@FAST
@given(st.integers(min_value=1, max_value=400),
       st.one_of(st.floats(min_value=0.0, max_value=1e-6), st.floats(min_value=0.0, max_value=50.0),
                 st.floats(min_value=0.0, max_value=5000.0)))
@example(1, 1e-12)  # Q near 1 from the series
@example(9, 120.0)  # a tail far below the usual p-values: the continued fraction's relative precision
@example(400, 401.0)  # large a at the series / continued fraction switch
def test_chi2_sf_equals_scipys(dof: int, x: float) -> None:
    """Mutations caught: Q taken as 1 - P in the tail (a tiny p-value becomes 0), x not halved, the
    prefactor computed without logarithms (overflow at large dof), a series or fraction stopped early."""
    assert close(chi2_sf(x, dof), float(stats.chi2.sf(x, dof)))


@FAST
@given(st.one_of(st.lists(values, min_size=1, max_size=400), st.lists(tied, min_size=1, max_size=400)),
       st.floats(min_value=0.0, max_value=1.0))
def test_quantile_and_bins_equal_numpys(baseline: list[float], q: float) -> None:
    """Mutations caught: another quantile rule (position n q, or without numpy's interpolation from the
    nearer neighbour), edges repeated, values binned with bisect_right (a value on an edge in the bin above)."""
    ordered = sorted(baseline)
    assert quantile(ordered, q) == float(np.quantile(np.asarray(baseline), q))
    edges = psi_bins(baseline)
    assert edges == np.unique(np.quantile(np.asarray(baseline), PSI_QUANTILES)).tolist()
    probe = [*baseline, *edges]
    assert bin_counts(probe, edges) == np.bincount(np.searchsorted(np.asarray(edges), np.asarray(probe), side="left"),
                                                   minlength=len(edges) + 1).tolist()


def _psi_oracle(baseline: list[float], window: list[float]) -> tuple[float, float]:
    """The statistics' numpy/scipy form (as the monitor computed them before it shipped without them)."""
    edges = np.unique(np.quantile(np.asarray(baseline, dtype=float), PSI_QUANTILES))

    def counts(v: list[float]) -> np.ndarray:
        return np.bincount(np.searchsorted(edges, np.asarray(v, dtype=float), side="left"), minlength=len(edges) + 1)

    b_counts, w_counts = counts(baseline), counts(window)
    b = (b_counts + 0.5) / (b_counts.sum() + 0.5 * len(b_counts))
    w = (w_counts + 0.5) / (w_counts.sum() + 0.5 * len(w_counts))
    value = float(np.sum((w - b) * np.log(w / b)))
    expected = b * w_counts.sum()
    observed_groups, expected_groups, group, total = [], [], [], 0.0
    for i, e in enumerate(expected):  # the pooling rule, written again from docs/monitoring.md
        group.append(i)
        total += e
        if total >= MIN_EXPECTED:
            observed_groups.append(w_counts[group].sum())
            expected_groups.append(expected[group].sum())
            group, total = [], 0.0
    if group and observed_groups:
        observed_groups[-1] += w_counts[group].sum()
        expected_groups[-1] += expected[group].sum()
    elif group:
        observed_groups, expected_groups = [w_counts[group].sum()], [expected[group].sum()]
    if len(observed_groups) < 2:
        return value, 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return value, float(stats.chisquare(np.array(observed_groups, dtype=float),
                                             np.array(expected_groups, dtype=float)).pvalue)


counts_strategy = st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=400)
fractions = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=400)


@FAST
@given(st.one_of(st.tuples(counts_strategy, counts_strategy), st.tuples(fractions, fractions)))
def test_psi_and_its_chi_square_p_equal_the_numpy_scipy_form(pair: tuple[list[float], list[float]]) -> None:
    """Mutations caught: the smoothing or the proportions' denominator changed, the pooled bins' sums wrong
    (a sparse tail dropped instead of joined), the chi-square's degrees of freedom off by one."""
    baseline, window = pair
    value, p = psi(baseline, window)
    want_value, want_p = _psi_oracle(baseline, window)
    assert value == pytest.approx(want_value, rel=1e-12, abs=1e-15)
    assert close(p, want_p)


def test_the_monitor_runs_without_numpy_or_scipy() -> None:
    """Mutation caught: any import of numpy or scipy in the monitor's code or what it imports (at module
    level or inside a function), which the Lambda's package (the functions' lock) does not have."""
    code = textwrap.dedent("""
        import sys

        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("numpy", "scipy"):
                    raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in the Lambda)")
                return None

        sys.meta_path.insert(0, Blocked())
        import monitor_endpoint.handler
        from d2ops_core.monitoring_features import build_baseline, sample_features
        from monitor_endpoint.statistics import Thresholds, judge
        from tests.fixtures.monitoring_synthetic import CLASSES, THRESHOLDS, stream

        baseline = build_baseline(stream(300, seed=1), run_id="r", class_names=CLASSES, score_thresholds=THRESHOLDS)
        for darken in (1.0, 0.5):
            verdict, statistics = judge(baseline, sample_features(stream(40, seed=2, darken=darken), CLASSES),
                                        Thresholds())
            print(verdict, len(statistics))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "scipy")))
    """)
    paths = [support.REPO / "functions" / "monitor_endpoint", support.REPO / "src", support.REPO]
    env = {**os.environ, "POWERTOOLS_TRACE_DISABLED": "1", "AWS_DEFAULT_REGION": "us-east-1",
           "PYTHONPATH": os.pathsep.join(map(str, paths))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=support.REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    compared = len(DISTRIBUTIONS) + 1 + len(CLASSES)  # and low confidence, one rate per class
    assert done.stdout.split("\n")[:3] == [f"ok {compared}", f"drifted {compared}", "[]"]


def test_a_nan_gives_nan_like_scipy_and_empty_samples_are_refused() -> None:
    """Mutation caught: NaN values looping forever in the merge or giving a finite D (scipy propagates)."""
    d, p = ks_2samp([0.0, math.nan, 1.0], [0.5, 2.0])
    assert math.isnan(d) and math.isnan(p)
    with pytest.raises(ValueError, match="both sides"):
        ks_2samp([], [1.0])
