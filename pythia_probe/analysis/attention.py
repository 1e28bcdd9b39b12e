"""The attention mapping (spec section 5): E_pre mean_h(W_Q^h W_K^h^T) E_pre^T against Qbar.

A_tok[i, j] = E_pre[i] A_emb E_pre[j]^T scores query token i attending to key token j (rows =
query, columns = key), the orientation of Qbar. A_tok = F G^T with F = E_pre W_Q / n_heads and
G = E_pre W_K (heads concatenated along d_head), so the cosine is computed in factored form
with rank n_heads * d_head; per head F = E_pre W_Q^h, G = E_pre W_K^h (rank d_head).

``attention`` (this project's default, the spec's wording) uses the RAW query/key weights: no
biases, no rotary, no LayerNorm. The paper's authors did not: their code loads Pythia through
TransformerLens ``HookedTransformer.from_pretrained`` with its defaults ``fold_ln=True,
center_writing_weights=True``, so their W_Q^h is P diag(ln1_w) W_Q^h (P = I - 11^T / d_model
removes the mean over d_model; the LN bias folds into b_Q, which this mapping ignores) and their
residual rows are E_pre P. ``attention_lnfold`` reproduces that variant:

    A_tok = E_pre P diag(w) mean_h(W_Q^h W_K^h^T) diag(w) P E_pre^T,   w = ln1_w of the layer,

factored the same way with E_pre replaced by (E_pre P) diag(w) (P is idempotent), i.e. each
residual row centred over d_model and scaled by w. The LayerNorm's per-token 1/std is not
part of either mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from torch import Tensor

from pythia_probe.analysis.base import Analysis, Cost, Needs, Options, Shape, StepTensors
from pythia_probe.analysis.cosine import Factors, Target, packed_scores, product


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


def ln_fold(E_pre: Tensor, ln1_w: Tensor) -> Tensor:
    """(E_pre P) diag(ln1_w): each row centred over d_model, then scaled by the LN weight."""
    E = E_pre - E_pre.mean(dim=1, keepdim=True)
    return E * ln1_w.to(E.dtype)


def attention_rows(E_pre: Sequence[Tensor], W_Q: Sequence[Tensor], W_K: Sequence[Tensor],
                   target, *, per_head: bool | Sequence[int] = True,
                   chunk: int = 4096, max_rank: int = 0,
                   ln1_w: Sequence[Tensor] | None = None) -> list[dict]:
    """Rows per layer (head null, metric cos_mean) and per head (metric cos_head), each with
    its chance level; rows number layers from 1 (E_pre[0] is layer 1) and heads from 0.

    ``ln1_w``: per-layer LayerNorm weights [d_model]; given, the rows are the authors'
    LN-folded, centred variant (analysis ``attention_lnfold``), else raw (``attention``).
    ``per_head``: True for every layer, False for none, or a list of layers numbered from 1.
    ``max_rank``: score several layers per pass over the target while their stacked rank stays
    below it (0: one layer per pass, the least memory).
    """
    V, dt = target.d_vocab, target.dtype
    head_layers = set(range(1, len(E_pre) + 1)) if per_head is True else set(per_head or [])
    heads = [list(range(wq.shape[0])) if i + 1 in head_layers else []
             for i, wq in enumerate(W_Q)]
    name = "attention" if ln1_w is None else "attention_lnfold"
    if ln1_w is not None and len(ln1_w) != len(E_pre):
        raise ValueError(f"need one ln1_w per layer: {len(ln1_w)} for {len(E_pre)} layers")

    def groups():
        for layer, (E, wq, wk) in enumerate(zip(E_pre, W_Q, W_K, strict=True)):
            E = E[:V].to(dt) if ln1_w is None else ln_fold(E[:V].to(dt), ln1_w[layer])
            yield [attention_factors(E, wq, wk, dt)] + (
                head_factors(E, wq, wk, dt) if heads[layer] else [])

    rows = []
    for layer, values in enumerate(packed_scores(groups(), target, chunk, max_rank)):
        rows += [{"analysis": name, "layer": layer + 1, "head": head,
                  "metric": "cos_mean" if head is None else "cos_head", "value": v.value,
                  "chance": v.chance, "n": V}
                 for head, v in zip([None, *heads[layer]], values, strict=True)]
    return rows


def _run(x: StepTensors, th: Mapping[str, Target], opts: Options, folded: bool) -> list[dict]:
    if folded and len(x.ln1_w) != len(x.W_Q):
        raise ValueError("attention_lnfold needs every layer's ln1 weights (StepTensors.ln1_w)")
    return attention_rows(x.residuals["pre"], x.W_Q, x.W_K, th["Qbar"], per_head=opts.per_head,
                          chunk=opts.chunk, max_rank=opts.max_rank,
                          ln1_w=x.ln1_w if folded else None)


def _cost(s: Shape) -> Cost:
    """Rank 2 d_model per layer (F, G of the head mean); V^2 d_model flops per layer and head."""
    return Cost(2 * s.d_model, 0, (s.n_layers + s.head_layers) * 2 * s.V**2 * s.d_model)


_NEEDS = Needs(weights=("embed", "attn", "mlp", "ln"), residuals=True, targets=("Qbar",))
ATTENTION = Analysis("attention", _NEEDS, partial(_run, folded=False), _cost)
ATTENTION_LNFOLD = Analysis("attention_lnfold", _NEEDS, partial(_run, folded=True), _cost)
