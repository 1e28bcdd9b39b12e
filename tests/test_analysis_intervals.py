"""Ceiling and jackknife intervals (issue 19 item 2) against direct float64 computations, with
replicate statistics built from separate statistics of document subsets (the stand-in for the
statistics package's groups: st.subset / st.leave_out / st.halves); the Spearman-Brown ceiling
against corpora whose true statistic is known; effect and above_chance (issue 26 item 3)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t
from test_analysis_factored import parts_from_tokens

from pythia_probe.analysis.cosine import covariance, prepare_target, row_normalise, scores, tall
from pythia_probe.analysis.factored import FactoredTarget, Parts, target_vectors
from pythia_probe.analysis.intervals import (
    Z_ABOVE,
    above_chance,
    add_intervals,
    ceiling,
    cross_cosine,
    effect,
    full_ceiling,
    jackknife,
    jackknife_se,
    judge,
    spearman_brown,
)
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.stats.reference import reference_stats
from pythia_probe.testing import markov
from pythia_probe.testing.dense import DenseTarget

V, G = 19, 4


@pytest.fixture(scope="module")
def corpus():
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, V - 2, (16, 9), generator=g)
    groups = [tokens[i::G] for i in range(G)]  # documents by ordinal mod G
    return tokens, groups


def _target(tokens, name="Qbar"):
    return prepare_target(name, reference_stats(tokens, V)[name], dtype=torch.float64)


def test_jackknife_is_the_pseudo_value_formula_with_a_t_quantile():
    rng = np.random.default_rng(0)
    for _ in range(5):
        theta, loo = rng.normal(), rng.normal(size=7)
        Gn = loo.size
        p = Gn * theta - (Gn - 1) * loo
        se = np.sqrt(((p - p.mean()) ** 2).sum() / (Gn * (Gn - 1)))
        q = student_t.ppf(0.975, Gn - 1)
        low, high = jackknife(theta, loo.tolist())
        assert (low, high) == pytest.approx((theta - q * se, theta + q * se), abs=1e-12)
        assert low <= theta <= high
    with pytest.raises(ValueError, match="at least 2"):
        jackknife(0.5, [0.4])


@pytest.mark.parametrize("name", ["Qbar", "PhiBT"])
def test_ceiling_is_the_materialised_cosine_of_the_two_halves(corpus, name):
    tokens, groups = corpus
    half_a, half_b = torch.cat(groups[:G // 2]), torch.cat(groups[G // 2:])
    A, B = _target(half_a, name), _target(half_b, name)
    Ta, Tb = (reference_stats(t, V)[name] for t in (half_a, half_b))
    want = frobenius_cosine(covariance(row_normalise(Ta)), covariance(row_normalise(Tb)))
    assert ceiling(A, B, chunk=5) == pytest.approx(want, abs=1e-12)
    assert ceiling(B, A, chunk=7) == pytest.approx(want, abs=1e-12)
    assert ceiling(A, A) == pytest.approx(1.0, abs=1e-12)


def test_ceiling_against_a_factored_target(corpus):
    tokens, groups = corpus
    half_a, half_b = torch.cat(groups[:2]), torch.cat(groups[2:])
    p = parts_from_tokens(half_a, V)
    Af = FactoredTarget("Qbar", Parts(p, torch.float64, "cpu", {"Qbar"}),
                        target_vectors("Qbar", p))
    B = DenseTarget("Qbar", reference_stats(half_b, V)["Qbar"])
    assert cross_cosine(Af, B.weighted_column_blocks(4), B.norm) == pytest.approx(
        ceiling(DenseTarget("Qbar", reference_stats(half_a, V)["Qbar"]), B), abs=1e-12)


def test_intervals_and_ceiling_join_the_rows_of_replicates(corpus):
    tokens, groups = corpus
    E = torch.randn(V, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    full = _target(tokens)

    def rows(target):
        s = scores([tall(E)], target)[0]
        return [{"analysis": "attention", "layer": 1, "head": None, "metric": "cos_mean",
                 "value": s.value, "chance": s.chance, "chance_sd": s.chance_sd}]

    left_out = [rows(_target(torch.cat([g for j, g in enumerate(groups) if j != i])))
                for i in range(G)]
    got = add_intervals(rows(full), left_out, {"Qbar": 0.8}, lambda a, m: "Qbar")[0]
    theta = got["value"]
    assert got["ci_low"] <= theta <= got["ci_high"]
    assert (got["ci_low"], got["ci_high"]) == pytest.approx(
        jackknife(theta, [r[0]["value"] for r in left_out]))
    assert got["ceiling_half"] == 0.8 and got["ceiling"] == pytest.approx((1.6 / 1.8) ** 0.5)
    assert "settings" not in got
    loo = [r[0]["value"] for r in left_out]
    assert got["effect"] == pytest.approx((theta - got["chance"])
                                          / ((1.6 / 1.8) ** 0.5 - got["chance"]))
    assert got["above_chance"] is above_chance(theta, got["chance"], got["chance_sd"],
                                               jackknife_se(loo))
    low = add_intervals(rows(full), left_out, {"Qbar": -1.0}, lambda a, m: "Qbar")[0]
    assert low["ceiling"] == -1.0 and math.isnan(low["effect"])
    assert low["settings"].startswith("chance_not_below_ceiling=")  # in the row, not silently
    with pytest.raises(ValueError, match="missing"):
        add_intervals(rows(full), [[], *left_out[1:]])


def test_ceiling_with_a_factored_half_b_counts_unfilled_columns_once(corpus):
    tokens, groups = corpus
    half_a, half_b = torch.cat(groups[:2]), torch.cat(groups[2:])
    for name in ("Qbar", "PhiBT", "Bbar"):
        p = parts_from_tokens(half_b, V)
        Bf = FactoredTarget(name, Parts(p, torch.float64, "cpu", {name}), target_vectors(name, p))
        A = _target(half_a, name)
        B = DenseTarget(name, reference_stats(half_b, V)[name])
        assert ceiling(A, Bf, chunk=3) == pytest.approx(ceiling(A, B), abs=1e-12)


def test_effect_above_chance_and_judge():
    assert effect(0.5, 0.1, 0.9) == pytest.approx(0.5)
    assert all(math.isnan(effect(0.5, 0.1, c)) for c in (None, 0.1, 0.05))
    assert effect(0.05, 0.1, 0.9) < 0  # below chance: negative, kept
    assert Z_ABOVE == pytest.approx(1.959963984540054, abs=1e-12)
    sd = 0.01
    assert above_chance(0.1 + 1.97 * sd, 0.1, sd) and not above_chance(0.1 + 1.95 * sd, 0.1, sd)
    # the documents' se widens the null: 1.97 sd over chance is not enough once se = sd
    assert not above_chance(0.1 + 1.97 * sd, 0.1, sd, sd)
    assert above_chance(0.1 + 1.97 * math.sqrt(2) * sd, 0.1, sd, sd)
    assert not above_chance(0.2, 0.1, 0.0, 0.0)  # no spread at all: nothing to test
    row = {"value": 0.5, "chance": 0.1, "chance_sd": 0.1}
    got = judge(row)
    assert got["above_chance"] is True and math.isnan(got["effect"])  # no ceiling
    assert judge({**row, "ceiling": 0.9}, se=0.3)["above_chance"] is False
    assert judge({"value": 0.5, "chance": 0.1}) == {"value": 0.5, "chance": 0.1}


def test_the_ceiling_corrects_the_split_half_to_the_true_statistics_score():
    """Markov-chain text with a known transition matrix P (stationary pi): the true Bbar is
    E[C] / positions - pi 1^T / V = diag(pi) P - pi 1^T / V. Over 6 corpora of 300 documents:
    the split half r understates what the true statistic scores against the full corpus
    (the ceiling) and what a second corpus of the same size scores against it; Spearman-Brown
    2 r / (1 + r) estimates the second, its square root (``full_ceiling``) the first, each
    closer than r and within a quarter of r's error on average."""
    V, T, N = 30, 16, 300
    P, pi = markov.chain(V)
    true = prepare_target("Bbar", markov.true_bbar(P, pi))
    r, sb, top, to_true, to_replica = [], [], [], [], []
    for seed in range(6):
        tokens = markov.sample(P, pi, N, T, seed)
        full = prepare_target("Bbar", markov.bbar(tokens, V))
        half_a, half_b = (prepare_target("Bbar", markov.bbar(h, V))
                          for h in (tokens[:N // 2], tokens[N // 2:]))
        r.append(ceiling(half_a, half_b))
        sb.append(spearman_brown(r[-1]))
        top.append(full_ceiling(r[-1]))
        to_true.append(ceiling(true, full))
        other = markov.sample(P, pi, N, T, 100 + seed)  # an independent corpus, same size
        to_replica.append(ceiling(prepare_target("Bbar", markov.bbar(other, V)), full))
    r, sb, top, to_true, to_replica = map(np.array, (r, sb, top, to_true, to_replica))
    assert (top > sb).all() and (sb > r).all()
    assert (abs(top - to_true) < abs(r - to_true)).all()
    assert abs(top - to_true).mean() < abs(sb - to_true).mean()  # the true statistic's score
    assert abs((to_true - top).mean()) < 0.25 * (to_true - r).mean()
    assert abs((to_replica - sb).mean()) < 0.25 * (to_replica - r).mean()
    assert (to_replica - r).mean() > 0.02  # r's shortfall is real, not rounding
