"""Theorem 4.1 of the leading-terms paper: the predicted weights after s full-batch GD steps.

From zero initialisation with step eta, every layer alike (spec leading-terms.md section 3):

    W_O ~ s eta Bbar,   V_l ~ C(s,2) eta^2 Phibar^T Bbar^T,
    W_l ~ (3 C(s,4) + 2 C(s,3)) eta^4 Qbar,   P_l ~ (3 C(s,4) + 2 C(s,3)) eta^4 Delta,

and the end-to-end predictions of Eq. 12 (one layer, constants dropped) and Eq. 13 (the
attention block alone). Statistics come from a CorpusStats, a dict with the same key names
(e.g. :func:`pythia_probe.stats.reference.reference_stats`), or one batch of tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.linalg import positional_bias
from pythia_probe.stats import batch_stats

#: weight name -> name of the statistic that is its leading term
LEADING_TERM = {"W_O": "Bbar", "V": "PhiBT", "W": "Qbar", "P": "Delta"}
STAT_KEYS = ("Bbar", "SigmaB", "Phibar", "PhiBT", "Gbar", "Qbar", "Delta")


def coefficient(weight: str, s: int, eta: float) -> float:
    """The scalar c(s, eta) with weight ~ c * leading term after s steps."""
    if s < 0:
        raise BadInputError(f"step count s must be >= 0, got {s}")
    if weight == "W_O":
        return s * eta
    if weight == "V":
        return math.comb(s, 2) * eta**2
    if weight in ("W", "P"):
        return (3 * math.comb(s, 4) + 2 * math.comb(s, 3)) * eta**4
    raise BadInputError(f"unknown weight {weight!r}; valid: {sorted(LEADING_TERM)}")


def error_bound(weight: str, s: int, eta: float, T: int) -> float:
    """Theorem 4.1's Frobenius error bound on weight - leading term."""
    bounds = {"W_O": 3 * s**2 * eta**2, "V": 12 * s**3 * eta**3,
              "W": 13 * s**5 * eta**5 * T, "P": 13 * s**5 * eta**5 * T}
    if weight not in bounds:
        raise BadInputError(f"unknown weight {weight!r}; valid: {sorted(bounds)}")
    return bounds[weight]


def theorem_window(eta: float, T: int, n_layers: int) -> float:
    """Largest s the theorem covers: (1/eta) min(5 / (8 sqrt T), 1 / (12 L))."""
    return min(5 / (8 * math.sqrt(T)), 1 / (12 * max(n_layers, 1))) / eta


def as_stats(source: Any) -> dict[str, Tensor]:
    """The statistics of a CorpusStats-like object or a mapping, as a dict of tensors."""
    if isinstance(source, Mapping):
        out = {k: source[k] for k in STAT_KEYS if k in source}
    else:
        out = {k: getattr(source, k) for k in STAT_KEYS if hasattr(source, k)}
    missing = [k for k in ("Bbar", "PhiBT", "Qbar", "Delta") if k not in out]
    if missing:
        raise BadInputError(f"statistics lack {missing}; pass a CorpusStats or a dict with keys "
                            f"{list(STAT_KEYS)}")
    if "SigmaB" not in out:
        out["SigmaB"] = out["Bbar"].T @ out["Bbar"]
    return out


def stats_from_batch(tokens: Tensor, d_vocab: int) -> dict[str, Tensor]:
    """Exact statistics of one batch [N, T+1] (the paper takes the first training batch)."""
    return as_stats(batch_stats(tokens, d_vocab))


def predicted_weights(stats: Any, s: int, eta: float) -> dict[str, Tensor]:
    """Leading terms of W_O, V, W and P after s steps (one [V, V] or [T] tensor each)."""
    st = as_stats(stats)
    return {w: coefficient(w, s, eta) * st[key] for w, key in LEADING_TERM.items()}


def relative_error(weight: Tensor, predicted: Tensor) -> float:
    """|weight - predicted|_F / |predicted|_F in float64; nan when predicted is zero."""
    p = predicted.detach().double()
    denom = float(p.norm())
    return float((weight.detach().double() - p).norm()) / denom if denom > 0 else math.nan


def remove_leading_term(weight: Tensor, term: Tensor) -> Tensor:
    """weight minus its Frobenius projection onto term (the causal ablation of Table 3)."""
    t = term.to(weight.dtype)
    denom = float((t * t).sum())
    return weight - (float((weight * t).sum()) / denom) * t if denom > 0 else weight.clone()


def _attention_pattern(tokens: Tensor, Qbar: Tensor, Delta: Tensor) -> Tensor:
    x = tokens.long()
    logits = Qbar[x[:, :, None], x[:, None, :]] + positional_bias(Delta, x.shape[1])
    return torch.softmax(logits, dim=-1)


def _full_vocabulary(stats: Any) -> None:
    if getattr(stats, "restricted", False):
        raise BadInputError("Eq. 12/13 index the statistics by token id and sum over the whole "
                            "vocabulary: top-k restricted statistics cannot be used; compute them "
                            "without --top-k")


def eq13_logits(tokens: Tensor, stats: Any) -> Tensor:
    """Eq. 13, the attention block alone: S(Mask(X Qbar X^T + DM(Delta))) X Phibar^T SigmaB."""
    _full_vocabulary(stats)
    st = as_stats(stats)
    A = _attention_pattern(tokens, st["Qbar"], st["Delta"])
    return A @ (st["PhiBT"] @ st["Bbar"])[tokens.long()]


def eq12_logits(tokens: Tensor, stats: Any) -> Tensor:
    """Eq. 12: (S(Mask(X Qbar X^T + DM(Delta))) X Phibar^T Bbar^T + X) Bbar, [batch, T, V]."""
    _full_vocabulary(stats)
    st = as_stats(stats)
    return eq13_logits(tokens, st) + st["Bbar"][tokens.long()]
