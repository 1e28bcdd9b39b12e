"""The sparse engine's first pass: the factors of the final counts (``stats/factors.py``: the
section-6 algebra on C, W and their vectors, never a V x V matrix), and the columns of Gbar
pass 2 needs, one tile at a time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pythia_probe.stats import kept
from pythia_probe.stats.factors import Factors
from pythia_probe.stats.sparse.count import SparseCountAccumulator


@dataclass
class SparseFirstPass:
    """The factors of the final pass-1 counts and the accumulator's identity."""

    factors: Factors
    T: int
    n_sequences: int
    n_tokens: int
    checksum: list[int]

    d_vocab = property(lambda self: self.factors.d_vocab)
    n_positions = property(lambda self: self.factors.n_positions)
    token_counts = property(lambda self: self.factors.token_counts)
    ctx_ids = property(lambda self: self.factors.ctx_ids)

    @property
    def nbytes(self) -> int:
        return self.factors.nbytes


def first_pass(acc: SparseCountAccumulator) -> SparseFirstPass:
    """The factors of the final counts (sharing the accumulator's tables; its pass-1 buffers
    are released)."""
    acc.release_buffers()
    factors = Factors(acc.d_vocab, acc.n_positions, torch.from_numpy(acc.token_counts.copy()),
                      acc.bigram.keys, acc.bigram.counts, acc.context)
    return SparseFirstPass(factors, acc.T, acc.n_sequences, acc.n_tokens, acc.checksum())


def gc_tile(fp: SparseFirstPass, cols: np.ndarray) -> np.ndarray:
    """Gbar[:, cols]^T, contiguous [len(cols), V]: (C^T Y - 1 (n^T Y) / V) / P^3 with
    Y = P^2 Bbar Phibar[:, cols]. Gbar's columns sum to 0 (Bbar's rows do), so the column
    centring of M (Eq. 15's U term) leaves it unchanged: this is pass 2's Gc."""
    f = fp.factors
    P, V = f.n_positions, f.d_vocab
    Y = f.bphi(cols)
    return f.CT.matmul(Y, transposed=True, v=(f.n @ Y) / V, scale=float(P) ** -3)


def gc_head_tile(fp: SparseFirstPass, cols: np.ndarray) -> np.ndarray:
    """GbarHead[:, cols]^T, contiguous [len(cols), V] (``Factors.gbar_head_tile``): pass 2's Gc
    for QbarHead (GbarHead's columns sum to 0, as Gbar's)."""
    return fp.factors.gbar_head_tile(cols)


def tile_sources(fp: SparseFirstPass, ids: Tensor | None, row_of: np.ndarray | None,
                 compose: str | None) -> tuple[dict, np.ndarray | None]:
    """Each target's Gc tile (cols -> [len(cols), V]) and the key tokens to tile (None:
    every context token): Gbar's and GbarHead's columns, or over kept ids the K x K
    compositions' (``stats/kept.py``; only the kept context tokens are tiled: a key outside
    K has M = 0)."""
    if compose != kept.KEPT:
        return {"Qbar": lambda c: gc_tile(fp, c),
                "QbarHead": lambda c: gc_head_tile(fp, c)}, None
    ids_np = ids.numpy().astype(np.int64)
    G = kept.compositions(fp.factors, ids_np)
    V = fp.d_vocab
    tile_of = {t: (lambda c, g=G[name]: kept.tile(g, V, ids_np, row_of[c]))
               for t, name in zip(("Qbar", "QbarHead"), ("Gbar", "GbarHead"), strict=True)}
    return tile_of, np.intersect1d(fp.ctx_ids, ids_np)
