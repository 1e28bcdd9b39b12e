"""The verdict rules of the IC-recall summary on constructed cases that must pass and must fail:
intervals and tests over seeds, paired time-to-escape comparisons with censoring, the growth
law over thresholds, the relative rule for k > 2 pairs, the escape criterion."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from pythia_probe.toy.icrecall import growth
from pythia_probe.toy.icrecall import verdicts as V
from pythia_probe.toy.icrecall.escape import EscapeConfig, escape_of, escape_stop, streak_start
from pythia_probe.toy.icrecall.intervals import (
    clopper_pearson,
    dispersion_ratio,
    median_slope,
    sign_test,
    t_interval,
)

NAN = float("nan")


# ---- intervals and tests over seeds --------------------------------------------------------

def test_t_interval_against_scipy_and_edge_cases():
    x = np.array([0.9, 0.95, 0.99, 0.97, 0.5])
    lo, hi = t_interval(x)
    want = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
    assert (lo, hi) == pytest.approx(want, rel=1e-12)
    assert t_interval([0.3]) == (0.3, 0.3) and all(map(math.isnan, t_interval([])))


def test_seed_mean_is_clipped_to_the_unit_interval():
    text = V.seed_mean([0.99, 1.0, 0.5])
    lo, hi = (float(v) for v in text.split("[")[1].rstrip("]").split(","))
    assert lo >= 0 and hi == 1.0 and text.startswith("0.8300")


@pytest.mark.parametrize("k,n", [(0, 5), (3, 8), (5, 5), (12, 40)])
def test_clopper_pearson_against_scipy(k, n):
    want = scipy_stats.binomtest(k, n).proportion_ci(method="exact")
    assert clopper_pearson(k, n) == pytest.approx((want.low, want.high), abs=1e-12)


def test_sign_test_exact_values():
    assert sign_test(3, 0) == pytest.approx(0.25)  # 3 of 8 paired seeds, 5 ties: the old C3
    assert sign_test(6, 0) == pytest.approx(2 / 64)
    assert sign_test(8, 0) == pytest.approx(2 / 256)
    assert sign_test(7, 1) == pytest.approx(2 * 9 / 256)
    assert sign_test(0, 0) == 1.0


def test_dispersion_ratio_is_one_for_prompt_noise_and_large_for_seed_effects():
    rng = np.random.default_rng(0)
    n = np.full(400, 2000.0)
    same = rng.binomial(2000, 0.9, 400) / 2000  # seeds differ only by their prompts
    assert 0.85 < dispersion_ratio(same, n) < 1.15
    varied = np.clip(rng.normal(0.9, 0.05, 400), 0, 1)  # a real seed effect
    assert dispersion_ratio(varied, n) > 5
    assert math.isnan(dispersion_ratio([0.5], [10]))


def test_median_slope_recovers_a_power_law_and_ignores_a_censored_minority():
    groups = {math.log(n): [math.log(2 * n**0.5)] * 5 for n in (10.0, 1e3, 1e5)}
    fit = median_slope(groups)
    assert fit["slope"] == pytest.approx(0.5) and fit["slope_hi"] - fit["slope_lo"] < 1e-9
    groups[math.log(1e5)][0] = math.log(1e9)  # 1 of 5 censored far above: the median holds
    assert median_slope(groups)["slope"] == pytest.approx(0.5)


# ---- per-seed rules --------------------------------------------------------------------

GOOD = {"pair_gap_max": 0.01, "offpair_mass": 0.01, "pair_mass_min": 0.49, "pair_mass_max": 0.5,
        "relation_prob_confusing": 0.999, "n_all": 100000, "relation_sampled": 0.9999,
        "relation_sampled_confusing": 0.9998, "answer_sampled": 0.9995, "relation_acc": 1.0,
        "answer_acc": 0.999}


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame([{**GOOD, **r} for r in rows])


@pytest.mark.parametrize("change,verdict", [
    ({}, "yes"), ({"pair_gap_max": 0.08}, "partly"), ({"offpair_mass": 0.3}, "no"),
    ({"relation_prob_confusing": 0.95}, "no")])
def test_pattern_rule(change, verdict):
    w = frame({}, change, change)
    assert V.pattern_verdict(w)[0] == verdict


def test_accuracy_rule_uses_each_seeds_own_bound_and_reports_the_seed_spread():
    assert V.accuracy_verdict(frame({}, {}))[0] == "yes"
    assert V.accuracy_verdict(frame({}, {"relation_sampled": 0.9992, "n_all": 2000}))[0] == \
        "partly"  # 0.9992 of 2000 prompts cannot certify 0.999
    verdict, text = V.accuracy_verdict(frame({"relation_sampled": 0.95}, {}, {}))
    assert verdict == "partly" and "seeds vary" in text and "[0." in text


def test_relative_limits_hold_k_above_2_to_the_k2_control():
    control = frame({"offpair_mass": 0.079}, {"offpair_mass": 0.06},
                    {"relation_prob_confusing": 0.9973})
    assert V.pattern_verdict(control)[0] == "partly"  # the control fails the absolute rule
    lim = V.relative_limits(control)
    assert lim == {"gap": V.GAP, "off": 0.079, "tell": V.TELL}
    assert V.pattern_verdict(control, lim)[0] == "yes"  # ... and passes its own limits
    same = frame({"offpair_mass": 0.07}, {"offpair_mass": 0.075}, {})
    assert V.pattern_verdict(same, lim)[0] == "yes"
    worse = frame({"relation_prob_confusing": 0.97}, {"relation_prob_confusing": 0.96}, {})
    assert V.pattern_verdict(worse, lim)[0] == "no"
    looser = V.relative_limits(frame({"relation_prob_confusing": 0.95}))
    assert looser["tell"] == 0.95  # a weaker control lowers the bar it sets


# ---- paired time to escape -----------------------------------------------------------

def steps(*v) -> pd.Series:
    return pd.Series([float(x) for x in v], index=range(len(v)))


def test_paired_counts_censored_runs_as_later_and_two_censored_as_a_tie():
    t = V.paired(steps(10, NAN, 30, NAN), steps(20, NAN, NAN, 50))
    assert (t["wins"], t["losses"], t["ties"]) == (2, 1, 1)
    assert t["p"] == pytest.approx(1.0)


@pytest.mark.parametrize("pgd,gd,faster", [
    ((10,) * 8, (20,) * 8, True),  # 8 of 8 earlier: p = 0.0078
    ((10,) * 6 + (20, 20), (20,) * 8, True),  # 6 earlier, 2 tied: p = 0.031
    ((10, 10, 10) + (20,) * 5, (20,) * 8, False),  # 3 earlier, 5 tied: p = 0.25 (the old C3)
    ((10,) * 7 + (30,), (20,) * 8, False),  # 7 earlier, 1 later: p = 0.07
    ((20,) * 8, (10,) * 8, False),  # significantly later
])
def test_faster_needs_a_significant_paired_test(pgd, gd, faster):
    assert V.faster(V.paired(steps(*pgd), steps(*gd))) is faster


@pytest.mark.parametrize("uniform,one_pair,ideal,ok", [
    (0.068, 0.744, 0.9993, True),  # the constructed memory's control rows
    (0.9757, 0.7467, 0.9966, False),  # the first pre-trained memory: uniform reads it too
    (0.30, 0.75, 0.985, False),  # the ideal row itself misses 0.99
    (0.75, 0.75, 0.999, True),  # no better than one pair
])
def test_a_memory_discriminates_when_uniform_attention_fails_and_the_ideal_row_passes(
        uniform, one_pair, ideal, ok):
    assert V.discriminates(uniform, one_pair, ideal) == ok


@pytest.mark.parametrize("stalls,strict,frac,faster,verdict", [
    (4, 4, 0.8, True, "yes"),
    (4, 4, 0.8, False, "partly"),  # a test that is not significant refutes nothing
    (4, 0, 0.1, False, "no"),  # the ablations refute it: no strict saddle, no escape
    (4, 0, 0.1, True, "partly"),  # PGD faster, but not through a saddle it perturbs out of
    (4, 2, 0.1, False, "partly"),  # some stalls strict saddles
    (4, 0, 0.6, False, "partly"),  # perturbations do escape
    (4, 0, NAN, False, "no"),  # no perturbation drawn counts as no escape
    (0, 0, NAN, False, "undecided"),  # nothing to examine
    (0, 0, NAN, True, "partly"),
])
def test_item_3_verdict_rests_on_the_ablations(stalls, strict, frac, faster, verdict):
    assert V.dynamics_verdict(stalls, strict, frac, faster) == verdict


def test_mcnemar_on_escaped_by_step_S():
    m = V.mcnemar(steps(50, 100, 5000, NAN), steps(4000, 100, 50, NAN), 3000)
    assert (m["b10"], m["b01"]) == (1, 1) and m["p"] == 1.0
    assert V.censored_text(steps(10, NAN), 50000) == "10/>50000"


# ---- the escape criterion --------------------------------------------------------------

def hist(*ps, every=10):
    return [{"step": float(i * every), "relation_prob_confusing": p} for i, p in enumerate(ps)]


def test_escape_needs_the_level_held_for_confirm_steps():
    cfg = EscapeConfig(level=0.95, confirm=20, max_steps=100, check_every=10)
    touch = hist(0.5, 0.96, 0.9, 0.97, 0.98, 0.99)  # touches at 10, falls back, holds from 30
    assert streak_start(touch, 0.95) == 30
    assert escape_stop(0.95, 20)(touch) and escape_of(touch, cfg).step == 30
    short = hist(0.5, 0.5, 0.97, 0.98)  # above from 20, held only 10 steps: censored
    e = escape_of(short, cfg)
    assert e.censored and math.isnan(e.step) and not escape_stop(0.95, 20)(short)
    assert e.steps_run == 31 and e.final == 0.98
    assert math.isnan(streak_start(hist(0.99, 0.5), 0.95))


# ---- the growth law over thresholds ----------------------------------------------------

def samples_table(law, ns=(1000, 10000, 100000), Ns=(2, 4, 8, 16, 32, 64, 128), seeds=4):
    """P(conf) per (n, N, seed): reaches 0.999 from N*(n) = law(n) on, else 0.9 (a seed never
    reaches it when law returns nan)."""
    rows = []
    for n in ns:
        for s in range(seeds):
            star = law(n, s)
            for N in Ns:
                rows.append({"n": n, "seed": s, "N": N,
                             "relation_prob_confusing": 0.999 if star == star and N >= star
                             else 0.9})
    return pd.DataFrame(rows)


def judge(w, t=0.99):
    best = growth.smallest_N(w, t)
    fit = growth.growth_fit(best, 256)
    return growth.growth_verdict(fit, growth.polylog_bound(1000, 100000)), fit


def test_growth_rule_on_constructed_laws():
    assert growth.polylog_bound(1000, 100000) == pytest.approx(0.2219, abs=1e-4)
    assert judge(samples_table(lambda n, s: 8))[0] == "yes"  # flat
    assert judge(samples_table(lambda n, s: 2 * (n / 1000) ** 0.5))[0] == "no"  # sqrt(n)
    never = judge(samples_table(lambda n, s: NAN if n == 100000 and s < 2 else 8))
    assert never[0] == "undecided" and never[1]["censored_frac_max"] == 0.5
    mixed = samples_table(lambda n, s: [2, 128, 8, 32][s] if n == 1000 else [128, 2, 4, 64][s])
    assert judge(mixed)[0] == "undecided"  # the interval straddles the bound


def judge_floor(law, t=0.99):
    """The growth rule with the grid floor (the smallest N tried, 2) taken into account."""
    w = samples_table(law)
    best, fit = growth.over_thresholds(w, 256, thresholds=(t,))[t]
    return growth.growth_verdict(fit, growth.polylog_bound(1000, 100000)), fit, best


def test_grid_floor_everywhere_is_undecided_not_yes():
    """N* = 2 (the smallest N tried) at every n: the slope 0 says nothing, the true medians are
    only 'at most 2'. Without the floor the same table reads 'yes'."""
    verdict, fit, best = judge_floor(lambda n, s: 2)
    assert fit["loglog_slope_hi"] == pytest.approx(0.0)
    assert judge(samples_table(lambda n, s: 2))[0] == "yes"  # the old rule, floor ignored
    assert verdict == "undecided" and fit["floor_below"] == fit["floor_above"] == 1.0
    assert growth.floor_sides(best, 2) == ([1000, 10000, 100000], True, True)


@pytest.mark.parametrize("law,verdict,sides", [
    # floor at the smallest n only, steep growth after: a smaller true median there makes the
    # slope steeper still, so 'no' stands
    (lambda n, s: {1000: 2, 10000: 16, 100000: 128}[n], "no", ([1000], True, False)),
    # floor at the largest n only, N* falling: the true slope is lower still, so 'yes' stands
    (lambda n, s: {1000: 32, 10000: 8, 100000: 2}[n], "yes", ([100000], False, True)),
    # floor at the middle n (the mean log n): it moves no end of the slope
    (lambda n, s: {1000: 8, 10000: 2, 100000: 8}[n], "yes", ([10000], False, False)),
    # half the seeds on the floor at the smallest n, flat elsewhere: 'yes' is ruled out
    (lambda n, s: 2 if n == 1000 and s < 2 else 8, "undecided", ([1000], True, False)),
    # one seed of four on the floor: the median is exact, the flat law reads 'yes'
    (lambda n, s: 2 if n == 100000 and s == 0 else 8, "yes", ([], False, False)),
])
def test_grid_floor_rules_out_only_the_end_it_could_move(law, verdict, sides):
    got, _, best = judge_floor(law)
    assert got == verdict
    assert growth.floor_sides(best, 2) == sides


def test_threshold_range_and_one_verdict_over_it():
    w = samples_table(lambda n, s: 8)
    fits = growth.over_thresholds(w, 256)
    assert set(fits) == set(growth.THRESHOLDS)
    assert all(growth.growth_verdict(f, 0.22) == "yes" for _, f in fits.values())
    assert growth.judge_thresholds({0.95: "yes", 0.99: "yes"}) == "yes"
    assert growth.judge_thresholds({0.95: "yes", 0.995: "undecided"}) == "partly"
    assert growth.judge_thresholds({0.95: "yes", 0.995: "no"}) == "partly"
    assert growth.judge_thresholds({0.95: "no", 0.99: "no"}) == "no"
    # no target supports the claim and one refutes it: 'no', not 'partly'
    assert growth.judge_thresholds({0.95: "undecided", 0.995: "no"}) == "no"
    assert growth.judge_thresholds({0.95: "undecided", 0.99: "undecided"}) == "undecided"


def test_smallest_N_needs_every_larger_N():
    w = pd.DataFrame({"n": [10] * 4 + [20] * 2, "seed": [0] * 6, "N": [1, 2, 4, 8, 1, 2],
                      "relation_prob_confusing": [1.0, 0.5, 0.995, 1.0, 0.2, 0.3]})
    got = growth.smallest_N(w, 0.99)
    assert got[(10, 0)] == 4 and math.isnan(got[(20, 0)])
