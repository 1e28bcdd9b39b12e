"""Small float64 helpers shared by the theory (toy model) and the checkpoint analyses."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def frobenius_cosine(a: Tensor, b: Tensor) -> float:
    """<A, B>_F / (|A|_F |B|_F) in float64; nan when either is zero."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else math.nan


def positional_bias(P: Tensor, T: int) -> Tensor:
    """DM(P) plus the causal mask: [..., T, T] with P[t - s] for s <= t and -inf above."""
    t = torch.arange(T, device=P.device)
    offset = t[:, None] - t[None, :]
    bias = P.index_select(-1, offset.clamp(min=0).reshape(-1)).view(*P.shape[:-1], T, T)
    return bias.masked_fill(offset < 0, float("-inf"))
