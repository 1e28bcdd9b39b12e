"""Confidence intervals for the IC-recall tables: Wilson for proportions, percentile bootstrap
for means, medians and fitted slopes. All 95% two-sided by default."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

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
