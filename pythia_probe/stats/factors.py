"""The statistics in factored form (leading-terms section 6): never a V x V matrix.

With C the bigram counts (rows = current token x, columns = next token y), n = C 1, W the
context weights (W[y, a]: the 1/t weights of target y over context a, exact fixed point
hi + lo 2^-42), w = 1^T W its column sums and P the number of positions:

  Bbar   = (C - n 1^T / V) / P            Phibar = (W - 1 w^T / V) / P
  SigmaB = Bbar^T Bbar     PhiBT = Phibar^T Bbar^T     Gbar = SigmaB Phibar
  GbarHead = Bbar^T Phibar^T Bbar^T = Bbar^T PhiBT  (pythia-per-head.py's G_bar, transposed)

so every block and every product with a dense X is a sparse product plus vector corrections:
``Bbar X = (C X) / P - n (1^T X) / (P V)``, ``Bbar^T X = (C^T X) / P - 1 (n^T X) / (P V)``,
``Phibar X = (W X) / P - 1 (w^T X) / (P V)``, ``Phibar^T X = (W^T X) / P - w (1^T X) / (P V)``,
and the compositions are products of those. Entries of Bbar and Phibar are computed with the
dense engine's own float operations, so they are bit-identical to it; the compositions agree
to float64 rounding. :class:`SparseQ` holds Qbar where it is non-zero: on the (query, key)
pairs that occur (its centring terms live on the same pairs).

Indices here are token ids 0..V-1 (``result.CorpusStats`` maps a restricted vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.stats.fixedpoint import FRAC_BITS, reduce_equal
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.tables import FixedTable, ranges

F = FRAC_BITS
CHUNK_COLS = 512
"""Columns per dense [V, k] block in products and compositions (memory V x 512 x 8 B)."""


@dataclass
class Csr:
    """A sparse matrix in CSR form (int64 indptr / col, float64 val) with ``n_cols`` columns."""

    indptr: np.ndarray
    col: np.ndarray
    val: np.ndarray
    n_cols: int = 0

    @classmethod
    def from_sorted(cls, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, V: int) -> Csr:
        """From entries sorted by row; checks the column range once (the C kernel trusts it)."""
        if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= V):
            raise ValueError("column index outside the vocabulary")
        indptr = np.searchsorted(rows, np.arange(V + 1)).astype(np.int64)
        return cls(indptr, cols.astype(np.int64), vals.astype(np.float64), V)

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.col.nbytes + self.val.nbytes

    def matmul(self, X: np.ndarray, transposed: bool = False, u: np.ndarray | None = None,
               v: np.ndarray | None = None, scale: float = 1.0,
               x_transposed: bool = False) -> np.ndarray:
        """(self @ X - u v^T) * scale for a dense X [n_cols, w] (u None: ones; v None: no
        rank-one term), by the compiled kernel in one pass, else scipy; ``transposed``: the
        result's transpose as a contiguous [w, rows] array; ``x_transposed``: X is given as
        its transpose [w, n_cols]."""
        return sparsecount.spmm((self.indptr, self.col, self.val), X, torch.get_num_threads(),
                                transposed, sparsecount.Correction(u, v, scale), x_transposed)

    def scipy(self) -> scipy.sparse.csr_matrix:
        return scipy.sparse.csr_matrix((self.val, self.col, self.indptr),
                                       shape=(self.indptr.size - 1, self.n_cols))

    def take_rows(self, rows: np.ndarray) -> Csr:
        """The rows ``rows`` (in that order) as a new CSR matrix."""
        starts, counts = self.indptr[rows], np.diff(self.indptr)[rows]
        idx = ranges(starts, counts)
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return Csr(indptr, self.col[idx], self.val[idx], self.n_cols)


@dataclass
class Factors:
    """C, W and the vectors of the rank-one terms: everything Bbar, Phibar, SigmaB, PhiBT and
    Gbar are made of (see the module docstring)."""

    d_vocab: int
    n_positions: int
    token_counts: Tensor
    bigram_keys: np.ndarray
    """Sorted keys x * V + y of the bigrams that occur."""
    bigram_counts: np.ndarray
    context: FixedTable
    """W, context-major keys a * V + y with exact fixed-point sums (hi, lo)."""
    n: np.ndarray = field(init=False)
    """Input-token counts (row sums of C) as float64."""
    C: Csr = field(init=False)
    CT: Csr = field(init=False)
    colsum: Tensor = field(init=False)
    """w = column sums of W (float64, as the dense engine computes them)."""
    ctx_ids: np.ndarray = field(init=False)
    """Context tokens with a non-zero column of W (the only non-zero columns of Gbar)."""

    def __post_init__(self) -> None:
        V = self.d_vocab
        if self.n_positions == 0:
            raise BadInputError("no positions were counted (empty corpus or every document "
                                "skipped)")
        rows, cols = self.bigram_keys // V, self.bigram_keys % V
        n = np.zeros(V, dtype=np.int64)
        r, sums = reduce_equal(rows, self.bigram_counts)
        n[r] = sums
        self.n = n.astype(np.float64)
        order = np.argsort(cols, kind="stable")
        self.C = Csr.from_sorted(rows, cols, self.bigram_counts, V)
        self.CT = Csr.from_sorted(cols[order], rows[order], self.bigram_counts[order], V)
        hi_sum, lo_sum = np.zeros(V, dtype=np.int64), np.zeros(V, dtype=np.int64)
        for k, h, low in self.context.chunks:
            a, hs, ls = reduce_equal(k // V, h, low)
            hi_sum[a] += hs
            lo_sum[a] += ls
        self.colsum = (torch.from_numpy(hi_sum).double()
                       + torch.from_numpy(lo_sum).double() * 2.0 ** -F)
        self.ctx_ids = np.flatnonzero((hi_sum != 0) | (lo_sum != 0))

    @classmethod
    def from_dense(cls, d_vocab: int, n_positions: int, token_counts: Tensor, bigram: Tensor,
                   hi: Tensor, lo: Tensor) -> Factors:
        """The factors of the dense engine's pass-1 state (flat V x V bigram counts x * V + y,
        canonical fixed-point limbs y * V + a): its non-zero entries, exactly."""
        V = d_vocab
        big = bigram.cpu().numpy()
        nz = np.flatnonzero(big)
        h, low = hi.cpu().numpy(), lo.cpu().numpy()
        idx = np.flatnonzero((h != 0) | (low != 0))  # target-major y * V + a
        keys = (idx % V) * V + idx // V
        order = np.argsort(keys)
        return cls(V, n_positions, token_counts.cpu().clone(), nz.astype(np.int64),
                   big[nz].astype(np.int64),
                   FixedTable([(keys[order], h[idx][order].copy(), low[idx][order].copy())]))

    @property
    def nbytes(self) -> int:
        return self.C.nbytes + self.CT.nbytes + self.context.nbytes + 24 * self.d_vocab

    # -- W as sparse matrices (built on first use: products) ------------------------------------
    @cached_property
    def WT(self) -> Csr:
        """W^T (rows = context a, columns = target y), float64 hi + lo 2^-F."""
        V = self.d_vocab
        keys, hi, lo = self.context.arrays()
        return Csr.from_sorted(keys // V, keys % V, hi + lo * 2.0 ** -F, V)

    @cached_property
    def W(self) -> Csr:
        """W (rows = target y, columns = context a)."""
        V, WT = self.d_vocab, self.WT
        rows = np.repeat(np.arange(V), np.diff(WT.indptr))
        order = np.argsort(WT.col, kind="stable")
        return Csr.from_sorted(WT.col[order], rows[order], WT.val[order], V)

    # -- the building blocks ------------------------------------------------------------------
    def bt_mul(self, X: np.ndarray, CT: Csr | None = None) -> np.ndarray:
        """Bbar^T @ X = (C^T X) / P - 1 (n^T X) / (P V); rows of ``CT`` (default all of C^T)."""
        P, V = self.n_positions, self.d_vocab
        out = (self.CT if CT is None else CT).matmul(X)
        out /= P
        out -= (self.n @ X) / (P * V)
        return out

    def b_mul(self, X: np.ndarray) -> np.ndarray:
        """Bbar @ X = (C X) / P - n (1^T X) / (P V)."""
        P, V = self.n_positions, self.d_vocab
        return self.C.matmul(X, u=self.n, v=X.sum(0) / V, scale=1.0 / P)

    def phi_mul(self, X: np.ndarray) -> np.ndarray:
        """Phibar @ X = (W X) / P - 1 (w^T X) / (P V)."""
        P, V = self.n_positions, self.d_vocab
        return self.W.matmul(X, v=(self.colsum.numpy() @ X) / V, scale=1.0 / P)

    def phi_t_mul(self, X: np.ndarray) -> np.ndarray:
        """Phibar^T @ X = (W^T X) / P - w (1^T X) / (P V)."""
        P, V = self.n_positions, self.d_vocab
        return self.WT.matmul(X, u=self.colsum.numpy(), v=X.sum(0) / V, scale=1.0 / P)

    @cached_property
    def w_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """W by target rows as CSR arrays (int64 indptr, int32 context columns ascending,
        float64 hi + lo 2^-F: 12 B an entry), by a counting sort of the context table's
        chunks (context-major keys a * V + y); never a copy of the whole table."""
        V = self.d_vocab
        counts = np.zeros(V, dtype=np.int64)
        for k, _, _ in self.context.chunks:
            counts += np.bincount(k % V, minlength=V)
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        col, val = np.empty(int(indptr[-1]), dtype=np.int32), np.empty(int(indptr[-1]))
        filled = indptr[:-1].copy()
        for k, h, low in self.context.chunks:
            y = k % V
            order = np.argsort(y, kind="stable")
            ys = y[order]
            dest = filled[ys] + np.arange(ys.size) - np.searchsorted(ys, ys, side="left")
            col[dest] = (k[order] // V).astype(np.int32)
            val[dest] = h[order] + low[order] * 2.0 ** -F
            filled += np.bincount(y, minlength=V)
        return indptr, col, val

    def head_rows(self, cols: np.ndarray) -> np.ndarray:
        """P^2 Bbar[cols, :] Phibar = C[cols, :] W - n[cols] w^T / V, [len(cols), V] (Bbar's
        rows sum to 0 and 1^T W = w^T, so the rank-one terms collapse to one): the bigrams of
        ``cols`` times the W rows of their next tokens (a sparse x sparse product in C, scipy
        without the library), never W times a dense block."""
        V = self.d_vocab
        Z = self.C.take_rows(cols)
        u, v = self.n[cols] / V, self.colsum.numpy()
        return sparsecount.spgemm_dense((Z.indptr, Z.col, Z.val), self.w_rows, V,
                                        torch.get_num_threads(), u, v)

    def gbar_head_tile(self, cols: np.ndarray) -> np.ndarray:
        """GbarHead[:, cols]^T = (Bbar[cols, :] Phibar Bbar), contiguous [len(cols), V]:
        (H C - (H n) 1^T / V) / P^3 with H = P^2 Bbar[cols, :] Phibar. Its columns sum to 0
        (Bbar's rows do), like Gbar's."""
        P, V = float(self.n_positions), self.d_vocab
        H = self.head_rows(cols)
        return self.CT.matmul(H, transposed=True, v=(H @ self.n) / V, scale=P ** -3,
                              x_transposed=True)

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

    # -- exact blocks of Bbar and Phibar --------------------------------------------------------
    def bbar_block(self, rows=None, cols=None) -> Tensor:
        """Bbar[rows][:, cols] (None: all ids), bit-identical to the dense engine's entries."""
        V, P = self.d_vocab, self.n_positions
        keys = self.bigram_keys
        B = _scatter(keys // V, keys % V, torch.from_numpy(self.bigram_counts).double(), rows,
                     cols, V)
        rowsum = torch.from_numpy(self.n)
        r = rowsum if rows is None else rowsum[torch.as_tensor(rows)]
        B /= P
        B -= (r / (P * V))[:, None]
        return B

    def phibar_block(self, rows=None, cols=None) -> Tensor:
        """Phibar[rows][:, cols] (rows = targets, cols = contexts; None: all ids),
        bit-identical. One pass over W's chunks: only the entries in the block are converted."""
        V, P = self.d_vocab, self.n_positions
        pr, nr = _positions(rows, V)
        pc, nc = _positions(cols, V)
        Phi = torch.zeros(nr * nc, dtype=torch.float64)
        for keys, hi, lo in self.context.chunks:
            r, c = pr[keys % V], pc[keys // V]
            keep = np.flatnonzero((r >= 0) & (c >= 0))
            W = (torch.from_numpy(hi[keep]).double()
                 + torch.from_numpy(lo[keep]).double() * 2.0 ** -F)
            Phi[torch.from_numpy(r[keep] * nc + c[keep])] = W
        Phi = Phi.view(nr, nc)
        colsum = self.colsum if cols is None else self.colsum[torch.as_tensor(cols)]
        Phi -= colsum[None, :] / V
        Phi /= P
        return Phi

    # -- blocks of the compositions (column chunks; the cheaper side) ---------------------------
    def sigma_block(self, rows: np.ndarray, cols: np.ndarray) -> Tensor:
        """SigmaB[rows][:, cols] = (C^T[rows] Bbar[:, cols]) / P - (n^T Bbar[:, cols]) / (PV)
        (symmetric: the shorter side is the one multiplied)."""
        if rows.size < cols.size:
            return self.sigma_block(cols, rows).T.contiguous()
        CT = self.CT.take_rows(rows)
        out = torch.empty(rows.size, cols.size, dtype=torch.float64)
        for j0 in range(0, cols.size, CHUNK_COLS):
            J = cols[j0:j0 + CHUNK_COLS]
            out[:, j0:j0 + J.size] = torch.from_numpy(
                self.bt_mul(self.bbar_block(None, J).numpy(), CT))
        return out

    def phibt_block(self, rows: np.ndarray, cols: np.ndarray) -> Tensor:
        """PhiBT[rows][:, cols] = (P^2 Bbar Phibar[:, rows])[cols]^T / P^2 (rows = context a)."""
        P = float(self.n_positions)
        out = torch.empty(rows.size, cols.size, dtype=torch.float64)
        for i0 in range(0, rows.size, CHUNK_COLS):
            A = rows[i0:i0 + CHUNK_COLS]
            out[i0:i0 + A.size] = torch.from_numpy(self.bphi(A)[cols].T / (P * P))
        return out

    def gbar_block(self, rows: np.ndarray, cols: np.ndarray) -> Tensor:
        """Gbar[rows][:, cols]: by columns (C^T[rows] Y - (n^T Y) / V) / P^3 with
        Y = P^2 Bbar Phibar[:, cols]; with fewer rows than columns by rows, as
        (Phibar^T SigmaB[:, rows])^T."""
        P, V = float(self.n_positions), self.d_vocab
        if rows.size < cols.size:
            S = self.sigma_block(np.arange(V), rows).numpy()
            return torch.from_numpy(np.ascontiguousarray(self.phi_t_mul(S)[cols].T))
        CT = self.CT.take_rows(rows)
        out = torch.empty(rows.size, cols.size, dtype=torch.float64)
        for j0 in range(0, cols.size, CHUNK_COLS):
            J = cols[j0:j0 + CHUNK_COLS]
            Y = self.bphi(J)
            out[:, j0:j0 + J.size] = torch.from_numpy(CT.matmul(Y, v=(self.n @ Y) / V,
                                                                scale=P ** -3))
        return out

    def gbar_head_block(self, rows: np.ndarray, cols: np.ndarray) -> Tensor:
        """GbarHead[rows][:, cols]: by columns from :meth:`gbar_head_tile`; with fewer rows
        than columns by rows, as (GbarHead^T[:, rows])^T = (Bbar Phibar Bbar[:, rows])^T."""
        if rows.size < cols.size:
            Y = self.b_mul(self.phi_mul(self.bbar_block(None, rows).numpy()))
            return torch.from_numpy(np.ascontiguousarray(Y[cols].T))
        out = torch.empty(rows.size, cols.size, dtype=torch.float64)
        for j0 in range(0, cols.size, CHUNK_COLS):
            J = cols[j0:j0 + CHUNK_COLS]
            out[:, j0:j0 + J.size] = torch.from_numpy(self.gbar_head_tile(J)[:, rows].T)
        return out

    # -- products with a dense X [V, d], never forming a V x V matrix -------------------------
    def mul(self, name: str, X: np.ndarray) -> np.ndarray:
        """``name`` @ X for Bbar, Phibar, SigmaB, PhiBT, Gbar, GbarHead (X: [V, d] float64)."""
        ops = {"Bbar": lambda Z: self.b_mul(Z), "Phibar": lambda Z: self.phi_mul(Z),
               "SigmaB": lambda Z: self.bt_mul(self.b_mul(Z)),
               "PhiBT": lambda Z: self.phi_t_mul(self.bt_mul(Z)),
               "Gbar": lambda Z: self.bt_mul(self.b_mul(self.phi_mul(Z))),
               "GbarHead": lambda Z: self.bt_mul(self.phi_t_mul(self.bt_mul(Z)))}
        return _chunked(ops[name], X)

    def t_mul(self, name: str, X: np.ndarray) -> np.ndarray:
        """``name``^T @ X (so X^T ``name`` = its transpose)."""
        ops = {"Bbar": lambda Z: self.bt_mul(Z), "Phibar": lambda Z: self.phi_t_mul(Z),
               "SigmaB": lambda Z: self.bt_mul(self.b_mul(Z)),
               "PhiBT": lambda Z: self.b_mul(self.phi_mul(Z)),
               "Gbar": lambda Z: self.phi_t_mul(self.bt_mul(self.b_mul(Z))),
               "GbarHead": lambda Z: self.b_mul(self.phi_mul(self.b_mul(Z)))}
        return _chunked(ops[name], X)


@dataclass
class SparseQ:
    """Qbar where it is non-zero, by key (column): CSC over ``side`` key positions, the query
    positions of each key ascending (int32) and the values (float64, already / P)."""

    side: int
    indptr: np.ndarray
    rows: np.ndarray
    vals: np.ndarray

    @classmethod
    def from_dense(cls, Q: Tensor) -> SparseQ:
        """The non-zero entries of a dense Qbar [side, side] (the dense engine)."""
        QT = Q.T.contiguous().numpy()  # [key, query]
        side = QT.shape[0]
        keys, queries = np.nonzero(QT)
        indptr = np.searchsorted(keys, np.arange(side + 1)).astype(np.int64)
        return cls(side, indptr, queries.astype(np.int32), QT[keys, queries].astype(np.float64))

    @property
    def nnz(self) -> int:
        return int(self.vals.size)

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.rows.nbytes + self.vals.nbytes

    def csc(self) -> scipy.sparse.csc_matrix:
        return scipy.sparse.csc_matrix((self.vals, self.rows, self.indptr),
                                       shape=(self.side, self.side))

    def block(self, rows: np.ndarray | None, cols: np.ndarray | None) -> Tensor:
        """Dense Qbar[rows][:, cols] (positions; None: all)."""
        cols_ = np.arange(self.side) if cols is None else cols
        pr, nr = _positions(rows, self.side)
        starts, counts = self.indptr[cols_], np.diff(self.indptr)[cols_]
        idx = ranges(starts, counts)
        c = np.repeat(np.arange(cols_.size), counts)
        r = pr[self.rows[idx]]
        keep = r >= 0
        out = torch.zeros(nr * cols_.size, dtype=torch.float64)
        out[torch.from_numpy(r[keep] * cols_.size + c[keep])] = torch.from_numpy(
            self.vals[idx][keep])
        return out.view(nr, cols_.size)

    def mul(self, X: np.ndarray) -> np.ndarray:
        """Qbar @ X."""
        return np.asarray(self.csc() @ X)

    def t_mul(self, X: np.ndarray) -> np.ndarray:
        """Qbar^T @ X."""
        return np.asarray(self.csc().T @ X)


def _chunked(op, X: np.ndarray) -> np.ndarray:
    """``op`` over column chunks of X (each a [V, <= CHUNK_COLS] dense intermediate)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.shape[1] <= CHUNK_COLS:
        return op(X)
    return np.concatenate([op(np.ascontiguousarray(X[:, j:j + CHUNK_COLS]))
                           for j in range(0, X.shape[1], CHUNK_COLS)], axis=1)


def _positions(ids, V: int) -> tuple[np.ndarray, int]:
    """(where each id sits in ``ids`` or -1, len(ids)); None = every id in order."""
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
