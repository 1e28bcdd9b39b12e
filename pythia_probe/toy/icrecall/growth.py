"""Sample complexity (spec section C item 4): the smallest number N of fine-tuning prompts that
reaches a target, per (n, seed), and how it grows with the number n of stored triples.

The growth law is judged on medians over seeds, so a seed that never reaches the target (it is
censored at the largest N tried) counts only as "larger than every N tried": the median is exact
while fewer than half the seeds at each n are censored, and the verdict is "undecided" otherwise.
The grid has a floor too: N* equal to the smallest N tried means "at most that N". Where at least
half the seeds at some n sit on the floor, the median there is only an upper bound, and the
least-squares slope moves with it in a known direction: a median at an n below the mean log n
that is really smaller makes the slope larger, one above the mean makes it smaller. So a floor
below the mean forbids 'yes' (the true slope may exceed the bound), a floor above it forbids 'no',
and a floor on both sides (every n on the floor, say) leaves the law 'undecided'.
The bound of "at most polylog(n)" over the measured range is the log-log slope of (log n)^2.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pythia_probe.toy.icrecall.intervals import median_slope

THRESHOLDS = (0.95, 0.98, 0.99, 0.995)
"""Targets of P(correct relation | confusing prompt) the verdict is judged over."""


def smallest_N(w: pd.DataFrame, target: float, metric: str = "relation_prob_confusing"
               ) -> dict[tuple[int, int], float]:
    """(n, seed) -> smallest N from which every run with N' >= N reaches ``target`` (nan if the
    largest N does not). ``w``: one row per run with columns n, seed, N and ``metric``."""
    out = {}
    for (n, seed), g in w.groupby(["n", "seed"]):
        g = g.sort_values("N")
        ok = (g[metric] >= target).tolist()
        Ns = g["N"].tolist()
        out[(int(n), int(seed))] = next((float(Ns[i]) for i in range(len(ok)) if all(ok[i:])),
                                        float("nan"))
    return out


def polylog_bound(n_lo: float, n_hi: float, power: float = 2.0) -> float:
    """Log-log slope of (log n)^power between n_lo and n_hi: the largest slope of log N* on
    log n that growth as slow as (log n)^power can show over that range."""
    return power * (math.log(math.log(n_hi)) - math.log(math.log(n_lo))) / (
        math.log(n_hi) - math.log(n_lo))


def floor_sides(best: dict[tuple[int, int], float], floor: float) -> tuple[list[int], bool, bool]:
    """The n where at least half the seeds have N* == ``floor`` (the smallest N tried: their
    median is only known to be <= floor), and whether any of them lies below / above the mean
    log n (where a smaller true median would raise / lower the least-squares slope)."""
    by_n: dict[int, list[float]] = {}
    for (n, _), v in best.items():
        by_n.setdefault(n, []).append(v)
    bound = sorted(n for n, v in by_n.items() if 2 * sum(x == floor for x in v) >= len(v))
    mean = float(np.mean([math.log(n) for n in by_n]))
    tol = 1e-9 * max(1.0, abs(mean))
    return (bound, any(math.log(n) < mean - tol for n in bound),
            any(math.log(n) > mean + tol for n in bound))


def growth_fit(best: dict[tuple[int, int], float], cap: float,
               floor: float | None = None) -> dict[str, float]:
    """Slope of log(median N*) on log n and on log log n (N* ~ (log n)^k), each with a bootstrap
    95% interval over seeds; N* = nan (never reached) stands in as ``cap`` (above every N tried).
    Also: censored (count), censored_frac_max (largest censored fraction at one n) and, with
    ``floor`` (the smallest N tried), floor_below / floor_above (1.0 when the grid floor binds
    the median at some n below / above the mean log n: :func:`floor_sides`)."""
    by_n: dict[int, list[float]] = {}
    for (n, _), v in best.items():
        by_n.setdefault(n, []).append(cap if math.isnan(v) else v)
    logs = {math.log(n): np.log(v) for n, v in by_n.items()}
    loglogs = {math.log(math.log(n)): np.log(v) for n, v in by_n.items()}
    out = {f"loglog_{k}": v for k, v in median_slope(logs).items()}
    out.update({f"polylog_{k}": v for k, v in median_slope(loglogs).items()})
    out["censored"] = float(sum(math.isnan(v) for v in best.values()))
    out["censored_frac_max"] = max(
        float(np.mean([math.isnan(v) for (m, _), v in best.items() if m == n])) for n in by_n)
    if floor is not None:
        _, below, above = floor_sides(best, floor)
        out["floor_below"], out["floor_above"] = float(below), float(above)
    return out


def growth_verdict(fit: dict[str, float], bound: float) -> str:
    """'yes' if the slope's upper end is <= ``bound`` and the grid floor binds at no n below the
    mean log n; 'no' if its lower end exceeds ``bound`` and the floor binds at no n above it;
    'undecided' otherwise: the interval straddles the bound, or the floor hides the direction
    that would decide (module doc), or at some n at least half the seeds never reach the
    target (the median is unknown there)."""
    if fit["censored_frac_max"] >= 0.5:
        return "undecided"
    if fit["loglog_slope_hi"] <= bound and not fit.get("floor_below", 0.0):
        return "yes"
    if fit["loglog_slope_lo"] > bound and not fit.get("floor_above", 0.0):
        return "no"
    return "undecided"


def over_thresholds(w: pd.DataFrame, cap: float, thresholds=THRESHOLDS
                    ) -> dict[float, tuple[dict, dict]]:
    """target -> (smallest N per (n, seed), growth fit with the grid floor = the smallest N in
    ``w``), for every target in ``thresholds``."""
    floor = float(w["N"].min())
    out = {}
    for t in thresholds:
        best = smallest_N(w, t)
        out[t] = (best, growth_fit(best, cap, floor))
    return out


def judge_thresholds(verdicts: dict[float, str]) -> str:
    """One verdict over thresholds: 'yes' if every threshold says yes; 'partly' if some (not
    all) say yes; otherwise 'no' if some say no, else 'undecided'. A 'no' with the rest
    undecided is a 'no': no threshold supports the claim and one refutes it."""
    vals = list(verdicts.values())
    if vals and all(v == "yes" for v in vals):
        return "yes"
    if "yes" in vals:
        return "partly"
    return "no" if "no" in vals else "undecided"
