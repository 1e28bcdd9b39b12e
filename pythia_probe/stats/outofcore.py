"""Compositions and pass 2 from sparse counts, never a dense V x V (the section-6 algebra).

With C the bigram counts, n = C 1 (input-token counts), W the fixed-point context sums and
w = 1^T W, P the number of positions:
  Bbar = (C - n 1^T / V) / P,   Phibar = (W - 1 w^T / V) / P      (sparse minus rank one)
so  Bbar X = (C X) / P - n (1^T X) / (P V)   and   Bbar^T X = (C^T X) / P - 1 (n^T X) / (P V)
cost two sparse-times-dense products (nnz(C) x width each). Every composition is built by
column tiles from these: SigmaB[:, J] = Bbar^T Bbar[:, J]; for context tokens A,
Y = Bbar Phibar[:, A] (PhiBT[A, :] = Y^T) and Gbar[:, A] = Bbar^T Y. Entries of Bbar and Phibar
are computed with the dense engine's own float operations, so they are bit-identical to it.

Pass 2 runs tile by tile over the context tokens: every pair (t, k) belongs to the tile of x_k,
M = Gc[y_t, x_k] with Gc = Gbar - 1 colsum(Gbar)^T / V. Q = M / (t+1) - S_t / (t+1)^2, where
S_t = sum_{k<=t} M[t, k] needs every tile; so each sweep adds M / (t+1) into Qbar and Delta
and M into S_t, and once all tiles are done the centring term S_t / (t+1)^2 is subtracted
(``centre``): one Gbar tile alive at a time, one sweep over the data per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.stats import kernels, sparsefast
from pythia_probe.stats.sparse import (
    F,
    FixedTable,
    SparseCountAccumulator,
    ranges,
    reduce_equal,
)

OCC_PAIRS = 1 << 22
"""Pairs per vectorised step of the numpy pass-2 sweep (the C kernel needs no chunks)."""


@dataclass
class Csr:
    """A V x V sparse matrix in CSR form (int64 indptr / col, float64 val)."""

    indptr: np.ndarray
    col: np.ndarray
    val: np.ndarray

    @classmethod
    def from_sorted(cls, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, V: int) -> Csr:
        """From entries sorted by row; checks the column range once (the C kernel trusts it)."""
        if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= V):
            raise ValueError("column index outside the vocabulary")
        indptr = np.searchsorted(rows, np.arange(V + 1)).astype(np.int64)
        return cls(indptr, cols.astype(np.int64), vals.astype(np.float64))

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.col.nbytes + self.val.nbytes

    def matmul(self, X: np.ndarray, transposed: bool = False, u: np.ndarray | None = None,
               v: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
        """(self @ X - u v^T) * scale for a dense X [V, w] (u None: ones; v None: no rank-one
        term), by the compiled kernel in one pass, else scipy; ``transposed``: the result's
        transpose as a contiguous [w, rows] array."""
        if sparsefast.use_c():
            return sparsefast.spmm(self.indptr, self.col, self.val, X,
                                   torch.get_num_threads(), transposed, u, v, scale)
        A = scipy.sparse.csr_matrix((self.val, self.col, self.indptr),
                                    shape=(self.indptr.size - 1, X.shape[0]))
        out = np.asarray(A @ X)
        if v is not None:
            out -= np.outer(np.ones(out.shape[0]) if u is None else u, v)
        if scale != 1.0:
            out *= scale
        return np.ascontiguousarray(out.T) if transposed else out

    def take_rows(self, rows: np.ndarray) -> Csr:
        """The rows ``rows`` (in that order) as a new CSR matrix."""
        starts, counts = self.indptr[rows], np.diff(self.indptr)[rows]
        idx = ranges(starts, counts)
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return Csr(indptr, self.col[idx], self.val[idx])


@dataclass
class SparseFirstPass:
    """Final pass-1 counts of the sparse engine with the vectors the algebra needs."""

    d_vocab: int
    T: int
    n_positions: int
    n_sequences: int
    n_tokens: int
    checksum: list[int]
    token_counts: Tensor
    bigram_keys: np.ndarray
    """Sorted keys x * V + y of the bigrams that occur."""
    bigram_counts: np.ndarray
    n: np.ndarray
    """Input-token counts (rows sums of C) as float64."""
    C: Csr
    """Bigram counts, rows = current token x, columns = next token y."""
    CT: Csr
    """C transposed (rows y)."""
    context: FixedTable
    """W, context-major keys a * V + y."""
    colsum: Tensor
    """w = column sums of W (float64, as the dense engine computes them)."""
    ctx_ids: np.ndarray
    """Context tokens with a non-zero column of W (the only non-zero columns of Gbar)."""

    @property
    def nbytes(self) -> int:
        return self.C.nbytes + self.CT.nbytes + self.context.nbytes + 24 * self.d_vocab

    def bt_mul(self, X: np.ndarray, CT: Csr | None = None) -> np.ndarray:
        """Bbar^T @ X = (C^T X) / P - 1 (n^T X) / (P V); rows of ``CT`` (default all of C^T)."""
        P, V = self.n_positions, self.d_vocab
        out = (self.CT if CT is None else CT).matmul(X)
        out /= P
        out -= (self.n @ X) / (P * V)
        return out

    def w_columns(self, cols: np.ndarray) -> np.ndarray:
        """W[:, cols] as a dense float64 [V, len(cols)] array (hi + lo 2^-F per entry)."""
        V = self.d_vocab
        keys, hi, lo = self.context.columns(cols, V)
        pos = np.full(V, -1, dtype=np.int64)
        pos[cols] = np.arange(cols.size)
        out = np.zeros((V, cols.size))
        out.reshape(-1)[(keys % V) * cols.size + pos[keys // V]] = hi + lo * 2.0 ** -F
        return out

    def bphi(self, cols: np.ndarray) -> np.ndarray:
        """P^2 Bbar Phibar[:, cols] = C W[:, cols] - n w[cols]^T / V (Phibar's columns sum to 0
        and C 1 = n, so the rank-one terms collapse to one), [V, len(cols)]."""
        w = self.colsum[torch.from_numpy(cols)].numpy() / self.d_vocab
        return self.C.matmul(self.w_columns(cols), u=self.n, v=w)


def first_pass(acc: SparseCountAccumulator) -> SparseFirstPass:
    """Vectors and sparse matrices of the final counts (shares the accumulator's tables)."""
    acc.flush()
    V, P = acc.d_vocab, acc.n_positions
    if P == 0:
        raise BadInputError("no positions were counted (empty corpus or every document "
                            "skipped)")
    keys, counts = acc.bigram.keys, acc.bigram.counts
    rows, cols = keys // V, keys % V
    n = np.zeros(V, dtype=np.int64)
    r, sums = reduce_equal(rows, counts)
    n[r] = sums
    order = np.argsort(cols, kind="stable")
    hi_sum, lo_sum = np.zeros(V, dtype=np.int64), np.zeros(V, dtype=np.int64)
    for k, h, low in acc.context.chunks:
        a, hs, ls = reduce_equal(k // V, h, low)
        hi_sum[a] += hs
        lo_sum[a] += ls
    colsum = (torch.from_numpy(hi_sum).double()
              + torch.from_numpy(lo_sum).double() * 2.0 ** -F)
    return SparseFirstPass(
        V, acc.T, P, acc.n_sequences, acc.n_tokens, acc.checksum(),
        torch.from_numpy(acc.token_counts.copy()), keys, counts, n.astype(np.float64),
        Csr.from_sorted(rows, cols, counts, V),
        Csr.from_sorted(cols[order], rows[order], counts[order], V), acc.context, colsum,
        np.flatnonzero((hi_sum != 0) | (lo_sum != 0)))


# -- exact blocks of Bbar and Phibar ----------------------------------------------------------
def _positions(ids: Tensor | np.ndarray | None, V: int) -> tuple[np.ndarray, int]:
    """(where each token id sits in ``ids`` or -1, len(ids)); None = every id in order."""
    if ids is None:
        return np.arange(V), V
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.full(V, -1, dtype=np.int64)
    pos[ids] = np.arange(ids.size)
    return pos, ids.size


def _scatter(rows: np.ndarray, cols: np.ndarray, vals: Tensor, row_ids, col_ids, V: int
             ) -> Tensor:
    """A dense [len(row_ids), len(col_ids)] float64 block holding ``vals`` at (rows, cols)."""
    pr, nr = _positions(row_ids, V)
    pc, nc = _positions(col_ids, V)
    r, c = pr[rows], pc[cols]
    keep = (r >= 0) & (c >= 0)
    out = torch.zeros(nr * nc, dtype=torch.float64)
    flat = torch.from_numpy(r[keep] * nc + c[keep])
    out[flat] = vals[torch.from_numpy(np.flatnonzero(keep))]
    return out.view(nr, nc)


def bbar_block(fp: SparseFirstPass, rows=None, cols=None) -> Tensor:
    """Bbar[rows][:, cols] (None: all ids), bit-identical to the dense engine's entries."""
    V, P = fp.d_vocab, fp.n_positions
    keys = fp.bigram_keys
    B = _scatter(keys // V, keys % V, torch.from_numpy(fp.bigram_counts).double(), rows, cols, V)
    rowsum = torch.from_numpy(fp.n)
    r = rowsum if rows is None else rowsum[torch.as_tensor(rows)]
    B /= P
    B -= (r / (P * V))[:, None]
    return B


def phibar_block(fp: SparseFirstPass, rows=None, cols=None) -> Tensor:
    """Phibar[rows][:, cols] (rows = targets, cols = contexts; None: all ids), bit-identical.
    One pass over W's chunks: only the entries that land in the block are converted."""
    V, P = fp.d_vocab, fp.n_positions
    pr, nr = _positions(rows, V)
    pc, nc = _positions(cols, V)
    Phi = torch.zeros(nr * nc, dtype=torch.float64)
    for keys, hi, lo in fp.context.chunks:
        r, c = pr[keys % V], pc[keys // V]
        keep = np.flatnonzero((r >= 0) & (c >= 0))
        W = torch.from_numpy(hi[keep]).double() + torch.from_numpy(lo[keep]).double() * 2.0 ** -F
        Phi[torch.from_numpy(r[keep] * nc + c[keep])] = W
    Phi = Phi.view(nr, nc)
    colsum = fp.colsum if cols is None else fp.colsum[torch.as_tensor(cols)]
    Phi -= colsum[None, :] / V
    Phi /= P
    return Phi


# -- compositions restricted to ids ----------------------------------------------------------
def compositions(fp: SparseFirstPass, ids: Tensor, width: int) -> dict[str, Tensor]:
    """SigmaB, PhiBT and Gbar restricted to ids x ids, by column tiles of ``width``.

    Only the rows ``ids`` of C^T are multiplied for SigmaB and Gbar; Bbar Phibar needs all
    rows (Gbar sums over them)."""
    ids_np = np.asarray(ids, dtype=np.int64)
    k, P, V = ids_np.size, fp.n_positions, fp.d_vocab
    CT = fp.CT.take_rows(ids_np)
    out = {name: torch.empty(k, k, dtype=torch.float64) for name in ("SigmaB", "PhiBT", "Gbar")}
    for j0 in range(0, k, width):
        J = ids_np[j0:j0 + width]
        out["SigmaB"][:, j0:j0 + J.size] = torch.from_numpy(
            fp.bt_mul(bbar_block(fp, None, J).numpy(), CT))
        Y = fp.bphi(J)
        out["PhiBT"][j0:j0 + J.size] = torch.from_numpy(Y[ids_np].T / (P * P))
        G = CT.matmul(Y, v=(fp.n @ Y) / V, scale=float(P) ** -3)
        out["Gbar"][:, j0:j0 + J.size] = torch.from_numpy(G)
    return out


def gc_tile(fp: SparseFirstPass, cols: np.ndarray) -> np.ndarray:
    """Gbar[:, cols]^T, contiguous [len(cols), V]: (C^T Y - 1 (n^T Y) / V) / P^3 with
    Y = P^2 Bbar Phibar[:, cols]. Gbar's columns sum to 0 (Bbar's rows do), so the column
    centring of M (Eq. 15's U term) leaves it unchanged: this is pass 2's Gc."""
    P, V = fp.n_positions, fp.d_vocab
    Y = fp.bphi(cols)
    return fp.CT.matmul(Y, transposed=True, v=(fp.n @ Y) / V, scale=float(P) ** -3)


# -- pass 2 ------------------------------------------------------------------------------------
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
    if sparsefast.use_c():
        sparsefast.sweep(tokens, lengths, occ, col_of, GcT, rows.row_of, rows.side,
                         rows.dummy, sums.S, sums.Delta, sums.Dc, sums.QAt)
        return
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
    if sparsefast.use_c():
        sparsefast.centre(tokens, lengths, S, rows.row_of, rows.side, rows.dummy, Delta, Dc,
                          Qbar, seqs)
        return
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
    x = kernels.clean(tokens.to(torch.int64), lengths.to(torch.int64))
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
