"""Confidence intervals and tests for the IC-recall tables, all 95% two-sided by default.

Seeds are the unit of replication: a claim about the method is judged on per-seed values (a
Student-t interval of their mean, a bootstrap over seeds for medians and slopes, an exact
binomial interval on the number of seeds that pass, an exact sign test on paired seeds). The
Wilson interval over one run's prompts is a per-seed measure only: seeds vary far more than
prompts (:func:`dispersion_ratio`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

Z95 = 1.959963984540054


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials ((nan, nan) when n = 0)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k <= 0 else max(0.0, mid - half)
    return lo, 1.0 if k >= n else min(1.0, mid + half)


def bootstrap(values: Sequence[float] | np.ndarray, stat: Callable = np.mean,
              n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (applied along axis 1 of the resampled matrix)
    over ``values``; (nan, nan) for no values, (x, x) for one."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    stats = stat(x[idx], axis=1)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y on x."""
    A = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(coef[0]), float(coef[1])


def bootstrap_slope(groups: dict[float, Sequence[float]], n_boot: int = 2000,
                    level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Slope of y on x fitted to every (x, y) point, with a percentile bootstrap interval that
    resamples the y's within each x (stratified: every x keeps its number of points).
    ``groups``: x -> the y values observed at x (e.g. log n -> log N* per seed)."""
    xs = sorted(groups)
    if len(xs) < 2:
        raise ValueError("a slope needs at least two distinct x")
    ys = [np.asarray(groups[x], dtype=float) for x in xs]
    X = np.concatenate([np.full(len(y), x) for x, y in zip(xs, ys, strict=True)])
    intercept, slope = fit_line(X, np.concatenate(ys))
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        Y = np.concatenate([y[rng.integers(0, len(y), len(y))] for y in ys])
        boots[b] = fit_line(X, Y)[1]
    a = (1 - level) / 2
    return {"intercept": intercept, "slope": slope, "slope_lo": float(np.quantile(boots, a)),
            "slope_hi": float(np.quantile(boots, 1 - a))}


def t_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of ``values`` (one value per seed: seeds are the unit of
    replication); (nan, nan) for no values, (x, x) for one."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    m = float(x.mean())
    if x.size == 1:
        return m, m
    t = float(scipy_stats.t.ppf(0.5 + level / 2, x.size - 1))
    half = t * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m - half, m + half


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) binomial interval for k successes in n trials (e.g. seeds that
    pass); (nan, nan) when n = 0."""
    if n <= 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo = 0.0 if k <= 0 else float(scipy_stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k >= n else float(scipy_stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value of ``wins`` against ``losses`` (ties left out; 1.0 when
    there is no untied pair). On discordant pairs of a binary outcome it is the exact McNemar
    test."""
    n = wins + losses
    if n == 0:
        return 1.0
    return float(scipy_stats.binomtest(wins, n, 0.5).pvalue)


def dispersion_ratio(p: Sequence[float], n: Sequence[float]) -> float:
    """How much more per-seed proportions vary than prompts would make them vary: the standard
    deviation of the per-seed proportions p_i over the binomial standard error of one seed,
    sqrt(mean p_i (1 - p_i) / n_i). Near 1 when seeds differ only by prompt sampling; nan with
    fewer than two seeds or no binomial spread."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    within = float(np.mean(p * (1 - p) / n)) if p.size else 0.0
    if p.size < 2 or within <= 0:
        return float("nan")
    return float(p.std(ddof=1)) / math.sqrt(within)


def median_slope(groups: dict[float, Sequence[float]], n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> dict[str, float]:
    """Least-squares slope of the per-x median of y on x, with a percentile bootstrap interval
    that resamples the y's within each x. Medians tolerate censored y's (stand-ins above every
    observed value) as long as fewer than half are censored at each x."""
    xs = sorted(groups)
    if len(xs) < 2:
        raise ValueError("a slope needs at least two distinct x")
    ys = [np.asarray(groups[x], dtype=float) for x in xs]
    X = np.asarray(xs, dtype=float)
    intercept, slope = fit_line(X, np.array([np.median(y) for y in ys]))
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        boots[b] = fit_line(X, np.array([np.median(y[rng.integers(0, len(y), len(y))])
                                         for y in ys]))[1]
    a = (1 - level) / 2
    return {"intercept": intercept, "slope": slope, "slope_lo": float(np.quantile(boots, a)),
            "slope_hi": float(np.quantile(boots, 1 - a))}
