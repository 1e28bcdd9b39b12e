"""Slow, literal Def. 3.1 model for tests: dense one-hots, one sequence and one position at a time.

For query position t (0-indexed) of layer l the logit on key s <= t is h_t W h_s^T + P[t - s];
the softmax runs over s = 0..t only, and the update is sum_s a_s h_s V. Takes the weights of an
:class:`~pythia_probe.toy.model.AttnOnlyTransformer` so gradients can be compared one to one.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reference_logits(tokens: Tensor, W: Tensor, V: Tensor, P: Tensor, W_O: Tensor) -> Tensor:
    """F(X) [batch, T, |V|] for tokens [batch, T], weights W/V [L, V, V], P [L, T], W_O [V, V]."""
    d_vocab = W_O.shape[0]
    outs = []
    for seq in tokens:
        h = [torch.nn.functional.one_hot(seq[t].long(), d_vocab).to(W_O.dtype)
             for t in range(len(seq))]
        for layer in range(W.shape[0]):
            h = [h[t] + _attend(h, t, W[layer], V[layer], P[layer]) for t in range(len(h))]
        outs.append(torch.stack([h_t @ W_O for h_t in h]))
    return torch.stack(outs)


def _attend(h: list[Tensor], t: int, W: Tensor, V: Tensor, P: Tensor) -> Tensor:
    logits = torch.stack([h[t] @ W @ h[s] + P[t - s] for s in range(t + 1)])
    a = torch.softmax(logits, dim=0)
    return sum(a[s] * (h[s] @ V) for s in range(t + 1))


def reference_loss(seqs: Tensor, W: Tensor, V: Tensor, P: Tensor, W_O: Tensor) -> Tensor:
    """Eq. 3 written out: mean over all N*T positions of -log softmax(F)[next token]."""
    logits = reference_logits(seqs[:, :-1], W, V, P, W_O)
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, seqs[:, 1:, None].long()).squeeze(-1)
    return nll.sum() / nll.numel()
