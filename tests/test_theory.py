"""Theorem 4.1 against exact full-batch gradient descent from zero (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from pythia_probe import theory
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.stats.reference import reference_stats
from pythia_probe.toy.model import AttnOnlyTransformer, ToyConfig

D_VOCAB, T, N, L, ETA = 40, 12, 64, 2, 0.05


def zipf_corpus(seed: int = 0) -> torch.Tensor:
    """Random tokens with mildly skewed frequencies (p_k ~ k^-0.5), so Bbar is not pure noise."""
    g = torch.Generator().manual_seed(seed)
    p = torch.arange(1, D_VOCAB + 1, dtype=torch.float64) ** -0.5
    return torch.multinomial(p / p.sum(), N * (T + 1), replacement=True, generator=g).view(N, -1)


@pytest.fixture(scope="module")
def gd_run():
    """Weights after s = 1..8 exact GD steps, plus the statistics of the corpus."""
    seqs = zipf_corpus()
    model = AttnOnlyTransformer(ToyConfig(D_VOCAB, T, L), dtype=torch.float64)
    snapshots = []
    for _ in range(8):
        model.zero_grad()
        model.loss(seqs).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= ETA * p.grad
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return snapshots, reference_stats(seqs, D_VOCAB)


def test_coefficients_match_closed_form():
    for s in range(1, 9):
        assert theory.coefficient("W", s, 1.0) == s * (s - 1) * (s - 2) * (3 * s - 1) / 24
        assert theory.coefficient("V", s, 0.1) == pytest.approx(math.comb(s, 2) * 0.01)
    assert [theory.coefficient("P", s, 1.0) for s in range(1, 7)] == [0, 0, 2, 11, 35, 85]
    with pytest.raises(ValueError, match="unknown weight"):
        theory.coefficient("Q", 1, 0.1)


def test_every_weight_matches_leading_term_for_8_steps(gd_run):
    snapshots, stats = gd_run
    worst = 0.0
    for s, weights in enumerate(snapshots, start=1):
        pred = theory.predicted_weights(stats, s, ETA)
        for name in ("W_O", "V", "W", "P"):
            layers = [weights[name]] if name == "W_O" else list(weights[name])
            if s < 3 and name in ("W", "P") or s < 2 and name == "V":
                assert all(float(w.abs().max()) == 0.0 for w in layers), (name, s)
                continue
            for w in layers:
                err = theory.relative_error(w, pred[name])
                assert err < 5e-3, (name, s, err)
                worst = max(worst, err)
    assert worst > 1e-4  # the check is not vacuous: higher-order terms are visible


def test_one_and_two_steps_exact(gd_run):
    snapshots, stats = gd_run
    one, two = snapshots[0], snapshots[1]
    torch.testing.assert_close(one["W_O"], ETA * stats["Bbar"], rtol=1e-12, atol=1e-15)
    for name in ("V", "W", "P"):
        assert float(one[name].abs().max()) == 0.0
    for name in ("W", "P"):
        assert float(two[name].abs().max()) == 0.0
    for layer in range(L):
        err = theory.relative_error(two["V"][layer], ETA**2 * stats["PhiBT"])
        assert err < 1e-3


def test_cosine_and_relative_error():
    a = torch.randn(5, 5, dtype=torch.float64)
    assert frobenius_cosine(a, 3 * a) == pytest.approx(1.0)
    assert frobenius_cosine(a, -a) == pytest.approx(-1.0)
    assert math.isnan(frobenius_cosine(a, torch.zeros(5, 5)))
    assert theory.relative_error(1.1 * a, a) == pytest.approx(0.1)


def test_eq12_is_one_layer_model_with_theory_weights():
    seqs = zipf_corpus(1)
    stats = reference_stats(seqs, D_VOCAB)
    model = AttnOnlyTransformer(ToyConfig(D_VOCAB, T, 1), dtype=torch.float64)
    with torch.no_grad():
        model.W[0] = stats["Qbar"]
        model.V[0] = stats["PhiBT"]
        model.P[0] = stats["Delta"]
        model.W_O[:] = stats["Bbar"]
    x = seqs[:5, :-1]
    torch.testing.assert_close(theory.eq12_logits(x, stats), model(x), rtol=1e-10, atol=1e-12)
    attn_only = model(x) - stats["Bbar"][x]
    torch.testing.assert_close(theory.eq13_logits(x, stats), attn_only, rtol=1e-10, atol=1e-12)


def test_as_stats_rejects_incomplete():
    with pytest.raises(ValueError, match="Qbar"):
        theory.as_stats({"Bbar": torch.zeros(2, 2)})


def test_window_and_bounds():
    assert theory.theorem_window(0.005, 200, 3) == pytest.approx(1 / 36 / 0.005)  # ~5.6 steps
    assert theory.error_bound("W", 2, 0.1, 100) == pytest.approx(13 * 32 * 1e-5 * 100)


def test_predictions_from_one_batch_equal_reference():
    seqs = zipf_corpus(2)[:16]
    fast = theory.stats_from_batch(seqs, D_VOCAB)
    ref = reference_stats(seqs, D_VOCAB)
    for key in ("Bbar", "PhiBT", "Qbar", "Delta", "SigmaB"):
        torch.testing.assert_close(fast[key], ref[key], rtol=1e-10, atol=1e-15, msg=key)
    pred = theory.predicted_weights(fast, 4, 0.1)
    torch.testing.assert_close(pred["W"], 11 * 0.1**4 * ref["Qbar"], rtol=1e-10, atol=1e-18)


def test_remove_leading_term_leaves_orthogonal_rest():
    term = torch.randn(6, 6, dtype=torch.float64)
    w = 2.5 * term + torch.randn(6, 6, dtype=torch.float64)
    rest = theory.remove_leading_term(w, term)
    assert abs(float((rest * term).sum())) < 1e-12
    torch.testing.assert_close(theory.remove_leading_term(3 * term, term), torch.zeros(6, 6,
                               dtype=torch.float64), rtol=0, atol=1e-12)


def test_eq12_and_eq13_refuse_top_k_statistics():
    from pythia_probe.stats import batch_stats

    tokens = torch.randint(0, 9, (4, 7))
    restricted = batch_stats(tokens, 9, top_k=4)
    with pytest.raises(ValueError, match="top-k restricted"):
        theory.eq13_logits(tokens[:, :-1], restricted)
    with pytest.raises(ValueError, match="top-k restricted"):
        theory.eq12_logits(tokens[:, :-1], restricted)
