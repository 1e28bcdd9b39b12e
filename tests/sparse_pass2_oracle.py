"""The numpy specification of the sparse engine's pass-2 kernels (``sc_sweep``,
``sc_centre_tile`` and ``sc_centre`` of stats/native/_sparsecount.c), kept as the tests'
oracle: the library runs pass 2 only in C (Eq. 16 written once per engine). Same signatures as
the bindings in stats/native/sparsecount.py, so a test can put these in their place."""

from __future__ import annotations

import numpy as np
import torch

OCC_PAIRS = 1 << 22
"""Pairs per vectorised step."""


def _pairs(tokens: np.ndarray, lengths: np.ndarray, occ: np.ndarray):
    """(s, k, t) of every occurrence (s, k) and t >= k, in vectorised steps."""
    L = tokens.shape[1]
    count = lengths[occ // L] - 1 - occ % L
    ends = np.cumsum(count)
    cuts = np.searchsorted(ends, np.arange(OCC_PAIRS, int(ends[-1]) if ends.size else 0,
                                           OCC_PAIRS))
    edges = [0, *np.unique(cuts).tolist(), ends.size]
    for a, b in zip(edges, edges[1:], strict=False):
        if b <= a:
            continue
        o, c = occ[a:b], count[a:b]
        s, k = np.repeat(o // L, c), np.repeat(o % L, c)
        t = k + np.arange(s.size) - np.repeat(np.cumsum(c) - c, c)
        yield s, k, t


def _rows(x: np.ndarray, row_of: np.ndarray | None) -> np.ndarray:
    return x.astype(np.int64) if row_of is None else row_of[x]


def sweep(windows, tile, GcT, sums, block, touched) -> None:
    """sc_sweep: M = Gc[y_t, x_k] into S[s, t]; M / (t+1) into Delta[t - k] (compensated) and
    block[col(x_k), r(x_t)] (its bit set in the bitmap ``touched``)."""
    (tokens, lengths), (occ, col_of, row_of, side, dummy) = windows, tile
    S, Delta, Dc = sums.S, sums.Delta, sums.Dc
    L = tokens.shape[1]
    T = L - 1
    x = tokens.reshape(-1)
    for s, k, t in _pairs(tokens, lengths, occ):
        a = x[s * L + k]
        M = GcT[col_of[a], x[s * L + t + 1]]
        q = M * (1.0 / (t + 1).astype(np.float64))
        torch.from_numpy(S).index_add_(0, torch.from_numpy(s * T + t), torch.from_numpy(M))
        compensated_add(Delta, Dc, np.bincount(t - k, weights=q, minlength=T))
        ra, rt = _rows(a, row_of), _rows(x[s * L + t], row_of)
        keep = (ra != dummy) & (rt != dummy)
        flat = col_of[a[keep]] * side + rt[keep]
        torch.from_numpy(block).index_add_(0, torch.from_numpy(flat), torch.from_numpy(q[keep]))
        np.bitwise_or.at(touched, flat >> 6, np.left_shift(np.uint64(1),
                                                           (flat & 63).astype(np.uint64)))


def centre_tile(windows, tile, S, block, flat, vals) -> None:
    """sc_centre_tile: the kept entries (``flat``, ``vals``) put into the cleared block,
    block[col(x_k), r(x_t)] -= S[s, t] / (t+1)^2 on the same pairs, read back into vals."""
    block[flat] = vals
    _centre_block(windows, tile, S, block)
    vals[:] = block[flat]
    block[flat] = 0.0


def _centre_block(windows, tile, S, block) -> None:
    (tokens, lengths), (occ, col_of, row_of, side, dummy) = windows, tile
    L = tokens.shape[1]
    T = L - 1
    x = tokens.reshape(-1)
    for s, k, t in _pairs(tokens, lengths, occ):
        a = x[s * L + k]
        ra, rt = _rows(a, row_of), _rows(x[s * L + t], row_of)
        keep = (ra != dummy) & (rt != dummy)
        inv = 1.0 / (t + 1).astype(np.float64)
        c = S[s * T + t] * (inv * inv)
        flat = col_of[a[keep]] * side + rt[keep]
        torch.from_numpy(block).index_add_(0, torch.from_numpy(flat),
                                           torch.from_numpy(-c[keep]))


def centre(windows, sums, rows=None) -> None:
    """sc_centre: Delta[r] -= sum over positions t >= r of S[s, t] / (t+1)^2."""
    (tokens, lengths), (S, Delta, Dc) = windows, (sums.S, sums.Delta, sums.Dc)
    n, L = tokens.shape
    T = L - 1
    s0, s1 = rows if rows is not None else (0, n)
    inv = 1.0 / torch.arange(1, T + 1, dtype=torch.float64)
    S2 = torch.from_numpy(S).view(-1, T)
    for a in range(s0, s1, 256):
        sl = slice(a, min(a + 256, s1))
        ln = torch.from_numpy(lengths[sl])
        c = S2[sl] * (inv * inv)[None, :]
        c *= (torch.arange(T)[None, :] < (ln[:, None] - 1)).to(c.dtype)
        compensated_add(Delta, Dc, -c.sum(0).flip(0).cumsum(0).flip(0).numpy())


def compensated_add(total: np.ndarray, comp: np.ndarray, x: np.ndarray) -> None:
    """Neumaier's step, elementwise: total + comp keeps the sum to within one rounding."""
    t = total + x
    comp += np.where(np.abs(total) >= np.abs(x), (total - t) + x, (x - t) + total)
    total[:] = t
