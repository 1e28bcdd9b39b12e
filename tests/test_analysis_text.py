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
    assert rows[0]["layer"] == 1 and rows[7]["layer"] == 2 and rows[7]["value"] < 0.9
    Aq = torch.softmax(predicted_logits(tokens, Qbar, 0 * Delta).masked_fill(~mask, -1e9), -1)
    got = {r["metric"]: r["value"] for r in eq13_rows([Aq[:, None]], tokens, Qbar, Delta)}
    assert got["corr_qbar"] == pytest.approx(1.0, abs=1e-9) and got["corr_eq13"] < 1 - 1e-3


def _reference_attentions(cfg, sd: dict, tokens, dtype) -> list:
    """Attention of transformers' own GPTNeoXForCausalLM (eager) in ``dtype``."""
    from transformers import GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM(cfg).to(dtype).eval()
    assert model.config._attn_implementation == "eager"
    hub = {("lm_head.weight" if k == "embed_out.weight" else k): v for k, v in sd.items()}
    model.load_state_dict(hub, strict=True)
    with torch.no_grad():
        return list(model(input_ids=tokens, output_attentions=True).attentions)


def test_model_attention_matches_transformers_on_every_layer():
    from pythia_probe.arch import NeoXConfig, NeoXWeights, attention_probs
    from pythia_probe.testing.repos import random_state_dict, tiny_config

    cfg = tiny_config(num_hidden_layers=3, attn_implementation="eager")
    sd = random_state_dict(cfg, seed=0, dtype=torch.float64)
    for k in sd:  # sharpen the attention so that layers and heads differ far beyond atol
        if k.endswith("query_key_value.weight"):
            sd[k] = sd[k] * 12
    tokens = torch.randint(0, 90, (2, 7), generator=torch.Generator().manual_seed(4))
    attn = model_attention(cfg.to_dict(), {k: v.float() for k, v in sd.items()}, tokens)
    assert len(attn) == cfg.num_hidden_layers
    ref32 = _reference_attentions(cfg, {k: v.float() for k, v in sd.items()}, tokens,
                                  torch.float32)
    ref64 = _reference_attentions(cfg, sd, tokens, torch.float64)
    uniform = torch.ones(7, 7).tril() / torch.arange(1, 8)[:, None]
    for i, A in enumerate(attn):
        assert A.shape == (2, cfg.num_attention_heads, 7, 7)
        assert torch.allclose(A.float(), ref32[i], atol=1e-5, rtol=0), i
        assert torch.allclose(A, ref64[i], atol=1e-5, rtol=0), i  # float32 vs float64 truth
        assert (ref64[i] - uniform).abs().max() > 0.1, i  # not trivially uniform
        if i:
            assert (ref64[i] - ref64[i - 1]).abs().max() > 0.1, i  # layers are distinct
    w32 = NeoXWeights({k: v.float() for k, v in sd.items()}, NeoXConfig.from_hf(cfg))
    ref = attention_probs(w32, 0, w32.W_E[tokens].float())
    assert torch.allclose(attn[0].float(), ref, atol=1e-5)
    w64 = NeoXWeights(sd, NeoXConfig.from_hf(cfg))
    exact = attention_probs(w64, 0, w64.W_E[tokens].double())
    assert exact.dtype == torch.float64
    # transformers computes the rotary angles in float32 even in a float64 model (~6e-8 here)
    assert torch.allclose(exact, ref64[0], atol=1e-6, rtol=0)
