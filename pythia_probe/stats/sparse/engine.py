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

from pythia_probe.planner import statistics as engine_plan
from pythia_probe.ranks import Ranks
from pythia_probe.stats import native, reduce
from pythia_probe.stats.engine import Engine, check_positions
from pythia_probe.stats.factors import SparseQ
from pythia_probe.stats.groups import split_rows, sum_q
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.pass1 import bar
from pythia_probe.stats.sparse import first, second
from pythia_probe.stats.sparse.count import SparseCountAccumulator

TARGETS = ("Qbar", "QbarHead")
"""What pass 2 accumulates: Qbar (with Gbar) and QbarHead (with GbarHead), per group."""


class SparseEngine(Engine):
    name = "sparse"
    counts_kind = SparseCountAccumulator.kind

    def available(self) -> bool:
        return sparsecount.available()

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
        tile_of, ctx = first.tile_sources(fp, ids, rows.row_of, getattr(spec, "compose", None))
        sweeps: list[second.Sweep] = []
        for sel in split_rows(groups, spec.groups):
            t, n = (tokens, lengths) if sel is None else (tokens[sel], lengths[sel])
            w = sparsecount.TokenWindows(np.ascontiguousarray(t), np.ascontiguousarray(n))
            for target in TARGETS:
                sweeps.append(second.Sweep(fp, w, rows, width, sweeps[-1] if sweeps else None,
                                           target, ctx))
        ckpt = second.checkpoint(spec, d, fp, width, ids)
        sums = second.resume(ckpt, len(sweeps)) or [
            second.TileSums.zeros(s.windows.tokens.shape[0], fp.T) for s in sweeps]
        tiles = sweeps[0].groups
        todo = [i for i in range(len(tiles)) if i % d.world == d.rank]
        shown = bar(spec, "statistics pass 2", d, unit="tile", total=len(todo))
        shown.update(len(set(todo) & set(sums[0].parts)))
        def after_tile(s):
            shown.update(1)
            ckpt.tick(lambda: second.state(s))

        second.sweep_tiles(sweeps, todo, sums, after_tile=after_tile, tile_of=tile_of)
        ckpt.save(*second.state(sums))
        shown.close()
        out = []
        for sweep, s in zip(sweeps, sums, strict=True):
            reduce.sum_(d, s.S)  # complete S on every rank (after the last checkpoint)
            n = sweep.windows.tokens.shape[0]
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

    def kernel(self, fp: first.SparseFirstPass, spec) -> dict[str, Any]:
        width = engine_plan.tile_width(fp.d_vocab, getattr(spec, "budget_bytes", None))
        return dict(sparsecount.info(), tile_width=width)


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
