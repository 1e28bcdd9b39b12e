"""Pass 2 of the sparse engine, tile by tile over the context tokens: never a V x V matrix. This
is where the sparse engine accumulates Qbar, in the C kernels ``sc_sweep``, ``sc_centre_tile``
and ``sc_centre`` (``stats/native/_sparsecount.c``; their numpy specification is the tests'
oracle).

Every pair (t, k) of a sequence belongs to the tile of its key (context) token x_k. For a tile,
``first.gc_tile`` gives Gbar[:, tile] (= pass 2's Gc: Gbar's columns sum to 0, so the centring of M
in Eq. 15 changes nothing; QbarHead's sweeps take GbarHead's tile, ``first.gc_head_tile``, whose
columns sum to 0 too; over kept ids, ``kept.tile``) and ``sweep`` visits every occurrence of the
tile's tokens and every t >= k: M = Gc[y_t, x_k] is added to S_t, M / (t+1) to Delta[t - k] and to
the tile's Qbar block B[x_k, x_t] (a dense [width, side] array, a bitmap marks where a pair landed).
The marked entries are kept (:class:`TilePart`: the pairs that occur, nothing else) and the block is
cleared for the next tile. Q = M / (t+1) - S_t / (t+1)^2 (Eq. 16) needs S_t = sum_{k<=t} M[t, k]
over every tile, so once all tiles are done the centring term S_t / (t+1)^2 is subtracted on the
same pairs, tile by tile again (no Gbar needed: ``centre_tile``), and from Delta[r] (r <= t). Delta
is a small difference of these two large sums: both are compensated (Neumaier) sums. Memory: one
Gbar tile and one block at a time, the pairs that occur (12 B each), the windows of the whole corpus
(4 B per token, 28 B per position with S and the occurrence order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.stats import kept
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.factors import SparseQ
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


@dataclass
class TilePart:
    """The Qbar entries of one tile's keys on the pairs that occur: ``flat`` = place of the key
    in the tile x side + the query's row (ascending), ``vals`` the sums so far (12 B a pair)."""

    flat: np.ndarray
    vals: np.ndarray


@dataclass
class TileSums:
    """Pass-2 partial sums over the tiles done so far (what a pass-2 checkpoint holds)."""

    S: np.ndarray
    """Per-position sums of M, [n * T]."""
    Delta: np.ndarray
    Dc: np.ndarray
    """Compensation of the Delta sum (Delta + Dc is the sum)."""
    parts: dict[int, TilePart] = field(default_factory=dict)
    """The tiles done, by tile number."""

    @property
    def done(self) -> list[int]:
        return sorted(self.parts)

    @classmethod
    def zeros(cls, n: int, T: int) -> TileSums:
        return cls(np.zeros(n * T), np.zeros(T), np.zeros(T))

    @property
    def nbytes(self) -> int:
        return (self.S.nbytes + sum(p.flat.nbytes + p.vals.nbytes for p in self.parts.values()))


