"""Slow, literal float64 oracle for the corpus statistics (leading-terms paper, section 2).

Everything is built the way the paper writes it: dense one-hot X_i and Y_i (T x |V|), the
uniform matrix U, uniform causal attention A0 and the softmax-Jacobian einsum of Eq. 16.
QbarHead is the same pass 2 with GbarHead = Bbar^T Phibar^T Bbar^T in place of Gbar.
Memory is O(N T |V| + |V|^2): for tests on small random corpora only. The fast engine must
equal this (counts exactly, floats to 1e-10 relative).
"""

from __future__ import annotations

import torch
from torch import Tensor


def one_hot_xy(tokens: Tensor, d_vocab: int) -> tuple[Tensor, Tensor]:
    """X (inputs, tokens 0..T-1) and Y (targets, tokens 1..T) as float64 one-hots [N, T, V]."""
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [N, T+1] with T >= 1, got {tuple(tokens.shape)}")
    oh = torch.nn.functional.one_hot(tokens.long(), d_vocab).to(torch.float64)
    return oh[:, :-1], oh[:, 1:]


def uniform_causal(T: int) -> Tensor:
    """A0: row t (1-indexed) has 1/t on columns 1..t."""
    t = torch.arange(1, T + 1, dtype=torch.float64)
    return torch.tril(torch.ones(T, T, dtype=torch.float64)) / t[:, None]


def softmax_jacobian_uniform(T: int) -> Tensor:
    """J[t, j, k] = d softmax(z)_j / d z_k at the uniform causal row t: diag(a) - a a^T."""
    A0 = uniform_causal(T)
    return torch.diag_embed(A0) - A0[:, :, None] * A0[:, None, :]


def reference_stats(tokens: Tensor, d_vocab: int) -> dict[str, Tensor]:
    """All section-2 statistics of N sequences of T+1 tokens, literally, in float64.

    Returns Bbar, SigmaB, Phibar, PhiBT (= Phibar^T Bbar^T), Gbar, M (per-sequence scores
    [N, T, T]), Q ([N, T, T]), Qbar and Delta (length T, Delta[r] for offset r = query - key),
    GbarHead, QbarHead and ``positions`` (NT, the int every average divides by).
    """
    X, Y = one_hot_xy(tokens, d_vocab)
    N, T, V = X.shape
    U = torch.full((T, V), 1.0 / V, dtype=torch.float64)
    A0 = uniform_causal(T)
    NT = N * T
    Bbar = torch.einsum("ntv,ntw->vw", X, Y - U) / NT
    Phibar = torch.einsum("ntv,ts,nsw->vw", Y - U, A0, X) / NT
    SigmaB = Bbar.T @ Bbar
    Gbar = SigmaB @ Phibar
    M = torch.einsum("ntv,vw,nsw->nts", Y - U, Gbar, X)
    J = softmax_jacobian_uniform(T)
    Q = torch.einsum("tjk,ntk->ntj", J, M)
    Qbar = torch.einsum("ntv,nts,nsw->vw", X, Q, X) / NT
    Delta = torch.stack([torch.diagonal(Q, offset=-r, dim1=1, dim2=2).sum() for r in range(T)])
    Delta = Delta / NT
    GbarHead = Bbar.T @ Phibar.T @ Bbar.T
    MH = torch.einsum("ntv,vw,nsw->nts", Y - U, GbarHead, X)
    QbarHead = torch.einsum("ntv,nts,nsw->vw", X, torch.einsum("tjk,ntk->ntj", J, MH), X) / NT
    return {"Bbar": Bbar, "SigmaB": SigmaB, "Phibar": Phibar, "PhiBT": Phibar.T @ Bbar.T,
            "Gbar": Gbar, "M": M, "Q": Q, "Qbar": Qbar, "Delta": Delta, "GbarHead": GbarHead,
            "QbarHead": QbarHead, "positions": NT}


def reference_stats_ragged(seqs: list[Tensor], d_vocab: int) -> dict[str, Tensor]:
    """Literal statistics of sequences of different lengths (each >= 2 tokens).

    Sequence i contributes its own T_i = len - 1 positions with its own X_i, Y_i, U and A0;
    every average divides by the total number of positions sum_i T_i (= NT when all equal).
    Returns Bbar, SigmaB, Phibar, PhiBT, Gbar, Qbar and Delta (length max T_i), GbarHead and
    QbarHead.
    """
    parts = [one_hot_xy(s[None, :], d_vocab) for s in seqs]
    P = sum(X.shape[1] for X, _ in parts)
    Bbar = sum(torch.einsum("ntv,ntw->vw", X, Y - 1.0 / d_vocab) for X, Y in parts) / P
    Phibar = sum(torch.einsum("ntv,ts,nsw->vw", Y - 1.0 / d_vocab, uniform_causal(X.shape[1]), X)
                 for X, Y in parts) / P
    SigmaB = Bbar.T @ Bbar
    Gbar = SigmaB @ Phibar
    GbarHead = Bbar.T @ Phibar.T @ Bbar.T
    q, qh = reference_q_given(seqs, d_vocab, Gbar), reference_q_given(seqs, d_vocab, GbarHead)
    return {"Bbar": Bbar, "SigmaB": SigmaB, "Phibar": Phibar, "PhiBT": Phibar.T @ Bbar.T,
            "Gbar": Gbar, "Qbar": q["Qbar"], "Delta": q["Delta"], "GbarHead": GbarHead,
            "QbarHead": qh["Qbar"], "positions": P}


def reference_q_given(seqs: list[Tensor], d_vocab: int, Gbar: Tensor) -> dict[str, Tensor]:
    """Literal Qbar and Delta of sequences (each >= 2 tokens) with a GIVEN Gbar (e.g. the full
    corpus's, for a part of it: ``CorpusStats.subset``; GbarHead for QbarHead), divided by
    their own positions."""
    P = sum(int(s.numel()) - 1 for s in seqs)
    Tmax = max(int(s.numel()) - 1 for s in seqs)
    Qbar = torch.zeros(d_vocab, d_vocab, dtype=torch.float64)
    Delta = torch.zeros(Tmax, dtype=torch.float64)
    for s in seqs:
        X, Y = one_hot_xy(s[None, :], d_vocab)
        T = X.shape[1]
        M = torch.einsum("ntv,vw,nsw->nts", Y - 1.0 / d_vocab, Gbar, X)
        Q = torch.einsum("tjk,ntk->ntj", softmax_jacobian_uniform(T), M)
        Qbar += torch.einsum("ntv,nts,nsw->vw", X, Q, X)
        for r in range(T):
            Delta[r] += torch.diagonal(Q, offset=-r, dim1=1, dim2=2).sum()
    return {"Qbar": Qbar / P, "Delta": Delta / P, "positions": P}
