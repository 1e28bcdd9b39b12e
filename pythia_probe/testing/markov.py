"""Text whose statistics are known: documents sampled from a Markov chain (the tests and
benchmarks of the chance level's spread and the Spearman-Brown ceiling)."""

from __future__ import annotations

import torch
from torch import Tensor


def chain(V: int, sharpness: float = 1.5, seed: int = 0) -> tuple[Tensor, Tensor]:
    """A random transition matrix P (rows: softmax of sharpness * Gaussian logits) and its
    stationary distribution pi (pi P = pi), float64."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(sharpness * torch.randn(V, V, generator=g, dtype=torch.float64), dim=1)
    pi = torch.linalg.eig(P.T)[1][:, 0].real
    return P, pi / pi.sum()


def sample(P: Tensor, start: Tensor, N: int, T: int, seed: int) -> Tensor:
    """N documents of T + 1 tokens [N, T + 1], the first token drawn from ``start`` (pi: every
    position's token then has distribution pi), each next one from its row of P."""
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(start, N, replacement=True, generator=g)
    seq = [x]
    for _ in range(T):
        x = torch.multinomial(P[x], 1, generator=g)[:, 0]
        seq.append(x)
    return torch.stack(seq, dim=1)


def bbar(tokens: Tensor, V: int) -> Tensor:
    """Bbar = (C - n 1^T / V) / positions from the bigram counts C (rows = current token,
    n = C 1), float64: the statistics' definition, by counting."""
    x, y = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)
    C = torch.bincount(x * V + y, minlength=V * V).reshape(V, V).to(torch.float64)
    return (C - C.sum(dim=1, keepdim=True) / V) / x.numel()


def true_bbar(P: Tensor, pi: Tensor) -> Tensor:
    """E[Bbar] of documents started from pi: E[C] / positions = diag(pi) P, so
    diag(pi) P - pi 1^T / V."""
    return torch.diag(pi) @ P - pi[:, None] / P.shape[0]