def occurrences(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Context positions s * L + k (k <= length - 2) sorted by token, and their tokens."""
    L = tokens.shape[1]
    flat = np.flatnonzero(np.arange(L)[None, :] < (lengths[:, None] - 1))
    toks = tokens.reshape(-1)[flat]
    order = np.argsort(toks, kind="stable")
    return flat[order], toks[order]


def tiles(ctx_ids: np.ndarray, width: int) -> list[np.ndarray]:
    """Context tokens in consecutive groups of ``width`` (sorted ids)."""
    return [ctx_ids[i:i + width] for i in range(0, ctx_ids.size, width)]


class Sweep:
    """The state shared by the tiles of one pass 2: the occurrences sorted by token, the
    tiles, a token's place in the current tile and one reusable Qbar block. ``target``: the
    statistic it accumulates ('Qbar' or 'QbarHead': which tile of Gc it sweeps with)."""

    def __init__(self, fp: SparseFirstPass, windows: sparsecount.TokenWindows, rows: QRows,
                 width: int, shared: Sweep | None = None, target: str = "Qbar",
                 ctx: np.ndarray | None = None) -> None:
        """``shared``: another sweep (of other windows, or another target) whose occurrences
        (when of the same windows), tiles, block and scratch this one reuses (the groups and
        targets of one pass 2: one block in memory); ``ctx``: the key tokens to tile (default
        every context token; the kept ones when composing over kept ids)."""
        self.fp, self.windows, self.rows = fp, windows, rows
        self.target = target
        if shared is not None and shared.windows.tokens is windows.tokens:
            self.occ, self.occ_tok = shared.occ, shared.occ_tok
        else:
            self.occ, self.occ_tok = occurrences(*windows)
            if ctx is not None:  # only the tiled keys' occurrences (kept ids: not a range)
                mine = np.isin(self.occ_tok, ctx)
                self.occ, self.occ_tok = self.occ[mine], self.occ_tok[mine]
        if shared is not None:
            self.groups, self.col_of = shared.groups, shared.col_of
            self.block, self.touched = shared.block, shared.touched
            return
        self.groups = tiles(fp.ctx_ids if ctx is None else ctx, width)
        self.col_of = np.full(fp.d_vocab, -1, dtype=np.int64)
        self.block = np.zeros(width * rows.side)
        self.touched = np.zeros(sparsecount.bitmap_words(width * rows.side), dtype=np.uint64)

    def tile(self, cols: np.ndarray) -> sparsecount.Tile:
        """The tile of key tokens ``cols`` (their places set in ``col_of``) as the kernels
        read it: their occurrences, and where Qbar's rows live."""
        a = np.searchsorted(self.occ_tok, cols[0], side="left")
        b = np.searchsorted(self.occ_tok, cols[-1], side="right")
        return sparsecount.Tile(self.occ[a:b], self.col_of, self.rows.row_of, self.rows.side,
                                self.rows.dummy)

    def first(self, i: int, sums: TileSums, GcT: np.ndarray | None = None) -> None:
        """Tile i: S, Delta and its Qbar block from its Gbar columns (``GcT``: already
        composed); keep the pairs."""
        cols = self.groups[i]
        GcT = gc_tile(self.fp, cols) if GcT is None else GcT
        self.col_of[cols] = np.arange(cols.size)
        sparsecount.sweep(self.windows, self.tile(cols), GcT, sums, self.block, self.touched)
        self.col_of[cols] = -1
        sums.parts[i] = TilePart(*sparsecount.compact(self.block, self.touched))

    def centre(self, i: int, part: TilePart, S: np.ndarray) -> None:
        """Tile i once S is complete: its centring term subtracted on its pairs."""
        cols = self.groups[i]
        self.col_of[cols] = np.arange(cols.size)
        sparsecount.centre_tile(self.windows, self.tile(cols), S, self.block, part.flat,
                                part.vals)
        self.col_of[cols] = -1


def sweep_tiles(sweeps: list[Sweep], todo: list[int], sums: list[TileSums],
                after_tile=None, tile_of=None) -> list[TileSums]:
    """The first sweep over the tiles ``todo`` not yet done, each tile's Gc columns composed
    once for every sweep of a target (one per group; one tile in memory at a time):
    ``tile_of[target](cols)`` (default: Gbar's, ``gc_tile``); ``after_tile(sums)`` after each
    tile."""
    tile_of = tile_of or {"Qbar": lambda cols: gc_tile(sweeps[0].fp, cols)}
    for i in todo:
        if i not in sums[0].parts:
            for target in dict.fromkeys(s.target for s in sweeps):
                GcT = tile_of[target](sweeps[0].groups[i])
                for sweep, s in zip(sweeps, sums, strict=True):
                    if sweep.target == target:
                        sweep.first(i, s, GcT)
                del GcT
            if after_tile is not None:
                after_tile(sums)
    return sums


def finish(sweep: Sweep, sums: TileSums, seqs: tuple[int, int]) -> tuple[dict[int, TilePart],
                                                                          np.ndarray]:
    """Once S is complete: the centring term in every tile done here and in Delta for the
    sequences ``seqs``; returns (the finished tiles, Delta sum)."""
    for i, part in sums.parts.items():
        sweep.centre(i, part, sums.S)
    sparsecount.centre(sweep.windows, sums, seqs)
    return sums.parts, sums.Delta + sums.Dc


def qbar(parts: dict[int, TilePart], groups: list[np.ndarray], rows: QRows) -> SparseQ:
    """The finished tiles as one Qbar by key: CSC over the statistics' k key positions. Each
    tile's part is released once copied (``parts`` is emptied). At the full vocabulary the
    tiles are consecutive ranges of key ids, so the entries are already in CSC order."""
    side, k = rows.side, rows.k
    nnz = sum(p.flat.size for p in parts.values())
    per_key = np.zeros(k, dtype=np.int64)
    key = None if rows.row_of is None else np.empty(nnz, dtype=np.int64)
    query, val = np.empty(nnz, dtype=np.int32), np.empty(nnz)
    at = 0
    for i in sorted(parts):
        p, cols = parts.pop(i), groups[i]
        n = p.flat.size
        pos = rows.of_tokens(cols)[p.flat // side]
        per_key += np.bincount(pos, minlength=k)[:k]
        if key is not None:
            key[at:at + n] = pos
        query[at:at + n] = p.flat % side
        val[at:at + n] = p.vals
        at += n
    if key is not None:  # a top-k's positions are not in id order
        order = np.lexsort((query, key))
        query, val = query[order], val[order]
    indptr = np.concatenate(([0], np.cumsum(per_key))).astype(np.int64)
    return SparseQ(k, indptr, query, val)


def pass2_tokens(tokens: Tensor, lengths: Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """int32 tokens with padding replaced by 0, and int64 lengths (pass-2 input layout)."""
    L = tokens.shape[1]
    if lengths is None:
        lengths = torch.full((tokens.shape[0],), L, dtype=torch.int64)
    x = tokens.to(torch.int64).masked_fill(torch.arange(L)[None, :] >= lengths[:, None], 0)
    return (np.ascontiguousarray(x.numpy().astype(np.int32)),
            np.ascontiguousarray(lengths.to(torch.int64).numpy()))


CHECKPOINT_SECONDS = 300.0
"""A pass-2 checkpoint at most this often (and after the last tile)."""
SUMS = ("S", "Delta", "Dc")
KIND = "sparse_q2h"
"""A pass-2 checkpoint's kind (one written by an older layout is refused)."""


def checkpoint(spec, d: Ranks, fp: SparseFirstPass, width: int, ids: Tensor | None
               ) -> Checkpoint:
    """This rank's pass-2 checkpoint (none without a work folder), named by what decides its
    sums: the run, the pass-1 checksum, the tile width and the kept ids."""
    path = spec.work_dir and spec.work_dir / f"pass2-sparse-rank{d.rank}-of{d.world}.safetensors"
    identity = dict(spec.identity, checksum=fp.checksum, tile_width=width,
                    ids=None if ids is None else ids.tolist(),
                    compose=getattr(spec, "compose", kept.FULL))
    return Checkpoint(path, identity, seconds=CHECKPOINT_SECONDS)


def state(sums: list[TileSums]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A pass-2 checkpoint: per group and target (Qbar, QbarHead; one group without groups)
    S, Delta and the pairs of every tile done (its places and sums, one tensor each: nothing
    is copied to write them)."""
    tensors = {}
    for g, s in enumerate(sums):
        tensors.update({f"{k}.{g}": torch.from_numpy(getattr(s, k)) for k in SUMS})
        for i, part in s.parts.items():
            tensors[f"flat.{g}.{i}"] = torch.from_numpy(part.flat)
            tensors[f"vals.{g}.{i}"] = torch.from_numpy(part.vals)
    return tensors, {"kind": KIND, "done": sums[0].done, "parts": len(sums)}


def resume(ckpt: Checkpoint, n_parts: int) -> list[TileSums] | None:
    """Each group's and target's sums of a pass-2 checkpoint (None: none written)."""
    found = ckpt.load()
    if found is None:
        return None
    tensors, state = found
    if state.get("kind") != KIND or state.get("parts") != n_parts:
        raise MismatchError(f"{ckpt.path} is a pass-2 checkpoint of an older version; delete "
                            "it to run pass 2 again")
    out = []
    for g in range(n_parts):
        sums = TileSums(*(tensors[f"{k}.{g}"].numpy() for k in SUMS))  # owned
        for i in state["done"]:
            sums.parts[i] = TilePart(tensors[f"flat.{g}.{i}"].numpy(),
                                            tensors[f"vals.{g}.{i}"].numpy())
        out.append(sums)
    return out
