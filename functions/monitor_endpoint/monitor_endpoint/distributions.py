"""The drift tests' null distributions, tail probabilities only, in the standard library (no numpy, no scipy).

Why hand-written: numpy and scipy unpacked for Lambda (manylinux2014) with the functions' lock come to
276 MB, over Lambda's 250 MB for a function and its layers, so the monitor ships the functions' lock like
every other function. Each function here computes what the scipy function named in its docstring computes,
by the same published method; tests/unit/test_monitor_distributions.py holds them to scipy (the oracle, a
dev dependency only).

- :func:`kolmogorov_sf`: the two-sided one-sample Kolmogorov-Smirnov statistic's survival function
  (``scipy.stats.kstwo.sf``), the method picked by n and n*x**2 as Simard & L'Ecuyer (2011) advise:
  Ruben-Gambino at the ends, twice the one-sided tail (Birnbaum-Tingey's exact sum) where the two tails
  cannot overlap or where they barely do (Miller's approximation), the Durbin matrix (Marsaglia, Tsang & Wang
  2003) for small n*x, the Pelz-Good expansion otherwise. Where scipy uses Pomeranz's recursion (n <= 140,
  0.754693 < n*x**2 <= 4) the Durbin matrix is used instead: both are exact, so they differ by rounding only.
- :func:`smirnov_sf`: the one-sided statistic's tail (``scipy.special.smirnov``).
- :func:`chi2_sf`: the chi-square survival function (``scipy.stats.chi2.sf``) as the regularized upper
  incomplete gamma function Q(dof/2, x/2): its series below a + 1, a continued fraction above.
"""

from __future__ import annotations

import math
from operator import mul

_SCALE = 2.0**128  # matrix powers and products are kept within range by this factor, counted in exponents
_SCALE_EXPONENT = 128
_EPSILON = 2.0**-53
_TINY = 1e-300  # Lentz's guard against a zero denominator
_MAX_ITERATIONS = 100_000


def _clip(p: float) -> float:
    return min(1.0, max(0.0, p))


def smirnov_sf(n: int, x: float) -> float:
    """P(D+_n >= x), the one-sided statistic of ``n`` draws (Birnbaum & Tingey 1951): x times the sum over
    j <= n(1 - x) of C(n, j) (1 - x - j/n)**(n - j) (x + j/n)**(j - 1). Every term is positive, each is taken
    in logarithms (no overflow at any n), so the sum keeps double precision."""
    if x <= 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    log_n_factorial, log_x = math.lgamma(n + 1), math.log(x)
    total = 0.0
    for j in range(n + 1):
        below = (1.0 - x) - j / n  # 1 - x is exact for x >= 1/2 (Sterbenz): the j = 0 term keeps its precision
        if below <= 0.0:
            break
        # the leading x inside the logarithm: for j = 0 it cancels x**-1 (no overflow for a subnormal x)
        above = 0.0 if j == 0 else log_x + (j - 1) * math.log(x + j / n)
        log_term = (log_n_factorial - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                    + (n - j) * math.log(below) + above)
        total += math.exp(log_term)
    return _clip(total)


def kolmogorov_sf(n: int, x: float) -> float:
    """P(D_n >= x), D_n the two-sided one-sample KS statistic of ``n`` draws (``scipy.stats.kstwo.sf(x, n)``)."""
    if n < 1:
        raise ValueError(f"the Kolmogorov distribution needs n >= 1, not {n}")
    if x >= 1.0:
        return 0.0
    if x <= 0.0:
        return 1.0
    t = n * x
    if t <= 1.0:  # Ruben & Gambino: P(D_n < x) = n!/n**n (2t - 1)**n for 1/2n <= x <= 1/n
        if t <= 0.5:
            return 1.0
        return _clip(1.0 - math.exp(math.lgamma(n + 1) - n * math.log(n) + n * math.log(2 * t - 1)))
    if t >= n - 1:  # Ruben & Gambino at the other end
        return _clip(2 * (1.0 - x) ** n)
    if x >= 0.5:  # the two one-sided events are disjoint: exactly twice one tail
        return _clip(2 * smirnov_sf(n, x))
    nx2 = t * x
    if n <= 140:
        if nx2 <= 4.0:
            return _clip(1.0 - _durbin_cdf(n, x))
        return _clip(2 * smirnov_sf(n, x))  # Miller's approximation (the tails barely overlap), scipy's choice
    if nx2 >= 370.0:
        return 0.0
    if nx2 >= 2.2:
        return _clip(2 * smirnov_sf(n, x))
    if n <= 100_000 and n * x**1.5 <= 1.4:
        return _clip(1.0 - _durbin_cdf(n, x))
    return _clip(1.0 - _pelz_good_cdf(n, x))


def _matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    columns = list(zip(*b, strict=True))
    return [[math.fsum(map(mul, row, column)) for column in columns] for row in a]


def _rescaled(matrix: list[list[float]]) -> tuple[list[list[float]], int]:
    """``matrix`` divided by 2**128 while its largest entry is above that, and the exponent taken out."""
    exponent = 0
    while max(abs(v) for row in matrix for v in row) > _SCALE:
        matrix = [[v / _SCALE for v in row] for row in matrix]
        exponent += _SCALE_EXPONENT
    return matrix, exponent


