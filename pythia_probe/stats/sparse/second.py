"""Pass 2 of the sparse engine, tile by tile over the context tokens (never a V x V Gbar): this
is where the sparse engine accumulates Qbar, in the C kernels ``sc_sweep`` and ``sc_centre``
(``stats/native/_sparsecount.c``; their numpy specification is the tests' oracle).

Every pair (t, k) of a sequence belongs to the tile of its context token x_k. For a tile,
``first.gc_tile`` gives Gbar[:, tile] (= pass 2's Gc: Gbar's columns sum to 0, so the
centring of M in Eq. 15 changes nothing) and ``sweep`` visits every context occurrence of the
tile's tokens and every t >= k: M = Gc[y_t, x_k] is added to S_t, M / (t+1) to
Qbar[x_t, x_k] (kept transposed: the tile's rows stay in cache) and to Delta[t - k].
Q = M / (t+1) - S_t / (t+1)^2 (Eq. 16) needs S_t = sum_{k<=t} M[t, k] over every tile, so
once all tiles are done ``centre`` subtracts S_t / (t+1)^2 from Qbar[x_t, x_j] (j <= t) and
Delta[r] (r <= t). Delta is a small difference of these two large sums: both are compensated
(Neumaier) sums. One Gbar tile is alive at a time; the windows of the whole corpus are held
(4 B per token, 28 B per position with S and the occurrence order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.sparse.first import SparseFirstPass, gc_tile


@dataclass
class QRows:
    """Where Qbar's rows live: identity (side V) or top-k rows plus a dummy row (side k+1)."""

    row_of: np.ndarray | None
    side: int
    dummy: int
    k: int

    @classmethod
    def of(cls, ids: Tensor | None, V: int) -> QRows:
        if ids is None:
            return cls(None, V, -1, V)
        k = int(ids.numel())
        row_of = np.full(V, k, dtype=np.int64)
        row_of[np.asarray(ids, dtype=np.int64)] = np.arange(k)
        return cls(row_of, k + 1, k, k)

    def of_tokens(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.int64) if self.row_of is None else self.row_of[x]


