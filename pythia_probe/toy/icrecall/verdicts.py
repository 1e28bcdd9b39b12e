"""The rules that turn the IC-recall result tables into verdicts on the paper's claims.

Every rule is judged per seed (seeds are the unit of replication) on measures that a confused
state fails (the control rows show it), and every interval is over seeds:
- pattern (items 1, 5, 6): a seed passes when its within-pair gap <= GAP, its mass on s_query +
  '?' <= OFF and P(correct relation | confusing prompt) >= TELL;
- accuracy (items 2, 5): a seed passes when the Wilson 95% lower bounds (over that seed's own
  prompts: a per-seed measure) of its two-step accuracies sampled at the memory's temperature
  reach REL (relation) and ANS (answer);
- 'yes' if every seed passes, 'partly' if at least half the seeds pass a looser test (twice the
  tolerances; point estimates instead of bounds), else 'no';
- k > 2 pairs (item 6): the pattern rule with tolerances set by the k = 2 control run beside it
  (:func:`relative_limits`), so k > 2 is held to what k = 2 achieves in the same setting;
- dynamics (item 3): judged from the ablations (:func:`dynamics_verdict`): the curvature at
  GD's stalls and random perturbations there (is it a saddle that a perturbation escapes?), with
  the paired time-to-escape test (:func:`paired`) as the speed-up; a test that is not significant
  is reported, never read as a refutation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pythia_probe.toy.icrecall.intervals import (
    clopper_pearson,
    dispersion_ratio,
    sign_test,
    t_interval,
    wilson,
)

GAP, OFF = 0.05, 0.05  # pattern: within-pair gap, mass on s_query + '?'
TELL = 0.99  # P(correct relation | confusing prompt), every seed
REL, ANS = 0.999, 0.995  # sampled two-step accuracy (relation, answer), per-seed Wilson bound
ALPHA = 0.05  # level of the paired tests
LIMITS = {"gap": GAP, "off": OFF, "tell": TELL}


def seeds_passing(ok: list[bool]) -> str:
    """'k/n seeds [exact binomial 95%]'."""
    k, n = sum(ok), len(ok)
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} seeds [{lo:.2f}, {hi:.2f}]"


def seed_mean(values, digits: int = 4) -> str:
    """'mean [t 95% over seeds]' of one value per seed (every measure here lies in [0, 1]: the
    interval is clipped to it)."""
    v = np.asarray(values, dtype=float)
    lo, hi = (min(max(x, 0.0), 1.0) for x in t_interval(v))
    return f"{v.mean():.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def verdict(strict: list[bool], loose: list[bool]) -> str:
    """yes: every seed passes; partly: at least half the seeds pass the looser test; else no."""
    if strict and all(strict):
        return "yes"
    return "partly" if loose and 2 * sum(loose) >= len(loose) else "no"


def pattern_ok(r: pd.Series, scale: float = 1.0, limits: dict | None = None) -> bool:
    lim = limits or LIMITS
    return bool(r["relation_prob_confusing"] >= lim["tell"]
                and r["pair_gap_max"] <= scale * lim["gap"]
                and r["offpair_mass"] <= scale * lim["off"])


def pattern_failures(w: pd.DataFrame, limits: dict | None = None) -> dict[str, int]:
    """How many seeds (rows of ``w``) fail each part of the strict pattern rule: 'tell'
    (P(conf) below its limit), 'gap' (within-pair gap above), 'off' (mass off the pairs above)."""
    lim = limits or LIMITS
    return {"tell": int((w["relation_prob_confusing"] < lim["tell"]).sum()),
            "gap": int((w["pair_gap_max"] > lim["gap"]).sum()),
            "off": int((w["offpair_mass"] > lim["off"]).sum())}


def failures_text(w: pd.DataFrame, limits: dict | None = None) -> str:
    """'P(conf) < 0.9900 on 4/5 seeds (min 0.9679), within-pair gap > 0.050 on 0/5, mass on
    s_query+'?' > 0.079 on 0/5': which part of the pattern rule the seeds fail."""
    lim = limits or LIMITS
    f, n = pattern_failures(w, lim), len(w)
    return (f"P(conf) < {lim['tell']:.4f} on {f['tell']}/{n} seeds (min "
            f"{w['relation_prob_confusing'].min():.4f}), within-pair gap > {lim['gap']:.3f} on "
            f"{f['gap']}/{n}, mass on s_query+'?' > {lim['off']:.3f} on {f['off']}/{n}")