def _durbin_cdf(n: int, d: float) -> float:
    """P(D_n < d) by Durbin's matrix: n!/n**n times entry (k, k) of H**n, with n*d = k - h, 0 <= h < 1, and H
    the (2k - 1)-square matrix of 1/(i - j + 1)! whose first column and last row are corrected by h. Exact
    up to rounding; its cost grows as (n*d)**3 log n, so it is used for small n*d only."""
    nd = n * d
    k = math.ceil(nd)
    h = k - nd
    m = 2 * k - 1
    inverse_factorial = [1.0 / math.factorial(i) for i in range(m + 1)]
    matrix = [[inverse_factorial[i - j + 1] if i - j + 1 >= 0 else 0.0 for j in range(m)] for i in range(m)]
    for i in range(m):
        matrix[i][0] -= h ** (i + 1) * inverse_factorial[i + 1]
        matrix[m - 1][i] -= h ** (m - i) * inverse_factorial[m - i]
    matrix[m - 1][0] += max(0.0, 2 * h - 1) ** m * inverse_factorial[m]

    power: list[list[float]] = [[1.0 if i == j else 0.0 for j in range(m)] for i in range(m)]
    exponent, square_exponent, remaining = 0, 0, n
    while remaining:
        if remaining & 1:
            power, taken = _rescaled(_matmul(power, matrix))
            exponent += square_exponent + taken
        remaining >>= 1
        if remaining:
            matrix, taken = _rescaled(_matmul(matrix, matrix))
            square_exponent = 2 * square_exponent + taken
    p = power[k - 1][k - 1]
    for i in range(1, n + 1):  # times n!/n**n, a factor at a time, rescaled as it shrinks
        p = i * p / n
        if 0.0 < abs(p) < 1.0 / _SCALE:
            p *= _SCALE
            exponent -= _SCALE_EXPONENT
    return math.ldexp(p, exponent)


def _pelz_good_cdf(n: int, x: float) -> float:
    """P(D_n < x) by Pelz & Good's (1976) expansion K0 + K1/sqrt(n) + K2/n + K3/n**1.5 in z = x sqrt(n),
    written as sums over the Jacobi theta series that converge fast for small z."""
    z = math.sqrt(n) * x
    z2 = z * z
    if -math.pi**2 / 8 / z2 < -708:  # every term underflows
        return 0.0
    pi2, pi4, pi6 = math.pi**2, math.pi**4, math.pi**6
    terms = math.ceil(16 * z / math.pi)
    k0 = k1 = k2 = k3 = 0.0
    for k in range(1, terms + 1):
        m2 = (2 * k - 1) ** 2
        weight = math.exp(-m2 * pi2 / 8 / z2)
        k0 += weight
        k1 += (-z2 + pi2 * m2 / 4) * weight
        k2 += (6 * z**6 + 2 * z**4 + (2 * z**4 - 5 * z2) * pi2 * m2 / 4 + pi4 * (1 - 2 * z2) * m2**2 / 16) * weight
        k3 += (-30 * z**6 - 90 * z**8 + pi2 * (135 * z**4 - 96 * z**6) * m2 / 4
               + pi4 * (-60 * z2 + 212 * z**4) * m2**2 / 16 + pi6 * (5 - 30 * z2) * m2**3 / 64) * weight
    root = math.sqrt(2 * math.pi)
    k0 *= root / z
    k1 *= root / (6 * z**4)
    k2 *= root / (72 * z**7)
    k3 *= root / (6480 * z**10)
    extra2 = extra3 = 0.0
    for k in range(1, terms + 1):
        weight = k * k * math.exp(-pi2 * k * k / 2 / z2)
        extra2 += weight
        extra3 += (3 * z2 - pi2 * k * k) * weight
    k2 += extra2 * pi2 * root / (-36 * z**3)
    k3 += extra3 * pi2 * root / (216 * z**6)
    root_n = math.sqrt(n)
    return k0 + k1 / root_n + k2 / n + k3 / (n * root_n)


def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma function Q(a, x) = Gamma(a, x) / Gamma(a), a > 0.

    Below x = a + 1 the series for P = 1 - Q converges fast and Q is not small (no cancellation); above it
    the continued fraction (Lentz's method) gives Q itself, so a tiny tail keeps its relative precision.
    The common factor x**a e**-x / Gamma(a) is taken in logarithms: no overflow for large a or x, and it
    underflows to 0 only where Q is below the smallest double."""
    if a <= 0.0:
        raise ValueError(f"the incomplete gamma function needs a > 0, not {a}")
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    log_factor = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        denominator = a
        for _ in range(_MAX_ITERATIONS):
            denominator += 1.0
            term *= x / denominator
            total += term
            if abs(term) < abs(total) * _EPSILON:
                break
        return _clip(1.0 - total * math.exp(log_factor))
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    fraction = d
    for i in range(1, _MAX_ITERATIONS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = d if abs(d) >= _TINY else _TINY
        c = b + an / c
        c = c if abs(c) >= _TINY else _TINY
        d = 1.0 / d
        delta = d * c
        fraction *= delta
        if abs(delta - 1.0) < _EPSILON:
            break
    return _clip(math.exp(log_factor) * fraction)


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with ``dof`` degrees of freedom (``scipy.stats.chi2.sf(x, dof)``)."""
    if dof < 1:
        raise ValueError(f"the chi-square distribution needs dof >= 1, not {dof}")
    return gamma_q(dof / 2.0, x / 2.0)
