"""The embedding mapping (spec section 5) and the W_E / W_U extra rows.

Orientation: the target matrix's ROW index is always the token the row describes.

- ``embedding``: the residual stream of token i fed alone (sequence length 1) at layer l,
  E_kind[i] for kind in pre (before layer l), attn (pre + attention output, the no-MLP stream)
  and post (after layer l), against row i of PhiBT = Phibar^T Bbar^T (rows = token fed in; the
  value matrix's leading term, so e_i + PhiBT[i] is what the one-hot model puts in the stream).
- ``unembedding`` (extra rows, layer null):
  * ``cos_WU_Bbar``: output orientation. Row j of W_U^T (the unembedding of token j) against
    column j of Bbar, i.e. row j of Bbar^T (how often j follows each token). Similar
    unembeddings <-> similar previous-token profiles (SigmaB = Bbar^T Bbar).
  * ``cos_WEWU_Bbar``: input orientation, the W_O ~ s eta Bbar analogue. The direct-path
    logit matrix W_E W_U (row i = logits when token i is fed in, skipping every block) against
    row i of Bbar (rows = current token, columns = next token). Factored: never V x V.
  * ``cos_WE_PhiBT``: the input embedding W_E (rows = token fed in) against PhiBT; equal to the
    layer-1 ``pre`` row of ``embedding`` and reported under its own name for the table of
    weights.
Only the first d_vocab rows (ids the statistics index) are used; Pythia pads 50277 -> 50304.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from pythia_probe.analysis.base import Analysis, Cost, Needs, Options, StepTensors
from pythia_probe.analysis.cosine import FactoredTarget, product, scores, tall
from pythia_probe.analysis.layers import KINDS, Cell, Layer, LayerSpec, layer_analysis, layers_of
from pythia_probe.analysis.layers import score_layers as _score_layers


def embedding_cells(layer: Layer, opts: Options) -> list[Cell]:
    """cos_pre, cos_attn, cos_post of one layer: cov(E_kind) against cov(rownorm(PhiBT))."""
    return [Cell({"layer": layer.number, "metric": f"cos_{k}"}, tall(layer.bases[k]))
            for k in KINDS if k in layer.bases]


SPEC = LayerSpec("PhiBT", embedding_cells)


def embedding_rows(residuals: Mapping[str, list[Tensor]], target, *,
                   chunk: int = 4096, max_rank: int = 0) -> list[dict]:
    """One row per (layer, kind): cosine of cov(E_kind[l]) with cov(rownorm(PhiBT)), its
    chance level and that level's standard deviation; rows number layers from 1
    (residuals[kind][0] is layer 1).

    Layers are scored one at a time, or several per pass over the target while the stacked
    width of their bases stays <= ``max_rank``.
    """
    opts = Options(chunk=chunk, max_rank=max_rank)
    layers = layers_of(StepTensors(dict(residuals)), target.d_vocab, target.dtype, chunk)
    return _score_layers(layers, [("embedding", SPEC)], {"PhiBT": target}, opts)["embedding"]


def unembedding_rows(W_E: Tensor, W_U: Tensor, targets: Mapping[str, FactoredTarget], *,
                     chunk: int = 4096) -> list[dict]:
    """W_U vs Bbar (output orientation), W_E W_U vs Bbar (input), W_E vs PhiBT.

    W_E is [d_vocab_model, d_model]; W_U is [d_model, d_vocab_model] (TransformerLens layout).
    """
    bbar, bbar_t, phibt = targets["Bbar"], targets["BbarT"], targets["PhiBT"]
    V, dt = bbar.d_vocab, bbar.dtype
    WE, WUt = W_E[:V], W_U[:, :V].T
    vals = {
        "cos_WU_Bbar": scores([tall(WUt, dt)], bbar_t, chunk)[0],
        "cos_WEWU_Bbar": scores([product(WE, WUt, dt)], bbar, chunk)[0],
        "cos_WE_PhiBT": scores([tall(WE, dt)], phibt, chunk)[0],
    }
    return [{"analysis": "unembedding", "layer": None, "metric": m, "value": v.value,
             "chance": v.chance, "chance_sd": v.chance_sd, "n": V} for m, v in vals.items()]


def _run_unembedding(x: StepTensors, th: Mapping[str, FactoredTarget], opts: Options) -> list[dict]:
    return unembedding_rows(x.W_E, x.W_U, th, chunk=opts.chunk)


EMBEDDING = layer_analysis(
    "embedding", Needs(weights=("embed", "attn", "mlp", "ln"), residuals=True,
                       targets=("PhiBT",)), SPEC,
    lambda s: Cost())
UNEMBEDDING = Analysis(
    "unembedding", Needs(weights=("embed", "unembed"), unembedding=True,
                         targets=("Bbar", "BbarT", "PhiBT")), _run_unembedding,
    lambda s: Cost(bases=1, macs=s.V * s.d_model**2))  # + the key side's Gram
