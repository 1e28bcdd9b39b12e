"""The sparse engine: counts where the corpus has them, Gbar by column tiles, pass 2 tile by
tile (host memory that grows with the corpus, not with V^2; CPU, C kernels).

Pass 1 is ``count.SparseCountAccumulator`` (the dense engine's integers, stored sparsely).
Ranks exchange their sparse counts and merge them exactly. Pass 2 needs every position for
every Gbar tile, so each rank loads the windows of its shards and all ranks share them (4 B per
token); tile i is swept by rank i % world, the per-position sums S are added across ranks, each
rank subtracts the centring term in its own tiles and in Delta for its block of sequences,
Delta is summed and the tiles' Qbar entries are gathered. A pass-2 checkpoint (S, the partial
Delta, the pairs of every tile done) is written every CHECKPOINT_SECONDS and after the last
tile; a killed run resumes at the next tile with the same bits. The result is factored (C, W,
vectors, Qbar on the pairs that occur): never a V x V matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import MismatchError
from pythia_probe.planner import statistics as engine_plan
from pythia_probe.ranks import Ranks
from pythia_probe.stats import kept, native, reduce
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.engine import Engine, check_positions, divided
from pythia_probe.stats.factors import SparseQ
from pythia_probe.stats.groups import split_rows, sum_q
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.pass1 import bar
from pythia_probe.stats.result import CorpusStats, stats_meta
from pythia_probe.stats.sparse import first, second
from pythia_probe.stats.sparse.count import SparseCountAccumulator
from pythia_probe.stats.stores import FactoredStore

CHECKPOINT_SECONDS = 300.0
"""A pass-2 checkpoint at most this often (and after the last tile)."""
SUMS = ("S", "Delta", "Dc")
TARGETS = ("Qbar", "QbarHead")
"""What pass 2 accumulates: Qbar (with Gbar) and QbarHead (with GbarHead), per group."""
KIND = "sparse_q2h"


class SparseEngine(Engine):
    name = "sparse"
    counts_kind = SparseCountAccumulator.kind

    def counter(self, d_vocab: int, T: int, device) -> SparseCountAccumulator:
        return SparseCountAccumulator(d_vocab, T, device)

    def restore_counts(self, tensors, state, device) -> SparseCountAccumulator:
        return SparseCountAccumulator.from_state(tensors, state, device)

    def reduce_counts(self, d: Ranks, acc: SparseCountAccumulator) -> SparseCountAccumulator:
        """Exact sum of the ranks' sparse counts; every rank gets the total and the ledger."""
        if d.world == 1:
            return acc
        parts = reduce.gather(d, acc.state())
        total = SparseCountAccumulator.from_state(*parts[0])
        for tensors, meta in parts[1:]:
            total.merge(SparseCountAccumulator.from_state(tensors, meta))
        total.ledger = sorted(total.ledger, key=lambda e: e["index"])
        return total

    def first_pass(self, acc: SparseCountAccumulator, spec, d: Ranks) -> first.SparseFirstPass:
        sparsecount.require()
        return first.first_pass(acc)

    def second_pass(self, fp: first.SparseFirstPass, windows, ids: Tensor | None, spec,
                    d: Ranks) -> tuple[dict[str, SparseQ], Tensor, list | None]:
        """Every rank's windows, tiles split over the ranks, resuming this rank's tiles:
        ({"Qbar", "QbarHead"} sums on the pairs that occur, Delta sum, and with groups each
        group's such sums: the totals are their sums) over every rank. Each tile's Gbar and
        GbarHead columns are composed once for all the groups."""
        tokens, lengths, groups = _gather_windows(d, windows, spec.policy.seq_len + 1)
        check_positions(int((lengths - 1).sum()), fp.n_positions)
        width = engine_plan.tile_width(fp.d_vocab, spec.budget_bytes)
        rows = second.QRows.of(ids, fp.d_vocab)
        tile_of, ctx = _tiles(fp, ids, rows, spec)
        sweeps: list[second.Sweep] = []
        for sel in split_rows(groups, spec.groups):
            t, n = (tokens, lengths) if sel is None else (tokens[sel], lengths[sel])
            t, n = np.ascontiguousarray(t), np.ascontiguousarray(n)
            for target in TARGETS:
                sweeps.append(second.Sweep(fp, t, n, rows, width, sweeps[-1] if sweeps else None,
                                           target, ctx))
        ckpt = Checkpoint(_path(spec, d), _identity(spec, fp, width, ids),
                          seconds=CHECKPOINT_SECONDS)
        sums = _resume(ckpt, len(sweeps)) or [second.TileSums.zeros(s.tokens.shape[0], fp.T)
                                              for s in sweeps]
        tiles = sweeps[0].groups
        todo = [i for i in range(len(tiles)) if i % d.world == d.rank]
        shown = bar(spec, "statistics pass 2", d, unit="tile", total=len(todo))
        shown.update(len(set(todo) & set(sums[0].parts)))
        second.sweep_tiles(sweeps, todo, sums,
                           after_tile=lambda s: (shown.update(1), ckpt.tick(lambda: _state(s))),
                           tile_of=tile_of)
        ckpt.save(*_state(sums))
        shown.close()
        out = []
        for sweep, s in zip(sweeps, sums, strict=True):
            reduce.sum_(d, s.S)  # complete S on every rank (after the last checkpoint)
            n = sweep.tokens.shape[0]
            parts, D = second.finish(sweep, s, (n * d.rank // d.world,
                                                n * (d.rank + 1) // d.world))
            reduce.sum_(d, D)
            parts = {i: p for part in reduce.gather(d, parts) for i, p in part.items()}
            out.append((second.qbar(parts, tiles, rows), torch.from_numpy(D)))
        del sweeps, sums, tokens
        native.release_free_memory()  # the tiles' parts, freed, would stay resident
        per_group = [({t: out[g * len(TARGETS) + j][0] for j, t in enumerate(TARGETS)},
                      out[g * len(TARGETS)][1]) for g in range(len(out) // len(TARGETS))]
        if not spec.groups:
            return per_group[0][0], per_group[0][1], None
        Q = {t: sum_q([q[t] for q, _ in per_group]) for t in TARGETS}
        native.release_free_memory()
        return Q, sum((D for _, D in per_group[1:]), per_group[0][1].clone()), per_group

    def assemble(self, fp: first.SparseFirstPass, Q: SparseQ | dict[str, SparseQ],
                 D: Tensor, meta: dict[str, Any], ids: Tensor | None, spec,
                 groups: list | None = None) -> CorpusStats:
        """The factors, Qbar's and QbarHead's non-zeros and Delta, divided by the positions
        (and each group's counts and sums, as they are)."""
        P = fp.n_positions
        qs = divided(Q, P)
        width = engine_plan.tile_width(fp.d_vocab, getattr(spec, "budget_bytes", None))
        kernel = dict(sparsecount.info(), tile_width=width)
        compose = getattr(spec, "compose", kept.FULL)
        store = FactoredStore(fp.factors, qs["Qbar"], D / P, ids, groups,
                              qbar_head=qs.get("QbarHead"), compose=compose)
        return CorpusStats(store, stats_meta(meta, ids, fp.d_vocab, fp, kernel, compose))


def _tiles(fp: first.SparseFirstPass, ids: Tensor | None, rows: second.QRows, spec
           ) -> tuple[dict, np.ndarray | None]:
    """Each target's Gc tile (cols -> [len(cols), V]) and the key tokens to tile (None:
    every context token): Gbar's and GbarHead's columns, or over kept ids the K x K
    compositions' (``stats/kept.py``; only the kept context tokens are tiled: a key outside
    K has M = 0)."""
    if getattr(spec, "compose", kept.FULL) != kept.KEPT:
        return {"Qbar": lambda c: first.gc_tile(fp, c),
                "QbarHead": lambda c: first.gc_head_tile(fp, c)}, None
    ids_np = ids.numpy().astype(np.int64)
    G = kept.compositions(fp.factors, ids_np)
    V = fp.d_vocab
    tile_of = {t: (lambda c, g=G[name]: kept.tile(g, V, ids_np, rows.row_of[c]))
               for t, name in zip(TARGETS, ("Gbar", "GbarHead"), strict=True)}
    return tile_of, np.intersect1d(fp.ctx_ids, ids_np)


def _gather_windows(d: Ranks, windows, L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's windows, in rank order, on every rank (pass-2 layout: int32 tokens,
    padding 0; int64 lengths; each window's group, -1 without groups): each Gbar tile sweeps
    them all."""
    toks, lens = [np.zeros((0, L), dtype=np.int32)], [np.zeros(0, dtype=np.int64)]
    grps = [np.zeros(0, dtype=np.int64)]
    for unit in windows.units:
        cache = windows.load(unit)
        x, n = second.pass2_tokens(cache["tokens"], cache["lengths"])
        toks.append(x)
        lens.append(n)
        g = cache.get("groups")
        grps.append(np.full(n.size, -1, dtype=np.int64) if g is None else g.numpy())
    parts = reduce.gather(d, (np.concatenate(toks), np.concatenate(lens), np.concatenate(grps)))
    return tuple(np.ascontiguousarray(np.concatenate([p[i] for p in parts])) for i in range(3))


def _path(spec, d: Ranks):
    if spec.work_dir is None:
        return None
    return spec.work_dir / f"pass2-sparse-rank{d.rank}-of{d.world}.safetensors"


def _identity(spec, fp: first.SparseFirstPass, width: int, ids: Tensor | None) -> dict:
    return dict(spec.identity, checksum=fp.checksum, tile_width=width,
                ids=None if ids is None else ids.tolist(),
                compose=getattr(spec, "compose", kept.FULL))


def _state(sums: list[second.TileSums]) -> tuple[dict[str, Tensor], dict[str, Any]]:
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


def _resume(ckpt: Checkpoint, n_parts: int) -> list[second.TileSums] | None:
    found = ckpt.load()
    if found is None:
        return None
    tensors, state = found
    if state.get("kind") != KIND or state.get("parts") != n_parts:
        raise MismatchError(f"{ckpt.path} is a pass-2 checkpoint of an older version; delete "
                            "it to run pass 2 again")
    out = []
    for g in range(n_parts):
        sums = second.TileSums(*(tensors[f"{k}.{g}"].numpy() for k in SUMS))  # owned
        for i in state["done"]:
            sums.parts[i] = second.TilePart(tensors[f"flat.{g}.{i}"].numpy(),
                                            tensors[f"vals.{g}.{i}"].numpy())
        out.append(sums)
    return out