def pattern_rule(limits: dict | None = None) -> str:
    lim = limits or LIMITS
    return (f"a seed passes when its within-pair gap <= {lim['gap']:.3f}, mass on s_query+'?' <= "
            f"{lim['off']:.3f} and P(conf) >= {lim['tell']:.4f}; 'yes' if every seed passes, "
            "'partly' if at least half the seeds pass with twice the gap and mass tolerances, "
            "else 'no'")


ACCURACY_RULE = (f"a seed passes when the Wilson 95% lower bounds (over its own prompts) of its "
                 f"two-step accuracies sampled at the memory's temperature reach relation >= "
                 f"{REL} and answer >= {ANS}; 'yes' if every seed passes, 'partly' if at least "
                 "half the seeds reach them by point estimate, else 'no'")


def pattern_verdict(w: pd.DataFrame, limits: dict | None = None) -> tuple[str, str]:
    """The pattern rule over the runs (one per seed) in ``w``: (verdict, text)."""
    strict = [pattern_ok(r, 1.0, limits) for _, r in w.iterrows()]
    loose = [pattern_ok(r, 2.0, limits) for _, r in w.iterrows()]
    txt = (f"pattern passes on {seeds_passing(strict)}; within-pair gap mean "
           f"{seed_mean(w['pair_gap_max'], 3)} (max {w['pair_gap_max'].max():.3f}), mass on "
           f"s_query+'?' mean {seed_mean(w['offpair_mass'], 3)} (max "
           f"{w['offpair_mass'].max():.3f}), pair masses {w['pair_mass_min'].min():.3f}-"
           f"{w['pair_mass_max'].max():.3f}, P(conf) mean "
           f"{seed_mean(w['relation_prob_confusing'])} (min "
           f"{w['relation_prob_confusing'].min():.4f})")
    return verdict(strict, loose), txt


def _seed_accuracy(r: pd.Series, bound: bool) -> bool:
    n = r["n_all"]
    rel = wilson(round(r["relation_sampled"] * n), n)[0] if bound else r["relation_sampled"]
    ans = wilson(round(r["answer_sampled"] * n), n)[0] if bound else r["answer_sampled"]
    return bool(rel >= REL and ans >= ANS)


def spread(w: pd.DataFrame, metric: str, n_col: str = "n_all") -> float:
    """How many times more ``metric`` varies across seeds than one seed's prompts make it vary
    (:func:`~pythia_probe.toy.icrecall.intervals.dispersion_ratio`)."""
    return dispersion_ratio(w[metric].to_numpy(float), w[n_col].to_numpy(float))


def accuracy_verdict(w: pd.DataFrame) -> tuple[str, str]:
    """The accuracy rule over the runs (seeds) in ``w``: (verdict, text); means over seeds with
    t intervals over seeds, argmax beside."""
    strict = [_seed_accuracy(r, True) for _, r in w.iterrows()]
    loose = [_seed_accuracy(r, False) for _, r in w.iterrows()]
    ratio = spread(w, "relation_sampled")
    txt = (f"sampled accuracy passes on {seeds_passing(strict)}; mean over seeds [t 95%]: "
           f"sampled relation {seed_mean(w['relation_sampled'], 5)} (confusing "
           f"{seed_mean(w['relation_sampled_confusing'], 5)}), sampled answer "
           f"{seed_mean(w['answer_sampled'], 5)}; argmax relation "
           f"{seed_mean(w['relation_acc'], 5)}, answer {seed_mean(w['answer_acc'], 5)}; "
           f"{int(w['n_all'].iloc[0])} fresh prompts per seed")
    if ratio == ratio:
        txt += (f"; seeds vary {ratio:.1f} times more than prompts (SD over seeds of the sampled "
                "relation accuracy / one seed's binomial SE)")
    return verdict(strict, loose), txt


