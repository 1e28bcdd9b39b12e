"""The numpy / scipy twins of ``_sparsecount.c``'s pass-1 kernels and sparse products: what
:mod:`~pythia_probe.stats.native.sparsecount` runs where the library is not built, was refused
on load or ``PYTHIA_PROBE_KERNEL=torch`` (the same integers; the products to float64 rounding).
Arguments as the kernels' bindings take them."""

from __future__ import annotations

import numpy as np
import scipy.sparse
import torch

from pythia_probe.stats.fixedpoint import carry, reduce_equal


def merge(a: tuple[np.ndarray, ...], b: tuple[np.ndarray | None, ...]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two sorted (keys, hi, lo) tables -> their exact sum, canonical (b's hi may be None)."""
    hb = np.zeros_like(b[2]) if b[1] is None else b[1]
    k = np.concatenate([a[0], b[0]])
    order = np.argsort(k, kind="stable")
    keys, hi, lo = reduce_equal(k[order], np.concatenate([a[1], hb])[order],
                                np.concatenate([a[2], b[2]])[order])
    return (keys, *carry(hi, lo))


def pairs(tokens: np.ndarray, lengths: np.ndarray, d_vocab: int, tbits: int,
          out: np.ndarray, head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
          ) -> int:
    """The context-pair codes of a batch into ``out`` (head pairs into the block)."""
    base, y = tokens[:, :-1] * d_vocab, tokens[:, 1:]
    c = 0
    for t in range(tokens.shape[1] - 1):
        rows = lengths - 1 > t
        if not rows.any():
            continue
        block = ((base[rows, : t + 1] + y[rows, t:t + 1]) << tbits) | t
        out[c:c + block.size] = block.reshape(-1)
        c += block.size
    return c if head is None else _to_head(out, c, d_vocab, tbits, *head)


def _to_head(out: np.ndarray, c: int, d_vocab: int, tbits: int, head_of: np.ndarray,
             w: np.ndarray, block: np.ndarray) -> int:
    """Move the codes of head-token pairs out of ``out[:c]`` into the dense block."""
    codes = out[:c]
    keys = codes >> tbits
    H = int(round(block.size ** 0.5))
    hy, ha = head_of[keys % d_vocab], head_of[keys // d_vocab]
    both = (hy >= 0) & (ha >= 0)
    torch.from_numpy(block).index_add_(0, torch.from_numpy(hy[both] * H + ha[both]),
                                       torch.from_numpy(w[codes[both] & ((1 << tbits) - 1)]))
    rest = codes[~both]
    out[:rest.size] = rest
    return rest.size


def drain(block: np.ndarray, head_ids: np.ndarray, d_vocab: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(keys, raw sums) of the head block's non-zero entries in key order; zeroes the block."""
    H = head_ids.size
    bt = block.reshape(H, H).T  # [context, target]
    ha, hy = np.nonzero(bt)
    lo = bt[ha, hy]
    block[:] = 0
    return head_ids[ha] * d_vocab + head_ids[hy], lo


def reduce_sorted(codes: np.ndarray, tbits: int, w: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted pair codes -> unique keys and the summed weights w[t] per key."""
    return reduce_equal(codes >> tbits, w[codes & ((1 << tbits) - 1)])


def spmm(a: tuple[np.ndarray, np.ndarray, np.ndarray], X: np.ndarray, transposed: bool,
         correction, x_transposed: bool) -> np.ndarray:
    """(A @ X - u v^T) * scale by scipy (see ``sparsecount.spmm``)."""
    (indptr, col, val), (u, v, scale) = a, correction
    n_cols = X.shape[1] if x_transposed else X.shape[0]
    A = scipy.sparse.csr_matrix((val, col, indptr), shape=(indptr.size - 1, n_cols))
    out = np.asarray(A @ (X.T if x_transposed else X))
    if v is not None:
        out -= np.outer(np.ones(out.shape[0]) if u is None else u, v)
    if scale != 1.0:
        out *= scale
    return np.ascontiguousarray(out.T) if transposed else out


def spgemm_dense(a: tuple[np.ndarray, np.ndarray, np.ndarray],
                 b: tuple[np.ndarray, np.ndarray, np.ndarray], ncols: int,
                 u: np.ndarray | None, v: np.ndarray | None) -> np.ndarray:
    """A @ B - u v^T as a dense array by scipy (see ``sparsecount.spgemm_dense``)."""
    (ai, ac, av), (bi, bc, bv) = a, b
    B = scipy.sparse.csr_matrix((bv, bc.astype(np.int64), bi), shape=(bi.size - 1, ncols))
    A = scipy.sparse.csr_matrix((av, ac, ai), shape=(ai.size - 1, bi.size - 1))
    H = np.asarray((A @ B).todense())
    if v is not None:
        H -= np.outer(u, v)
    return H
