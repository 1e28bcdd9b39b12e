"""Sample complexity (spec section C item 4): the smallest number N of fine-tuning prompts that
reaches a target, per (n, seed), and how it grows with the number n of stored triples.

The growth law is judged on medians over seeds, so a seed that never reaches the target (it is
censored at the largest N tried) counts only as "larger than every N tried": the median is exact
while fewer than half the seeds at each n are censored, and the verdict is "undecided" otherwise.
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


def growth_fit(best: dict[tuple[int, int], float], cap: float) -> dict[str, float]:
    """Slope of log(median N*) on log n and on log log n (N* ~ (log n)^k), each with a bootstrap
    95% interval over seeds; N* = nan (never reached) stands in as ``cap`` (above every N tried).
    Also: censored (count), censored_frac_max (largest censored fraction at one n)."""
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
    return out


def growth_verdict(fit: dict[str, float], bound: float) -> str:
    """'undecided' if at some n at least half the seeds never reach the target (the median is
    unknown there) or the slope's interval straddles ``bound``; 'yes' if its upper end is
    <= bound; 'no' if its lower end exceeds it."""
    if fit["censored_frac_max"] >= 0.5:
        return "undecided"
    if fit["loglog_slope_hi"] <= bound:
        return "yes"
    return "no" if fit["loglog_slope_lo"] > bound else "undecided"


def over_thresholds(w: pd.DataFrame, cap: float, thresholds=THRESHOLDS
                    ) -> dict[float, tuple[dict, dict]]:
    """target -> (smallest N per (n, seed), growth fit), for every target in ``thresholds``."""
    out = {}
    for t in thresholds:
        best = smallest_N(w, t)
        out[t] = (best, growth_fit(best, cap))
    return out


def judge_thresholds(verdicts: dict[float, str]) -> str:
    """One verdict over thresholds: the common one if every threshold agrees, else 'partly'
    (the answer depends on the threshold)."""
    vals = set(verdicts.values())
    return vals.pop() if len(vals) == 1 else "partly"
