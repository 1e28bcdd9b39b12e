"""Targets at the full vocabulary from the factored statistics: never a V x V matrix.

With the statistics' sparse parts (leading-terms section 6; ``CorpusStats.parts()``): C the
bigram counts (rows = current token), n = C 1, W the context weights (rows = target, columns =
context), w = 1^T W, P the positions, V the vocabulary, Qbar sparse on the pairs that occur,

    Bbar = (C - n 1^T / V) / P,   Phibar = (W - 1 w^T / V) / P,   PhiBT = Phibar^T Bbar^T.

A target T (PhiBT, Qbar, Bbar, Bbar^T, Qbar^T or QbarHead^T) enters a cosine only through
C_T = D T - m 1^T (D = diag(1 / row norms), m = row means of D T), and the scoring needs only
C_T^T X for the stacked bases X [V, k]:

    C_T^T X = T^T (D X) - 1 (m^T X),
    PhiBT^T Y = Bbar (Phibar Y) = (C Z - n (1^T Z) / V) / P,  Z = (W Y - 1 (w^T Y) / V) / P,
    Qbar^T Y,  (Qbar^T)^T Y = Qbar Y  (sparse; QbarHead likewise),
    Bbar^T Y = (C^T Y - 1 (n^T Y) / V) / P,  Bbar Y = (C Y - n (1^T Y)/V)/P

i.e. sparse products (nnz x k) plus vector corrections, on the scoring device in the compute
dtype. What depends on the statistics alone is computed once in float64 (:func:`target_vectors`)
and cached by the statistics' content identity (:func:`cached_vectors`): D and m from the rows
of T (PhiBT's rows are the columns of P^2 Bbar Phibar = C W - n w^T / V), ``trace`` =
||C_T||_F^2, ``total`` = ||C_T^T 1||^2, ``norm`` = ||C_T C_T^T||_F = ||C_T^T C_T||_F, the
last over column blocks of C_T (each built from the parts, then multiplied by C_T^T): about
2 (nnz(W) + nnz(C)) V multiply-adds for PhiBT, nnz(Qbar) V for Qbar, once; and ``null`` (the
chance level's spread, :mod:`pythia_probe.analysis.chance`) from diag(C_T C_T^T) (the row
norms above) and C_T (C_T^T 1) (one sparse product T x more).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from pythia_probe.analysis.basis import GRAM_ROWS, add_gram, mirror
from pythia_probe.analysis.chance import Primitives, vector_terms

NAMES = ("PhiBT", "Qbar", "Bbar", "BbarT", "QbarT", "QbarHeadT")
DENSE = "T"
"""The parts key of a target given as one [V, V] matrix (a top-k or first-format statistics
file's, a hand-built one): the matrix is its own single factor, C_T^T Y one product
(:attr:`FactoredTarget.dense_ct`)."""
#: the sparse statistic behind each target read as a matrix of its own (T = Q or Q^T)
SPARSE = {"Qbar": ("Qbar", False), "QbarT": ("Qbar", True), "QbarHeadT": ("QbarHead", True)}
CPU_TILE = 128  # columns of a dense factor per sparse product on the CPU (Parts.tiled)


def _csr(m: sp.spmatrix, dtype: torch.dtype, device) -> Tensor:
    """A scipy matrix as a torch CSR tensor (checked once here; torch's beta note silenced)."""
    m = sp.csr_matrix(m)
    m.sort_indices()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                       torch.from_numpy(m.indices.astype(np.int64)),
                                       torch.from_numpy(m.data).to(dtype), size=m.shape,
                                       device=device, check_invariants=True)


class Parts:
    """The statistics' sparse parts as torch CSR matrices in ``dtype`` on ``device``, with the
    products every target needs (``rows``: which of C, C^T, W, W^T, Qbar^T to hold)."""

    def __init__(self, parts: Mapping[str, Any], dtype: torch.dtype, device, need: set[str]):
        self.V, self.P = int(parts["full_d_vocab"]), float(parts["positions"])
        self.dtype, self.device = dtype, torch.device(device)
        self.raw = parts  # the host's scipy parts (column blocks of a target, once per stats)
        self.m = {}
        if DENSE in parts:  # scored through FactoredTarget.dense_ct
            return
        vec = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype, device=device)  # noqa: E731
        self.n, self.w = vec(parts["n"]), vec(parts["w"])
        C, W = parts["C"], parts["W"]
        if need & {"PhiBT", "BbarT"}:
            self.m["C"] = _csr(C, dtype, device)
        if "Bbar" in need:
            self.m["CT"] = _csr(C.T, dtype, device)
        if "PhiBT" in need:
            self.m["W"] = _csr(W, dtype, device)
        for name in need & set(SPARSE):  # T^T as CSR: T^T Y is one sparse product
            stat, transposed = SPARSE[name]
            Q = parts[stat]
            self.m[name] = _csr(Q if transposed else Q.T, dtype, device)

    def bbar(self, Y: Tensor) -> Tensor:
        """Bbar Y."""
        out = self.m["C"] @ Y
        out -= torch.outer(self.n, Y.sum(dim=0) / self.V)
        return out.div_(self.P)

    def bbar_t(self, Y: Tensor) -> Tensor:
        """Bbar^T Y."""
        out = self.m["CT"] @ Y
        out -= (self.n @ Y / self.V)[None, :]
        return out.div_(self.P)

    def phibar(self, Y: Tensor) -> Tensor:
        """Phibar Y."""
        out = self.m["W"] @ Y
        out -= (self.w @ Y / self.V)[None, :]
        return out.div_(self.P)

    def t_mul(self, name: str, Y: Tensor) -> Tensor:
        """T^T Y for the target ``name`` (Y [V, k] in this dtype and device)."""
        return self.tiled(lambda J: self.t_mul_tile(name, Y[:, J].contiguous()), Y.shape[1])

    def tiled(self, tile_fn, k: int) -> Tensor:
        """[V, k] from ``tile_fn(J)`` = its columns J, :data:`CPU_TILE` at a time on the CPU.

        A sparse product streams one row of the dense factor per non-zero: a tile's rows
        (128 float32 = 512 B, 25 MB for V = 50,277) stay in the cache where a whole row
        (16 KB at k = 4,098) comes from memory each time, and the corrections then run on
        a cached tile too. Each entry is the same sum as the untiled product's."""
        tile = CPU_TILE if self.device.type == "cpu" else k
        if tile >= k:
            return tile_fn(slice(0, k))
        out = torch.empty(self.V, k, dtype=self.dtype, device=self.device)
        for s in range(0, k, tile):
            out[:, s:s + tile] = tile_fn(slice(s, s + tile))
        return out

    def t_mul_tile(self, name: str, Y: Tensor) -> Tensor:
        """T^T Y for one (contiguous) tile of columns."""
        if name == "PhiBT":
            return self.bbar(self.phibar(Y))
        if name in SPARSE:
            return self.m[name] @ Y
        return self.bbar_t(Y) if name == "Bbar" else self.bbar(Y)


