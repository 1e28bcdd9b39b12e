"""The sparse engine's first pass: the section-6 algebra on sparse counts, never a V x V.

With C the bigram counts, n = C 1 (input-token counts), W the fixed-point context sums and
w = 1^T W, P the number of positions:
  Bbar = (C - n 1^T / V) / P,   Phibar = (W - 1 w^T / V) / P      (sparse minus rank one)
so  Bbar X = (C X) / P - n (1^T X) / (P V)   and   Bbar^T X = (C^T X) / P - 1 (n^T X) / (P V)
cost two sparse-times-dense products (nnz(C) x width each). Every composition is built by
column tiles from these: SigmaB[:, J] = Bbar^T Bbar[:, J]; for context tokens A,
Y = Bbar Phibar[:, A] (PhiBT[A, :] = Y^T) and Gbar[:, A] = Bbar^T Y. Entries of Bbar and Phibar
are computed with the dense engine's own float operations, so they are bit-identical to it.

``gc_tile`` gives pass 2 (``second.py``) the columns of Gbar one tile at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.sparse.count import SparseCountAccumulator
from pythia_probe.stats.sparse.tables import F, FixedTable, ranges, reduce_equal


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
        if sparsecount.use_c():
            return sparsecount.spmm(self.indptr, self.col, self.val, X,
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