def relative_limits(control: pd.DataFrame) -> dict[str, float]:
    """Pattern tolerances set by a control run (the k = 2 row of the k-pairs experiment): its
    worst seed's gap, mass off the pairs and P(conf), never stricter than the absolute rule's
    GAP / OFF / TELL loosened to them; the control passes its own limits by construction."""
    return {"gap": max(GAP, float(control["pair_gap_max"].max())),
            "off": max(OFF, float(control["offpair_mass"].max())),
            "tell": min(TELL, float(control["relation_prob_confusing"].min()))}


def dynamics_verdict(n_stalls: int, n_strict: int, perturb_frac: float, faster_gd: bool) -> str:
    """Item 3 from the ablations. n_stalls: GD runs stalled at the dynamics runs' end on
    two-sided training sets (their curvature measured), n_strict: how many of them are strict
    saddles; perturb_frac: mean over those stalls of the fraction of random perturbations of
    radius rho_p that escape (nan if none drawn); faster_gd: PGD escapes earlier than GD by the
    paired test.
    'yes': every stall is a strict saddle, perturbations escape in at least half the draws and
    PGD is earlier by the test. 'no': the ablations contradict the mechanism (no stall is a
    strict saddle, perturbations escape in fewer than half the draws) and PGD is not earlier by
    the test. 'undecided': no stall to examine and no significant test. 'partly' otherwise (some
    part of the claim is seen)."""
    escapes = perturb_frac == perturb_frac and perturb_frac >= 0.5
    if n_stalls == 0:
        return "partly" if faster_gd else "undecided"
    if n_strict == n_stalls and escapes and faster_gd:
        return "yes"
    if n_strict == 0 and not escapes and not faster_gd:
        return "no"
    return "partly"


def discriminates(uniform: float, one_pair: float, ideal: float, tell: float = TELL) -> bool:
    """Whether P(conf) can tell on a memory whether attention found the pairs: attention spread
    over the whole prompt (the uniform row) does no better than reading one pair (the confused
    state: P(conf) of the one-pair row), and the ideal pairwise row reaches ``tell``. Without it
    a trained row's P(conf) says nothing about the pattern (a memory that reads any mixture)."""
    return uniform <= one_pair and ideal >= tell


def combine(*verdicts: str) -> str:
    """'yes' if all are yes; 'partly' if any is yes or partly; else 'no'."""
    if verdicts and all(v == "yes" for v in verdicts):
        return "yes"
    return "partly" if any(v in ("yes", "partly") for v in verdicts) else "no"


def paired(a: pd.Series, b: pd.Series) -> dict[str, float]:
    """Paired seeds, time to escape (nan = censored, i.e. later than every observed time of its
    run): wins (a escapes strictly earlier than b), losses, ties (equal, or both censored), and
    the exact two-sided sign-test p-value of wins against losses. a and b are indexed by seed."""
    both = a.index.intersection(b.index)
    inf = float("inf")
    x, y = a[both].fillna(inf), b[both].fillna(inf)
    wins, losses = int((x < y).sum()), int((x > y).sum())
    return {"wins": wins, "losses": losses, "ties": len(both) - wins - losses,
            "p": sign_test(wins, losses)}


def escaped_by(steps: pd.Series, S: float) -> pd.Series:
    """Whether each run (nan = censored) escaped at or before step S."""
    return steps.fillna(float("inf")) <= S


def mcnemar(a: pd.Series, b: pd.Series, S: float) -> dict[str, float]:
    """Exact McNemar test on escaped-by-step-S over paired seeds: b10 (a escaped, b not), b01
    and the two-sided p of the discordant pairs."""
    both = a.index.intersection(b.index)
    ea, eb = escaped_by(a[both], S), escaped_by(b[both], S)
    b10, b01 = int((ea & ~eb).sum()), int((~ea & eb).sum())
    return {"b10": b10, "b01": b01, "p": sign_test(b10, b01)}


def faster(test: dict[str, float], alpha: float = ALPHA) -> bool:
    """The paired test says the first arm escapes earlier."""
    return test["wins"] > test["losses"] and test["p"] < alpha


def censored_text(steps: pd.Series, cap: float) -> str:
    """Per seed: the escape step, or '>cap' when censored."""
    return "/".join(f">{cap:.0f}" if math.isnan(v) else f"{v:.0f}" for v in steps)