@dataclass(frozen=True)
class Vectors:
    """What a factored target needs of the statistics alone (float64): D, m, the norm and the
    chance terms (``null``: the centred permutation primitives of C_T C_T^T)."""

    scale: Tensor
    mean: Tensor
    norm: float
    trace: float
    total: float
    null: Primitives


@dataclass(frozen=True, eq=False)
class FactoredTarget:
    """A target scored through the statistics' sparse parts (see the module docstring)."""

    name: str
    parts: Parts
    vectors: Vectors
    stats_id: str = ""

    @property
    def d_vocab(self) -> int:
        return self.parts.V

    @property
    def dtype(self) -> torch.dtype:
        return self.parts.dtype

    @property
    def norm(self) -> float:
        return self.vectors.norm

    @property
    def trace(self) -> float:
        return self.vectors.trace

    @property
    def total(self) -> float:
        return self.vectors.total

    @property
    def null_terms(self) -> Primitives:
        return self.vectors.null

    @cached_property
    def dense_ct(self) -> Tensor:
        """C_T^T = (D T - m 1^T)^T of a dense target, formed once in float64 and held in the
        compute dtype on the device: the centred columns themselves, so a low-precision
        product cancels no shared row mean."""
        v, d = self.vectors, self.parts
        C = d.raw[DENSE] * v.scale[:, None] - v.mean[:, None]
        return C.T.to(d.device, d.dtype)

    def ct_t(self, X: Tensor) -> Tensor:
        """C_T^T X = T^T (D X) - 1 (m^T X) (a dense target: :attr:`dense_ct` X)."""
        d = self.parts
        if DENSE in d.raw:
            return self.dense_ct @ X
        scale = self.vectors.scale.to(d.device, d.dtype)[:, None]
        mean = self.vectors.mean.to(d.device, d.dtype)

        def tile(J: slice) -> Tensor:
            out = d.t_mul_tile(self.name, X[:, J] * scale)
            out -= (mean @ X[:, J])[None, :]
            return out

        return d.tiled(tile, X.shape[1])

    def weighted_column_blocks(self, chunk: int = 1024) -> Iterator[tuple[Tensor, Tensor]]:
        """(weights, C_T[:, J]) over the columns of C_T, float64 on the host: the columns the
        corpus never fills (:func:`shared_columns`, all equal) stand once for all of them."""
        p, v = self.parts.raw, self.vectors
        shared = shared_columns(self.name, p)
        cols = np.flatnonzero(~shared)
        if shared.any():
            cols = np.append(cols, np.flatnonzero(shared)[0])
        weight = torch.ones(cols.size, dtype=torch.float64)
        if shared.any():
            weight[-1] = float(shared.sum())
        for s in range(0, cols.size, chunk):
            Tb = torch.from_numpy(_columns(self.name, p, cols[s:s + chunk]))
            yield weight[s:s + chunk], Tb * v.scale[:, None] - v.mean[:, None]

    @cached_property
    def live_rows(self) -> tuple[Tensor, int]:
        """(rows of C_T^T X that can differ, how many equal rows the last one stands for): the
        rows of :func:`shared_columns` (equal columns of C_T, so equal rows of C_T^T X, bit
        for bit: their sparse part is empty) count once, weighted."""
        shared = shared_columns(self.name, self.parts.raw)
        rows = np.flatnonzero(~shared)
        if shared.any():
            rows = np.append(rows, np.flatnonzero(shared)[0])
        return torch.from_numpy(rows).to(self.parts.device), int(shared.sum())

    def grams(self, F: Tensor, edges: Sequence[int], chunk: int = 4096) -> list[Tensor]:
        """(F_i^T C_T)(F_i^T C_T)^T = Z_i^T Z_i, Z_i = C_T^T F_i, for each column group of F,
        one group at a time: row blocks of Z_i's live rows (:attr:`live_rows`) squared in F's
        dtype on the upper block triangle (:func:`~pythia_probe.analysis.basis.add_gram`),
        summed in float64, plus the shared row's square times its count."""
        return [self.gram(self.ct_t(F[:, s:e].to(self.parts.device, self.parts.dtype)), chunk)
                for s, e in zip(edges, edges[1:], strict=False)]

    def gram(self, Z: Tensor, chunk: int = 4096) -> Tensor:
        """Z^T Z (float64) for Z = C_T^T X: its live rows, the shared one times its count."""
        rows, n_shared = self.live_rows
        M = torch.zeros(Z.shape[1], Z.shape[1], dtype=torch.float64, device=Z.device)
        live = rows[:-1] if n_shared else rows
        chunk = max(chunk, GRAM_ROWS)
        for r in range(0, live.numel(), chunk):
            add_gram(M, Z.index_select(0, live[r:r + chunk]))
        if n_shared:
            z = Z[rows[-1]].to(torch.float64)
            M += n_shared * torch.outer(z, z)
        return mirror(M)


