"""The toy run's tracked numbers: the leading terms of Theorem 4.1 from a batch's statistics,
each weight against its leading term (cosine, relative error against the predicted weight, norm
ratio), and the batch ceiling (toy/paper.py)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pythia_probe import theory
from pythia_probe.errors import OutOfRangeError
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.stats import batch_stats
from pythia_probe.toy import paper
from pythia_probe.toy.model import AttnOnlyTransformer


def leading_terms(tokens: Tensor, d_vocab: int, device: torch.device
                  ) -> tuple[dict[str, Tensor], str]:
    """The theory statistics of ``tokens`` [N, T+1] (on the CPU) and their stats_id."""
    st = batch_stats(tokens, d_vocab, device=device)
    return {k: v.cpu() for k, v in theory.as_stats(st).items()}, st.stats_id


def checked_cosine(a: Tensor, b: Tensor, what: str) -> float:
    """frobenius_cosine, refused outside [-1, 1] beyond float rounding (corrupt statistics or a
    bug; never written as a row)."""
    c = frobenius_cosine(a, b)
    if math.isfinite(c) and abs(c) > 1 + 1e-9:
        raise OutOfRangeError(f"cosine of {what} is {c}, outside [-1, 1]")
    return c


def weight_rows(model: AttnOnlyTransformer, stats: dict[str, Tensor], step: int,
                lr: float) -> list[dict]:
    """Cosine, relative error and norm ratio of every weight vs its leading term at ``step``;
    layers numbered 1..L as in the paper (W_O has no layer)."""
    pred = theory.predicted_weights(stats, step, lr)
    rows = []
    for w, suffix in paper.PAIRS.items():
        term = stats[theory.LEADING_TERM[w]]
        weights = model.W_O[None] if w == "W_O" else getattr(model, w)
        for i, weight in enumerate(weights.detach().cpu()):
            layer = None if w == "W_O" else i + 1
            values = {f"cos_{suffix}": checked_cosine(weight, term, f"{w} layer {layer}"),
                      f"relerr_{suffix}": theory.relative_error(weight, pred[w]),
                      f"normratio_{suffix}": _norm_ratio(weight, pred[w])}
            rows += [{"layer": layer, "metric": m, "value": v}
                     for m, v in values.items() if math.isfinite(v)]
    return rows


def _norm_ratio(weight: Tensor, predicted: Tensor) -> float:
    denom = float(predicted.double().norm())
    return float(weight.detach().double().norm()) / denom if denom > 0 else math.nan


def batch_ceiling_rows(first: dict[str, Tensor], whole: dict[str, Tensor]) -> list[dict]:
    """Per weight: cosine of its first-batch leading term with the whole-set term (the batch
    ceiling, toy/paper.py)."""
    rows = []
    for w, suffix in paper.PAIRS.items():
        term = theory.LEADING_TERM[w]
        c = checked_cosine(first[term], whole[term], f"first-batch vs whole-set {term}")
        if math.isfinite(c):
            rows.append({"layer": None, "metric": f"{paper.CEILING}{suffix}", "value": c})
    return rows
