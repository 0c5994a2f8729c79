"""Telling a real difference from noise between repeated runs: Welch's t-test.

Welch's test (two samples, unequal variances) is the one benchmark tools use for a handful of
repetitions per configuration; its p-value needs Student's t distribution, computed here from
the regularized incomplete beta function rather than by importing SciPy (about 40 MB) into
every install for one function. The test suite checks it against published table values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SIGNIFICANCE = 0.05  # two-sided


@dataclass
class Summary:
    n: int
    mean: float
    std: float  # sample standard deviation (n - 1); 0 for one value


def summarize(values: Sequence[float]) -> Summary:
    n = len(values)
    if n == 0:
        return Summary(0, math.nan, math.nan)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return Summary(n, mean, math.sqrt(var))


@dataclass
class WelchResult:
    t: float
    df: float
    p: float  # two-sided

    @property
    def significant(self) -> bool:
        return self.p < SIGNIFICANCE


def welch_test(a: Sequence[float], b: Sequence[float]) -> WelchResult | None:
    """Welch's two-sided t-test of mean(a) != mean(b); None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    sa, sb = summarize(a), summarize(b)
    va, vb = sa.std ** 2 / sa.n, sb.std ** 2 / sb.n
    if va + vb == 0:
        # No spread at all: any difference is exact, none is none.
        same = sa.mean == sb.mean
        return WelchResult(t=0.0 if same else math.inf, df=float(sa.n + sb.n - 2), p=1.0 if same else 0.0)
    t = (sa.mean - sb.mean) / math.sqrt(va + vb)
    # Welch-Satterthwaite degrees of freedom.
    df = (va + vb) ** 2 / ((va ** 2 / (sa.n - 1) if va else 0.0) + (vb ** 2 / (sb.n - 1) if vb else 0.0))
    return WelchResult(t=t, df=df, p=t_two_sided_p(t, df))


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    x = df / (df + t * t)
    return min(1.0, max(0.0, regularized_beta(x, df / 2.0, 0.5)))


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by its continued fraction (modified Lentz), on the side where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        # The even step, then the odd step, of the fraction's terms.
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return result