def dense_parts(T: Tensor) -> dict[str, Any]:
    """The parts of a target given as one [V, V] matrix T (rows = tokens): T itself, float64
    on the host (:data:`DENSE`)."""
    if T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"a target matrix must be square [V, V], got {tuple(T.shape)}")
    return {"full_d_vocab": T.shape[0], "positions": 1.0,
            DENSE: T.detach().to("cpu", torch.float64)}


def prepare_target(name: str, T: Tensor, *, dtype: torch.dtype = torch.float64,
                   device: str | torch.device = "cpu", chunk: int = 1024) -> FactoredTarget:
    """A target matrix T [V, V] (a hand-built one, a top-k or first-format statistics file's)
    in the factored form: T its own single factor (:func:`dense_parts`), scored in ``dtype``
    on ``device``, its vectors computed now in float64 (``chunk``: columns per block)."""
    p = dense_parts(T)
    return FactoredTarget(name, Parts(p, dtype, device, {name}), target_vectors(name, p, chunk))


# ---- once per statistics (float64) ---------------------------------------------------------
def row_scales(norms: Tensor, sums: Tensor, V: int) -> tuple[Tensor, Tensor]:
    """(scale, mean) of C_T from T's row norms and sums (float64): 1 / norm (0 for a zero
    row) and the row means of rownorm(T)."""
    scale = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), torch.zeros_like(norms))
    return scale, scale * sums / V


