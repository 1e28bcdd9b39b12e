"""The sparse engine: counts where the corpus has them, Gbar by column tiles, pass 2 tile by
tile (host memory that grows with the corpus, not with V^2; CPU, C kernels).

Pass 1 is ``count.SparseCountAccumulator`` (the dense engine's integers, stored sparsely).
Ranks exchange their sparse counts and merge them exactly. Pass 2 needs every position for
every Gbar tile, so each rank loads the windows of its shards and all ranks share them (4 B per
token); tile i is swept by rank i % world, the per-position sums S are added across ranks, each
rank subtracts the centring term of its block of sequences, and Qbar and Delta are summed. A
pass-2 checkpoint (S, the partial Qbar and Delta, the tiles done) is written every
CHECKPOINT_SECONDS and after the last tile; a killed run resumes at the next tile with the same
bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.ranks import Ranks
from pythia_probe.stats import plan, reduce
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.engine import Engine, check_positions
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.pass1 import bar
from pythia_probe.stats.result import CorpusStats, stats_meta, stores_derived
from pythia_probe.stats.sparse import first, second
from pythia_probe.stats.sparse.count import SparseCountAccumulator

CHECKPOINT_SECONDS = 300.0
"""A pass-2 checkpoint at most this often (and after the last tile)."""
SUMS = ("S", "Delta", "Dc", "QAt")


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
                    d: Ranks) -> tuple[Tensor, Tensor]:
        """Every rank's windows, tiles split over the ranks, resuming this rank's tiles."""
        tokens, lengths = _gather_windows(d, windows, spec.policy.seq_len + 1)
        check_positions(int((lengths - 1).sum()), fp.n_positions)
        width = plan.tile_width(fp.d_vocab, spec.budget_bytes)
        rows = second.QRows.of(ids, fp.d_vocab)
        n_tiles = len(second.tiles(fp.ctx_ids, width))
        ckpt = Checkpoint(_path(spec, d), _identity(spec, fp, width, ids),
                          seconds=CHECKPOINT_SECONDS)
        sums = _resume(ckpt) or second.TileSums.zeros(tokens.shape[0], fp.T, rows.side)
        todo = [i for i in range(n_tiles) if i % d.world == d.rank]
        shown = bar(spec, "statistics pass 2", d, unit="tile", total=len(todo))
        shown.update(len(set(todo) & set(sums.done)))
        second.sweep_tiles(fp, tokens, lengths, rows, width, todo, sums,
                           after_tile=lambda s: (shown.update(1), ckpt.tick(lambda: _state(s))))
        ckpt.save(*_state(sums))
        shown.close()
        reduce.sum_(d, sums.S)  # complete S on every rank (after the last checkpoint)
        n = tokens.shape[0]
        Q, D = second.finish(tokens, lengths, rows, sums,
                             (n * d.rank // d.world, n * (d.rank + 1) // d.world))
        reduce.sum_(d, Q)
        reduce.sum_(d, D)
        return second.qbar_sum(Q, rows), torch.from_numpy(D)

    def assemble(self, fp: first.SparseFirstPass, Q: Tensor, D: Tensor, meta: dict[str, Any],
                 ids: Tensor | None, spec) -> CorpusStats:
        """The same tensors as the dense engine's (restricted to ``ids``)."""
        P, V = fp.n_positions, fp.d_vocab
        width = plan.tile_width(V, getattr(spec, "budget_bytes", None))
        t = {"Bbar": first.bbar_block(fp, ids, ids), "Phibar": first.phibar_block(fp, ids, ids),
             "Qbar": Q.div_(P), "Delta": D / P,
             "token_counts": fp.token_counts if ids is None else fp.token_counts[ids]}
        if stores_derived(V, ids is not None):
            t.update(first.compositions(fp, torch.arange(V) if ids is None else ids, width))
        kernel = dict(sparsecount.info(), tile_width=width)
        return CorpusStats(t, stats_meta(meta, ids, V, fp, kernel))


def _gather_windows(d: Ranks, windows, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's windows, in rank order, on every rank (pass-2 layout: int32 tokens,
    padding 0; int64 lengths): each Gbar tile sweeps them all."""
    toks, lens = [np.zeros((0, L), dtype=np.int32)], [np.zeros(0, dtype=np.int64)]
    for unit in windows.units:
        cache = windows.load(unit)
        x, n = second.pass2_tokens(cache["tokens"], cache["lengths"])
        toks.append(x)
        lens.append(n)
    parts = reduce.gather(d, (np.concatenate(toks), np.concatenate(lens)))
    return (np.ascontiguousarray(np.concatenate([p[0] for p in parts])),
            np.ascontiguousarray(np.concatenate([p[1] for p in parts])))


def _path(spec, d: Ranks):
    if spec.work_dir is None:
        return None
    return spec.work_dir / f"pass2-sparse-rank{d.rank}-of{d.world}.safetensors"


def _identity(spec, fp: first.SparseFirstPass, width: int, ids: Tensor | None) -> dict:
    return dict(spec.identity, checksum=fp.checksum, tile_width=width,
                ids=None if ids is None else ids.tolist())


def _state(sums: second.TileSums) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {k: torch.from_numpy(getattr(sums, k)) for k in SUMS}
    return tensors, {"kind": "sparse_q", "done": list(sums.done)}


def _resume(ckpt: Checkpoint) -> second.TileSums | None:
    found = ckpt.load()
    if found is None:
        return None
    tensors, state = found
    return second.TileSums(*(tensors[k].numpy().copy() for k in SUMS), list(state["done"]))
