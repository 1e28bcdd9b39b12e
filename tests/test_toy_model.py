"""The fast batched Def. 3.1 model against the slow position-by-position reference (float64)."""

from __future__ import annotations

import pytest
import torch
from toy_reference_model import reference_logits, reference_loss

from pythia_probe.toy.model import (
    PATHS_MAX_FRACTION,
    AttnOnlyTransformer,
    ToyConfig,
    choose_mode,
    forward_flops,
    positional_bias,
)


def random_model(d_vocab: int, T: int, L: int, seed: int = 0,
                 mode: str = "auto") -> AttnOnlyTransformer:
    torch.manual_seed(seed)
    model = AttnOnlyTransformer(ToyConfig(d_vocab, T, L), dtype=torch.float64, mode=mode)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.7)
    return model


@pytest.mark.parametrize("mode", ["dense", "paths"])
@pytest.mark.parametrize("d_vocab,T,L", [(7, 5, 1), (11, 6, 2), (9, 4, 3), (5, 3, 0), (6, 4, 4)])
def test_fast_equals_reference_outputs_and_gradients(d_vocab, T, L, mode):
    model = random_model(d_vocab, T, L, mode=mode)
    seqs = torch.randint(0, d_vocab, (3, T + 1), generator=torch.Generator().manual_seed(1))
    fast = model.loss(seqs)
    grads = torch.autograd.grad(fast, list(model.parameters()), materialize_grads=True)
    ref_params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    slow = reference_loss(seqs, *ref_params)
    ref_grads = torch.autograd.grad(slow, ref_params, materialize_grads=True)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    for name, g, r in zip(["W", "V", "P", "W_O"], grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=name)
    torch.testing.assert_close(model(seqs[:, :-1]), reference_logits(seqs[:, :-1], *ref_params),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["dense", "paths"])
def test_shorter_sequences_than_n_ctx(mode):
    model = random_model(6, 8, 2, mode=mode)
    x = torch.randint(0, 6, (2, 5))
    ref = reference_logits(x, model.W, model.V, model.P, model.W_O)
    torch.testing.assert_close(model(x), ref, rtol=1e-12, atol=1e-12)


def test_positional_bias_places_P_on_subdiagonals():
    P = torch.tensor([1.0, 2.0, 3.0])
    bias = positional_bias(P, 3)
    assert bias[2, 0] == 3.0 and bias[2, 1] == 2.0 and bias[1, 1] == 1.0
    assert torch.isinf(bias[0, 1]) and bias[0, 1] < 0


def test_zero_init_gives_uniform_predictions():
    model = AttnOnlyTransformer(ToyConfig(10, 4, 2))
    assert all(float(p.detach().abs().max()) == 0 for p in model.parameters())
    loss = model.loss(torch.randint(0, 10, (2, 5)))
    assert loss.detach().item() == pytest.approx(torch.log(torch.tensor(10.0)).item(), rel=1e-6)


def test_bad_input_errors():
    model = AttnOnlyTransformer(ToyConfig(5, 4, 1))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[0, 5]]))
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="d_vocab"):
        ToyConfig(0, 4, 1)
    with pytest.raises(ValueError, match="mode"):
        AttnOnlyTransformer(ToyConfig(5, 4, 1), mode="sparse")


def test_forward_flops_counts_both_modes():
    cfg, T, V, B = ToyConfig(10, 4, 2), 4, 10, 3
    # dense: layer 1 2*T*T*V; layer 2 4*T*V*V + 4*T*T*V; output 2*T*V*V (per sequence)
    dense = B * (2 * 16 * 10 + 4 * 4 * 100 + 4 * 16 * 10 + 2 * 4 * 100)
    assert forward_flops(cfg, B, T, "dense") == dense
    # paths: layer 2 logits: h1 W2 (V1 W2 product + one A1 application), h1 (one A1
    # application), (h1 W2) h1^T; output h2 W_O: 3 products V@R, 3 applications of A
    unit = B * 2 * T * T * V
    paths = (2 * V**3 + unit) + unit + unit + (3 * 2 * V**3 + 3 * unit)
    assert forward_flops(cfg, B, T, "paths") == paths
    auto = "paths" if paths < PATHS_MAX_FRACTION * dense else "dense"
    assert choose_mode(cfg, B, T) == auto
    assert forward_flops(cfg, B, T) == {"dense": dense, "paths": paths}[auto]
    assert choose_mode(ToyConfig(3000, 200, 3), 512, 200) == "paths"
    assert choose_mode(ToyConfig(3000, 200, 12), 512, 200) == "dense"  # 2^L paths blow up