def _row_norms_sums(name: str, p: Mapping[str, Any], chunk: int) -> tuple[Tensor, Tensor]:
    """T's row L2 norms and row sums in float64, from the parts."""
    if DENSE in p:
        return torch.linalg.vector_norm(p[DENSE], dim=1), p[DENSE].sum(dim=1)
    V, P = int(p["full_d_vocab"]), float(p["positions"])
    C, n = sp.csr_matrix(p["C"]), np.asarray(p["n"], dtype=np.float64)
    if name in SPARSE:
        Q = _sparse(name, p).tocoo()
        sq = np.bincount(Q.row, Q.data ** 2, minlength=V)
        sums = np.bincount(Q.row, Q.data, minlength=V)
    elif name == "Bbar":
        sq = (np.asarray(C.multiply(C).sum(axis=1)).ravel() - n ** 2 / V) / P ** 2
        sums = np.zeros(V)
    elif name == "BbarT":
        cn = np.asarray(C.multiply(C).sum(axis=0)).ravel()
        sq = (cn - 2 * (C.T @ n) / V + (n @ n) / V ** 2) / P ** 2
        sums = (np.asarray(C.sum(axis=0)).ravel() - n.sum() / V) / P
    else:  # PhiBT: row a = column a of R = C W - n w^T / V, zero where W[:, a] is
        W, w = sp.csc_matrix(p["W"]), np.asarray(p["w"], dtype=np.float64)
        sq = np.zeros(V)
        live = np.flatnonzero(np.diff(W.indptr))
        for s in range(0, live.size, chunk):
            a = live[s:s + chunk]
            R = np.asarray(C @ W[:, a].toarray()) - np.outer(n, w[a] / V)
            sq[a] = (R ** 2).sum(axis=0)
        sq /= P ** 4
        sums = (W.T @ np.asarray(C.sum(axis=0)).ravel() - w * n.sum() / V) / P ** 2
    return torch.from_numpy(np.sqrt(np.clip(sq, 0, None))), torch.from_numpy(sums)


def _t_times(name: str, p: Mapping[str, Any], x: np.ndarray) -> np.ndarray:
    """T x (float64 [V]) from the parts."""
    if DENSE in p:
        return (p[DENSE] @ torch.from_numpy(x)).numpy()
    V, P = int(p["full_d_vocab"]), float(p["positions"])
    n = np.asarray(p["n"], dtype=np.float64)
    if name in SPARSE:
        return _sparse(name, p) @ x
    C = sp.csr_matrix(p["C"])
    if name == "Bbar":
        return (C @ x - n * x.sum() / V) / P
    z = (C.T @ x - (n @ x) / V) / P  # Bbar^T x
    if name == "BbarT":
        return z
    if name == "PhiBT":
        W, w = sp.csr_matrix(p["W"]), np.asarray(p["w"], dtype=np.float64)
        return (W.T @ z - w * z.sum() / V) / P  # Phibar^T (Bbar^T x)
    raise ValueError(f"no product T x for factored target {name!r}; valid: {', '.join(NAMES)}")


def _columns(name: str, p: Mapping[str, Any], cols: np.ndarray) -> np.ndarray:
    """T[:, cols] dense float64 [V, len(cols)] from the parts."""
    if DENSE in p:
        return p[DENSE][:, torch.from_numpy(cols)].numpy()
    V, P = int(p["full_d_vocab"]), float(p["positions"])
    n = np.asarray(p["n"], dtype=np.float64)
    if name in SPARSE:
        return _sparse(name, p)[:, cols].toarray()
    if name == "Bbar":
        return (sp.csc_matrix(p["C"])[:, cols].toarray() - n[:, None] / V) / P
    Brows = (sp.csr_matrix(p["C"])[cols].toarray() - n[cols, None] / V) / P  # Bbar[cols, :]
    if name == "BbarT":
        return Brows.T
    W, w = sp.csr_matrix(p["W"]), np.asarray(p["w"], dtype=np.float64)
    X = Brows.T  # Bbar^T[:, cols]; PhiBT[:, cols] = Phibar^T X
    return (np.asarray(W.T @ X) - np.outer(w, X.sum(axis=0) / V)) / P


