"""attention_text: the model's attention on real text vs the Eq. 13 prediction."""

import numpy as np
import pytest
import torch

from pythia_probe.analysis.attention_text import (
    eq13_rows,
    model_attention,
    predicted_logits,
    row_correlation,
)


def _stats(V=12, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, V, generator=g, dtype=torch.float64),
            torch.randn(T, generator=g, dtype=torch.float64))


def test_prediction_matches_the_theory_module_pattern():
    from pythia_probe.theory import _attention_pattern

    Qbar, Delta = _stats()
    tokens = torch.randint(0, 12, (3, 10), generator=torch.Generator().manual_seed(1))
    logits = predicted_logits(tokens, Qbar, Delta)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    ours = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.allclose(ours, _attention_pattern(tokens, Qbar, Delta), atol=1e-12)
    with pytest.raises(ValueError, match="longer than the statistics"):
        predicted_logits(torch.zeros(1, 11, dtype=torch.long), Qbar, Delta)


def test_row_correlation_equals_a_per_row_loop():
    g = torch.Generator().manual_seed(2)
    a, p = torch.randn(2, 6, 6, generator=g, dtype=torch.float64), torch.randn(
        2, 6, 6, generator=g, dtype=torch.float64)
    expect = np.mean([np.corrcoef(a[b, t, :t + 1], p[b, t, :t + 1])[0, 1]
                      for b in range(2) for t in range(1, 6)])
    assert float(row_correlation(a, p)) == pytest.approx(expect, rel=1e-12)


def test_attention_that_follows_the_prediction_scores_one():
    Qbar, Delta = _stats()
    tokens = torch.randint(0, 12, (2, 8), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    pred = predicted_logits(tokens, Qbar, Delta)
    A = torch.softmax((3 * pred).masked_fill(~mask, float("-inf")), -1)  # any positive scale
    A = A[:, None].expand(2, 2, 8, 8)  # two identical heads
    rows = eq13_rows([A, A.flip(-1).tril()], tokens, Qbar, Delta)
    assert rows[0]["metric"] == "corr_eq13" and rows[0]["value"] == pytest.approx(1.0, abs=1e-9)
    assert [(r["head"], r["metric"]) for r in rows[:7]] == [
        (None, "corr_eq13"), (None, "corr_qbar"), (None, "corr_delta"), (0, "corr_eq13_head"),
        (0, "corr_qbar_head"), (1, "corr_eq13_head"), (1, "corr_qbar_head")]
    assert rows[7]["layer"] == 1 and rows[7]["value"] < 0.9
    Aq = torch.softmax(predicted_logits(tokens, Qbar, 0 * Delta).masked_fill(~mask, -1e9), -1)
    got = {r["metric"]: r["value"] for r in eq13_rows([Aq[:, None]], tokens, Qbar, Delta)}
    assert got["corr_qbar"] == pytest.approx(1.0, abs=1e-9) and got["corr_eq13"] < 1 - 1e-3


def test_model_attention_matches_arch_on_the_first_layer():
    from pythia_probe.arch import NeoXConfig, NeoXWeights, attention_probs
    from pythia_probe.testing.repos import random_state_dict, tiny_config

    cfg = tiny_config()
    sd = random_state_dict(cfg, seed=0, dtype=torch.float32)
    config = cfg.to_dict()
    tokens = torch.randint(0, 90, (2, 7), generator=torch.Generator().manual_seed(4))
    attn = model_attention(config, sd, tokens)
    w = NeoXWeights(sd, NeoXConfig.from_hf(cfg))
    ref = attention_probs(w, 0, w.W_E[tokens].float())
    assert len(attn) == cfg.num_hidden_layers
    assert torch.allclose(attn[0].float(), ref, atol=1e-5)
