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

Two orientations of the target, both on every row set (leading-terms spec, section 7):

- ``cos_mean``, ``cos_head``: against Qbar, the paper's own orientation (rows = query tokens,
  columns = key tokens, as Eq. 14/17 define it and as the model map's rows are queries).
- ``cos_mean_authors``, ``cos_head_authors``: exactly what the authors' scripts computed. pythia.py
  transposes the Jacobian-applied T x T matrix before X^T (.) X, so its Q_bar is NT Qbar^T
  (rows = KEY tokens), and compute_attention_comparison scores the same query-row model map
  against the rows of that: target ``QbarT``. pythia-per-head.py (Figure 7) composes its own
  G_bar (B_bar_Phi_bar.T @ B_bar.T, i.e. Bbar^T Phibar^T Bbar^T in Eq. 15's orientation of M,
  not Gbar = SigmaB Phibar) and transposes the same way: target ``QbarHeadT`` =
  QbarHead^T. Statistics built before QbarHead existed have no cos_head_authors rows.

Every factor of a layer (the head mean, each head, raw and LN-folded) is E_pre times a small
matrix, so all of them share the layer's ``pre`` basis and one pass over each target
(:mod:`pythia_probe.analysis.basis`); head h's key-side S is the h-th diagonal block of the
head mean's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import Tensor

from pythia_probe.analysis.base import Cost, Needs, Options, Shape, StepTensors
from pythia_probe.analysis.basis import Basis
from pythia_probe.analysis.cosine import ModelCovariance
from pythia_probe.analysis.layers import (
    Cell,
    Layer,
    LayerSpec,
    layer_analysis,
    layers_of,
    score_layers,
)


def _check(W_Q: Tensor, W_K: Tensor, d: int) -> None:
    if W_Q.ndim != 3 or W_Q.shape != W_K.shape or W_Q.shape[1] != d:
        raise ValueError(f"need W_Q, W_K [n_heads, d_model, d_head] matching E_pre [V, {d}]; "
                         f"got {tuple(W_Q.shape)}, {tuple(W_K.shape)}")


def _heads_cat(W: Tensor, scale: Tensor | None) -> Tensor:
    """[d_model, n_heads * d_head] float64 (heads side by side), rows scaled by ``scale``."""
    W = W.to(torch.float64).permute(1, 0, 2).reshape(W.shape[1], -1)
    return W if scale is None else W * scale.to(W)[:, None]


def attention_factors(basis: Basis, W_Q: Tensor, W_K: Tensor, heads: Sequence[int] = (),
                      ln1_w: Tensor | None = None) -> list[ModelCovariance]:
    """Factors of cov(E mean_h(W_Q^h W_K^h^T) E^T), then of each head in ``heads``;
    ``ln1_w`` given: E replaced by (E P) diag(ln1_w) (the LN-folded variant)."""
    _check(W_Q, W_K, basis.d)
    n_heads, d_head = W_Q.shape[0], W_Q.shape[2]
    coef = basis.whole if ln1_w is None else basis.centred
    Wq, Wk = coef(_heads_cat(W_Q, ln1_w)), coef(_heads_cat(W_K, ln1_w))
    S = Wk.T @ (basis.moments()[1] @ Wk)  # Gc^T Gc of G = E W_K (heads side by side)
    out = [ModelCovariance(basis, Wq / n_heads, S)]
    for h in heads:
        cols = slice(h * d_head, (h + 1) * d_head)
        out.append(ModelCovariance(basis, Wq[:, cols], S[cols, cols]))
    return out


def _cells(layer: Layer, opts: Options, folded: bool) -> list[Cell]:
    per_head = opts.per_head
    on = per_head is True or (per_head and layer.number in per_head)
    if folded and layer.ln1_w is None:
        raise ValueError("attention_lnfold needs every layer's ln1 weights (StepTensors.ln1_w)")
    heads = list(range(layer.W_Q.shape[0])) if on else []
    factors = attention_factors(layer.bases["pre"], layer.W_Q, layer.W_K, heads,
                                layer.ln1_w if folded else None)
    return [Cell({"layer": layer.number, "head": h, "metric": metric + suffix}, f)
            for suffix in ("", "_authors")
            for h, f, metric in zip([None, *heads], factors,
                                    ["cos_mean", *["cos_head"] * len(heads)], strict=True)]


#: the target of each metric (see the module docstring)
TARGETS = {"cos_mean": "Qbar", "cos_head": "Qbar", "cos_mean_authors": "QbarT",
           "cos_head_authors": "QbarHeadT"}
RAW_SPEC = LayerSpec("Qbar", partial(_cells, folded=False), ("pre",), TARGETS)
FOLDED_SPEC = LayerSpec("Qbar", partial(_cells, folded=True), ("pre",), TARGETS)


def attention_rows(E_pre: Sequence[Tensor], W_Q: Sequence[Tensor], W_K: Sequence[Tensor],
                   target, *, options: Options | None = None,
                   ln1_w: Sequence[Tensor] | None = None,
                   authors: Mapping[str, object] | None = None) -> list[dict]:
    """Rows per layer (head null, metric cos_mean) and per head (metric cos_head) against the
    prepared Qbar ``target``, each with its chance level; rows number layers from 1 (E_pre[0]
    is layer 1) and heads from 0. ``authors``: prepared ``QbarT`` and/or ``QbarHeadT``
    targets, adding the rows ``cos_mean_authors`` / ``cos_head_authors`` (see the module
    docstring).

    ``ln1_w``: per-layer LayerNorm weights [d_model]; given, the rows are the authors'
    LN-folded, centred variant (analysis ``attention_lnfold``), else raw (``attention``).
    ``options`` (default :class:`Options`): ``per_head`` True for every layer, False for none,
    or a list of layers numbered from 1; ``chunk``; ``max_rank``: score several layers per
    pass over the target while the stacked width of their bases stays below it (0: one layer
    per pass, the least memory).
    """
    if ln1_w is not None and len(ln1_w) != len(E_pre):
        raise ValueError(f"need one ln1_w per layer: {len(ln1_w)} for {len(E_pre)} layers")
    name = "attention" if ln1_w is None else "attention_lnfold"
    x = StepTensors({"pre": list(E_pre)}, list(W_Q), list(W_K), ln1_w=list(ln1_w or []))
    opts = options or Options()
    layers = layers_of(x, target.d_vocab, target.dtype, opts.chunk)
    spec = FOLDED_SPEC if ln1_w is not None else RAW_SPEC
    return score_layers(layers, [(name, spec)], {"Qbar": target, **(authors or {})},
                        opts)[name]


def _cost(s: Shape) -> Cost:
    """The (d+1)-space algebra of each layer's factors: about 10 d^3 multiply-adds for the head
    mean (S, its P P^T and H, S H) and 2 d^3 for the heads of a layer scored per head."""
    return Cost(macs=(10 * s.n_layers + 2 * s.head_layers) * s.d_model**3)


_NEEDS = Needs(weights=("embed", "attn", "mlp", "ln"), residuals=True,
               targets=RAW_SPEC.targets)
ATTENTION = layer_analysis("attention", _NEEDS, RAW_SPEC, _cost)
ATTENTION_LNFOLD = layer_analysis("attention_lnfold", _NEEDS, FOLDED_SPEC, _cost)