def _sparse(name: str, p: dict[str, Any]) -> sp.csc_matrix:
    """The sparse target ``name`` itself (Qbar, Qbar^T or QbarHead^T) from the parts, as CSC:
    converted once and kept in ``p`` (under ``"_csc:<name>"``), since its column blocks and
    shared columns are read many times."""
    key = f"_csc:{name}"
    if key not in p:
        stat, transposed = SPARSE[name]
        if p.get(stat) is None:
            raise ValueError(f"these statistics hold no {stat} (built before it existed): "
                             f"target {name!r} cannot be scored; rebuild the statistics")
        Q = sp.csc_matrix(p[stat])
        p[key] = sp.csc_matrix(Q.T) if transposed else Q
    return p[key]


def shared_columns(name: str, p: Mapping[str, Any]) -> np.ndarray:
    """Columns of T that all equal one vector (the corpus never shows their token in that
    role): zero columns of PhiBT, Bbar^T (no bigram starts there), Qbar and QbarHead (never a
    key) and Qbar^T, QbarHead^T (never a query),
    the columns -n / (V P) of Bbar (no bigram ends there); the zero columns of a dense T."""
    if DENSE in p:
        return (p[DENSE] == 0).all(dim=0).numpy()
    if name in SPARSE:
        return np.diff(_sparse(name, p).indptr) == 0
    if name == "Bbar":
        return np.asarray(sp.csr_matrix(p["C"]).sum(axis=0)).ravel() == 0
    return np.asarray(p["n"]) == 0


def target_vectors(name: str, parts: Mapping[str, Any], chunk: int = 1024) -> Vectors:
    """D, m, ||C_T C_T^T||_F, ||C_T||_F^2, ||C_T^T 1||^2 and the null terms (from
    diag(C_T C_T^T) and C_T (C_T^T 1)) of target ``name`` in float64.

    The norm is ||C_T^T C_T||_F over column blocks C_T[:, J] = D T[:, J] - m 1^T:
    ||C_T^T C_T||_F^2 = sum_J ||C_T^T C_T[:, J]||_F^2, with C_T^T C_T[:, J] =
    T^T (D C_T[:, J]) - 1 (m^T C_T[:, J]); the columns of :func:`shared_columns` (equal
    columns of T, hence of C_T) count once, times their number. Exact: no column is skipped
    that differs from the one standing for it.
    """
    if name not in NAMES and DENSE not in parts:
        raise ValueError(f"no factored target {name!r}; valid: {', '.join(NAMES)}")
    V = int(parts["full_d_vocab"])
    norms, sums = _row_norms_sums(name, parts, chunk)
    scale, mean = row_scales(norms, sums, V)
    diag = scale ** 2 * norms ** 2 - 2 * scale * mean * sums + V * mean ** 2  # diag(C_T C_T^T)
    trace = float(diag.sum())
    target = FactoredTarget(name, Parts(parts, torch.float64, "cpu", {name}),
                            Vectors(scale, mean, 0.0, trace, 0.0, Primitives(*[0.0] * 6)))
    colsum = target.ct_t(torch.ones(V, 1, dtype=torch.float64))[:, 0]  # C_T^T 1
    rowsum = scale * torch.from_numpy(_t_times(name, parts, colsum.numpy())) - mean * colsum.sum()
    shared = shared_columns(name, parts)
    cols = np.flatnonzero(~shared)
    if shared.any():
        cols = np.append(cols, np.flatnonzero(shared)[0])  # stands for all shared columns
    weight = torch.ones(cols.size, dtype=torch.float64)
    weight[-1] = float(shared.sum()) if shared.any() else 1.0
    norm2 = 0.0
    for s in range(0, cols.size, chunk):
        Tb = torch.from_numpy(_columns(name, parts, cols[s:s + chunk]))
        G = target.ct_t(Tb * scale[:, None] - mean[:, None])  # C_T^T C_T[:, J]
        norm2 += float(((G ** 2).sum(dim=0) * weight[s:s + chunk]).sum())
    total = float(colsum @ colsum)
    return Vectors(scale, mean, norm2 ** 0.5, trace, total,
                   vector_terms(diag, rowsum, norm2, total))