def occurrences(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Context positions s * L + k (k <= length - 2) sorted by token, and their tokens."""
    L = tokens.shape[1]
    flat = np.flatnonzero(np.arange(L)[None, :] < (lengths[:, None] - 1))
    toks = tokens.reshape(-1)[flat]
    order = np.argsort(toks, kind="stable")
    return flat[order], toks[order]


def sweep(tokens: np.ndarray, lengths: np.ndarray, occ: np.ndarray, col_of: np.ndarray,
          GcT: np.ndarray, rows: QRows, sums: TileSums) -> None:
    """One tile: M = Gc[y_t, x_k] into S[s, t]; M / (t+1) into Delta[t - k] (compensated) and
    QAt[r(x_k), r(x_t)] (Qbar transposed), for every occurrence (s, k) and t >= k."""
    sparsecount.sweep(tokens, lengths, occ, col_of, GcT, rows.row_of, rows.side, rows.dummy,
                      sums.S, sums.Delta, sums.Dc, sums.QAt)


def centre(tokens: np.ndarray, lengths: np.ndarray, S: np.ndarray, rows: QRows,
           Delta: np.ndarray, Dc: np.ndarray, Qbar: np.ndarray, seqs: tuple[int, int]) -> None:
    """Subtract c_t = S[s, t] / (t+1)^2 from Qbar[r(x_t), r(x_j)] (j <= t) and Delta[r]
    (r <= t) for sequences seqs[0] <= s < seqs[1]: the centring term of Q (Eq. 16)."""
    sparsecount.centre(tokens, lengths, S, rows.row_of, rows.side, rows.dummy, Delta, Dc, Qbar,
                       seqs)


@dataclass
class TileSums:
    """Pass-2 partial sums over the tiles done so far (what a pass-2 checkpoint holds)."""

    S: np.ndarray
    """Per-position sums of M, [n * T]."""
    Delta: np.ndarray
    Dc: np.ndarray
    """Compensation of the Delta sum (Delta + Dc is the sum)."""
    QAt: np.ndarray
    """Sum of M / (t+1) into Qbar transposed, [side * side]."""
    done: list[int]

    @classmethod
    def zeros(cls, n: int, T: int, side: int) -> TileSums:
        return cls(np.zeros(n * T), np.zeros(T), np.zeros(T), np.zeros(side * side), [])


def tiles(ctx_ids: np.ndarray, width: int) -> list[np.ndarray]:
    """Context tokens in consecutive groups of ``width`` (sorted ids)."""
    return [ctx_ids[i:i + width] for i in range(0, ctx_ids.size, width)]


def sweep_tiles(fp: SparseFirstPass, tokens: np.ndarray, lengths: np.ndarray, rows: QRows,
                width: int, todo: list[int], sums: TileSums, after_tile=None) -> TileSums:
    """Pass 2 over the tiles ``todo`` not yet in ``sums.done``; ``after_tile(sums)`` after each."""
    occ, occ_tok = occurrences(tokens, lengths)
    groups = tiles(fp.ctx_ids, width)
    col_of = np.full(fp.d_vocab, -1, dtype=np.int64)
    for i in todo:
        if i in sums.done:
            continue
        cols = groups[i]
        GcT = gc_tile(fp, cols)
        col_of[cols] = np.arange(cols.size)
        a = np.searchsorted(occ_tok, cols[0], side="left")
        b = np.searchsorted(occ_tok, cols[-1], side="right")
        sweep(tokens, lengths, occ[a:b], col_of, GcT, rows, sums)
        col_of[cols] = -1
        sums.done.append(i)
        if after_tile is not None:
            after_tile(sums)
    return sums


def finish(tokens: np.ndarray, lengths: np.ndarray, rows: QRows, sums: TileSums,
           seqs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Qbar sum [side, side] (row-major) and Delta sum once S is complete: the A part minus
    the centring term of sequences ``seqs``. Consumes ``sums`` (QAt is transposed in place)."""
    Q = transpose_inplace(sums.QAt.reshape(rows.side, rows.side))
    sums.QAt = None  # type: ignore[assignment]
    centre(tokens, lengths, sums.S, rows, sums.Delta, sums.Dc, Q.reshape(-1), seqs)
    return Q, sums.Delta + sums.Dc


def transpose_inplace(a: np.ndarray, block: int = 1024) -> np.ndarray:
    """Transpose a square array in place by swapping blocks (no second V x V array)."""
    n = a.shape[0]
    for i in range(0, n, block):
        a[i:i + block, i:i + block] = a[i:i + block, i:i + block].T.copy()
        for j in range(i + block, n, block):
            upper = a[i:i + block, j:j + block].copy()
            a[i:i + block, j:j + block] = a[j:j + block, i:i + block].T
            a[j:j + block, i:i + block] = upper.T
    return a


def pass2_tokens(tokens: Tensor, lengths: Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """int32 tokens with padding replaced by 0, and int64 lengths (pass-2 input layout)."""
    L = tokens.shape[1]
    if lengths is None:
        lengths = torch.full((tokens.shape[0],), L, dtype=torch.int64)
    x = tokens.to(torch.int64).masked_fill(torch.arange(L)[None, :] >= lengths[:, None], 0)
    return (np.ascontiguousarray(x.numpy().astype(np.int32)),
            np.ascontiguousarray(lengths.to(torch.int64).numpy()))


def second_pass(fp: SparseFirstPass, tokens: np.ndarray, lengths: np.ndarray,
                ids: Tensor | None, width: int) -> tuple[Tensor, Tensor]:
    """(Qbar sum [k, k], Delta sum [T]) of one process over every tile (no checkpoints)."""
    rows = QRows.of(ids, fp.d_vocab)
    sums = TileSums.zeros(tokens.shape[0], fp.T, rows.side)
    todo = list(range(len(tiles(fp.ctx_ids, width))))
    sweep_tiles(fp, tokens, lengths, rows, width, todo, sums)
    Q, D = finish(tokens, lengths, rows, sums, (0, tokens.shape[0]))
    return qbar_sum(Q, rows), torch.from_numpy(D)


def qbar_sum(Q: np.ndarray, rows: QRows) -> Tensor:
    """Q without the dummy row and column (no copy at full vocabulary)."""
    return torch.from_numpy(Q if rows.k == rows.side else Q[: rows.k, : rows.k].copy())
