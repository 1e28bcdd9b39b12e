"""The attention mapping (spec section 5): E_pre mean_h(W_Q^h W_K^h^T) E_pre^T against Qbar.

A_tok[i, j] = E_pre[i] A_emb E_pre[j]^T scores query token i attending to key token j (rows =
query, columns = key), the orientation of Qbar. A_tok = F G^T with F = E_pre W_Q / n_heads and
G = E_pre W_K (heads concatenated along d_head), so the cosine is computed in factored form
with rank n_heads * d_head; per head F = E_pre W_Q^h, G = E_pre W_K^h (rank d_head).
Like the paper, this uses the raw query/key weights: no biases, no rotary, no LayerNorm.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from pythia_probe.analysis.cosine import Factors, packed_cosines, product


def _check(W_Q: Tensor, W_K: Tensor, E: Tensor) -> None:
    if W_Q.ndim != 3 or W_Q.shape != W_K.shape or W_Q.shape[1] != E.shape[1]:
        raise ValueError(f"need W_Q, W_K [n_heads, d_model, d_head] matching E_pre [V, d_model]; "
                         f"got {tuple(W_Q.shape)}, {tuple(W_K.shape)}, {tuple(E.shape)}")


def attention_factors(E_pre: Tensor, W_Q: Tensor, W_K: Tensor, dtype) -> Factors:
    """Factors of cov(E_pre mean_h(W_Q^h W_K^h^T) E_pre^T)."""
    _check(W_Q, W_K, E_pre)
    E = E_pre.to(dtype)
    n_heads = W_Q.shape[0]
    Wq = W_Q.to(dtype).permute(1, 0, 2).reshape(E.shape[1], -1)
    Wk = W_K.to(dtype).permute(1, 0, 2).reshape(E.shape[1], -1)
    return product(E @ Wq / n_heads, E @ Wk, dtype)


def head_factors(E_pre: Tensor, W_Q: Tensor, W_K: Tensor, dtype) -> list[Factors]:
    """Factors of cov(E_pre W_Q^h W_K^h^T E_pre^T) for every head h."""
    _check(W_Q, W_K, E_pre)
    E = E_pre.to(dtype)
    return [product(E @ W_Q[h].to(dtype), E @ W_K[h].to(dtype), dtype)
            for h in range(W_Q.shape[0])]


def attention_rows(E_pre: Sequence[Tensor], W_Q: Sequence[Tensor], W_K: Sequence[Tensor],
                   theory, *, per_head: bool | Sequence[int] = True,
                   chunk: int = 4096, max_rank: int = 0) -> list[dict]:
    """Rows per layer (head null, metric cos_mean) and per head (metric cos_head).

    ``per_head``: True for every layer, False for none, or a list of layer indices.
    ``max_rank``: score several layers per pass over the theory while their stacked rank stays
    below it (0: one layer per pass, the least memory).
    """
    V, dt = theory.d_vocab, theory.dtype
    head_layers = set(range(len(E_pre))) if per_head is True else set(per_head or [])
    heads = [list(range(wq.shape[0])) if i in head_layers else [] for i, wq in enumerate(W_Q)]

    def groups():
        for layer, (E, wq, wk) in enumerate(zip(E_pre, W_Q, W_K, strict=True)):
            yield [attention_factors(E[:V], wq, wk, dt)] + (
                head_factors(E[:V], wq, wk, dt) if heads[layer] else [])

    rows = []
    for layer, values in enumerate(packed_cosines(groups(), theory, chunk, max_rank)):
        rows += [{"analysis": "attention", "layer": layer, "head": head,
                  "metric": "cos_mean" if head is None else "cos_head", "value": v, "n": V}
                 for head, v in zip([None, *heads[layer]], values, strict=True)]
    return rows
