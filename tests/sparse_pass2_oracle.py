"""The numpy specification of the sparse engine's pass-2 kernels (``sc_sweep`` and
``sc_centre`` of stats/native/_sparsecount.c), kept as the tests' oracle: the library runs pass
2 only in C (Eq. 16 written once per engine)."""

from __future__ import annotations

import numpy as np
import torch

from pythia_probe.stats.dense import kernels
from pythia_probe.stats.sparse.second import QRows, TileSums

OCC_PAIRS = 1 << 22
"""Pairs per vectorised step."""


def sweep(tokens: np.ndarray, lengths: np.ndarray, occ: np.ndarray, col_of: np.ndarray,
          GcT: np.ndarray, rows: QRows, sums: TileSums) -> None:
    """One tile: M = Gc[y_t, x_k] into S[s, t]; M / (t+1) into Delta[t - k] (compensated) and
    QAt[r(x_k), r(x_t)] (Qbar transposed), for every occurrence (s, k) and t >= k."""
    L = tokens.shape[1]
    count = lengths[occ // L] - 1 - occ % L
    ends = np.cumsum(count)
    for a, b in _chunks(ends, OCC_PAIRS):
        _sweep_numpy(tokens, occ[a:b], count[a:b], col_of, GcT, rows, sums)


def _chunks(ends: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Occurrence ranges holding about ``size`` pairs each (by the running pair count)."""
    cuts = np.searchsorted(ends, np.arange(size, int(ends[-1]) if ends.size else 0, size))
    edges = [0, *np.unique(cuts).tolist(), ends.size]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _sweep_numpy(tokens, occ, count, col_of, GcT, rows: QRows, sums: TileSums) -> None:
    L = tokens.shape[1]
    T = L - 1
    s, k = np.repeat(occ // L, count), np.repeat(occ % L, count)
    t = k + np.arange(s.size) - np.repeat(np.cumsum(count) - count, count)
    x = tokens.reshape(-1)
    a = x[s * L + k]
    M = GcT[col_of[a], x[s * L + t + 1]]
    q = M * (1.0 / (t + 1).astype(np.float64))
    torch.from_numpy(sums.S).index_add_(0, torch.from_numpy(s * T + t), torch.from_numpy(M))
    compensated_add(sums.Delta, sums.Dc, np.bincount(t - k, weights=q, minlength=T))
    ra, rt = rows.of_tokens(a), rows.of_tokens(x[s * L + t])
    keep = (ra != rows.dummy) & (rt != rows.dummy)
    torch.from_numpy(sums.QAt).index_add_(0, torch.from_numpy(ra[keep] * rows.side + rt[keep]),
                                          torch.from_numpy(q[keep]))


def compensated_add(total: np.ndarray, comp: np.ndarray, x: np.ndarray) -> None:
    """Neumaier's step, elementwise: total + comp keeps the sum to within one rounding."""
    t = total + x
    comp += np.where(np.abs(total) >= np.abs(x), (total - t) + x, (x - t) + total)
    total[:] = t


def centre(tokens: np.ndarray, lengths: np.ndarray, S: np.ndarray, rows: QRows,
           Delta: np.ndarray, Dc: np.ndarray, Qbar: np.ndarray, seqs: tuple[int, int]) -> None:
    """Subtract c_t = S[s, t] / (t+1)^2 from Qbar[r(x_t), r(x_j)] (j <= t) and Delta[r]
    (r <= t) for sequences seqs[0] <= s < seqs[1]: the centring term of Q (Eq. 16)."""
    T = tokens.shape[1] - 1
    inv = 1.0 / torch.arange(1, T + 1, dtype=torch.float64)
    S2 = torch.from_numpy(S).view(-1, T)
    for s0 in range(seqs[0], seqs[1], 256):
        sl = slice(s0, min(s0 + 256, seqs[1]))
        ln = torch.from_numpy(lengths[sl])
        c = S2[sl] * (inv * inv)[None, :]
        c *= (torch.arange(T)[None, :] < (ln[:, None] - 1)).to(c.dtype)
        compensated_add(Delta, Dc, -c.sum(0).flip(0).cumsum(0).flip(0).numpy())
        x = torch.from_numpy(rows.of_tokens(tokens[sl, :T]))  # the dummy row is dropped later
        keys = kernels.pair_keys(x, x, rows.side).reshape(-1).long()
        torch.from_numpy(Qbar).index_add_(0, keys, -kernels.per_pair(c).reshape(-1))
