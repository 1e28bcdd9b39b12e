"""The dense engine: V x V tensors on any device (torch kernels; pass-1 context counts in C on
the CPU when built). Fast at small vocabularies; its memory is planned in ``stats/plan.py``
(5-7 V x V float64 on the host, 3 on a GPU) and in ``stats/MEMORY.md``.

Pass 1 is ``count.CountAccumulator``, the first pass ``first.first_pass`` (Bbar, Phibar,
SigmaB, Gbar: pass 2 needs all of Gbar), pass 2 ``second.QAccumulator`` shard by shard (Qbar
is accumulated there). The statistics it returns are factored like the sparse engine's: the
non-zero pass-1 counts, Qbar's non-zero entries and Delta.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pythia_probe.ranks import Ranks
from pythia_probe.stats import reduce
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.dense.count import CountAccumulator
from pythia_probe.stats.dense.first import FirstPass, first_pass
from pythia_probe.stats.dense.second import QAccumulator
from pythia_probe.stats.engine import Engine, check_positions
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.native import fastcount
from pythia_probe.stats.pass1 import bar
from pythia_probe.stats.result import CorpusStats, stats_meta
from pythia_probe.stats.stores import FactoredStore


class DenseEngine(Engine):
    name = "dense"
    counts_kind = CountAccumulator.kind

    def counter(self, d_vocab: int, T: int, device) -> CountAccumulator:
        return CountAccumulator(d_vocab, T, device)

    def restore_counts(self, tensors, state, device) -> CountAccumulator:
        return CountAccumulator.from_state(tensors, state, device)

    def reduce_counts(self, d: Ranks, acc: CountAccumulator) -> CountAccumulator:
        """Sum the limbs over ranks in place (exact integers); every rank gets the total."""
        if d.world == 1:
            return acc
        acc.context.normalize()
        for t in (acc.token_counts, acc.bigram, acc.context.hi, acc.context.lo):
            reduce.sum_(d, t)
        acc.context.normalize()
        acc.n_sequences, acc.n_positions, acc.n_tokens = reduce.total(
            d, acc.n_sequences, acc.n_positions, acc.n_tokens)
        acc.ledger = reduce.merged_ledger(d, acc.ledger)
        return acc

    def first_pass(self, acc: CountAccumulator, spec, d: Ranks) -> FirstPass:
        acc.context.normalize()
        factors = Factors.from_dense(acc.d_vocab, acc.n_positions, acc.token_counts,
                                     acc.bigram, acc.context.hi, acc.context.lo)
        fp = first_pass(acc, consume=True, device=torch.device(d.device),
                        budget_bytes=spec.budget_bytes)
        fp.factors = factors
        fp.Gbar = reduce.broadcast_(d, fp.Gbar)  # rank 0's bits on every rank
        fp.SigmaB = fp.Phibar = fp.Bbar = None  # the factors hold them: only Gbar is needed
        return fp

    def second_pass(self, fp: FirstPass, windows, ids: Tensor | None, spec,
                    d: Ranks) -> tuple[SparseQ, Tensor]:
        """Qbar and Delta over this rank's windows unit by unit, resuming; summed over ranks
        (Qbar as its non-zero entries)."""
        dev = torch.device(d.device)
        q = QAccumulator(fp.Gbar, spec.policy.seq_len, ids, device=dev)
        ckpt = Checkpoint(_path(spec, d), _identity(spec, fp), every=spec.checkpoint_every)
        if (found := ckpt.load()) is not None:
            q.load_state(*found)
        done = {e["shard"] for e in q.ledger}
        shown = bar(spec, "statistics pass 2", d)
        for unit in windows.units:
            if unit["shard"] in done:
                continue
            cache = windows.load(unit)
            tokens, lengths = cache["tokens"].to(torch.int64), cache["lengths"]
            for start in range(0, lengths.numel(), spec.batch_size):
                sl = slice(start, start + spec.batch_size)
                q.update(tokens[sl], lengths[sl])
                shown.update(int(lengths[sl].sum()))
            q.ledger.append({"shard": unit["shard"], "index": unit["index"]})
            ckpt.tick(q.state)
        ckpt.save(*q.state())
        shown.close()
        q.Gc = None  # type: ignore[assignment]  # frees 20 GB of device memory at 50,304
        reduce.sum_(d, q.Qbar)
        reduce.sum_(d, q.Delta)
        check_positions(reduce.total(d, q.n_positions)[0], fp.n_positions)
        return SparseQ.from_dense(q.qbar_sum().cpu()), q.Delta.cpu()

    def assemble(self, fp: FirstPass, Q: SparseQ, D: Tensor, meta: dict[str, Any],
                 ids: Tensor | None, spec) -> CorpusStats:
        """The factors of pass 1, Qbar's non-zeros and Delta, divided by the positions (the
        same statistics file as the sparse engine's)."""
        P = fp.n_positions
        Q.vals /= P
        kernel = dict(fastcount.info(), device=fp.Gbar.device.type)
        store = FactoredStore(fp.factors, Q, D.double() / P, ids)
        return CorpusStats(store, stats_meta(meta, ids, fp.factors.d_vocab, fp, kernel))


def _path(spec, d: Ranks):
    if spec.work_dir is None:
        return None
    return spec.work_dir / f"pass2-rank{d.rank}-of{d.world}.safetensors"


def _identity(spec, fp: FirstPass) -> dict[str, Any]:
    return dict(spec.identity, checksum=fp.checksum)
