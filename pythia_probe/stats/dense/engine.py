"""The dense engine: V x V tensors on any device (torch kernels; pass-1 context counts in C on
the CPU when built). Fast at small vocabularies; its memory is planned in ``planner/statistics.py``
(5-7 V x V float64 on the host, 3 on a GPU) and in ``stats/MEMORY.md``.

Pass 1 is ``count.CountAccumulator``, the first pass ``first.first_pass`` (Bbar, Phibar,
SigmaB, Gbar: pass 2 needs all of Gbar; then GbarHead), pass 2 ``second.QAccumulator`` shard by
shard (Qbar and QbarHead are accumulated there; over kept ids with the K x K compositions'
table, ``stats/kept.py``). The statistics it returns are factored like the sparse engine's: the
non-zero pass-1 counts, Qbar's non-zero entries and Delta.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pythia_probe.ranks import Ranks
from pythia_probe.stats import compose, kept, reduce
from pythia_probe.stats.dense import second
from pythia_probe.stats.dense.count import CountAccumulator
from pythia_probe.stats.dense.first import FirstPass, first_pass
from pythia_probe.stats.engine import Engine, check_positions
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.groups import split_rows
from pythia_probe.stats.native import fastcount
from pythia_probe.stats.pass1 import bar


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
        """Bbar, Phibar, SigmaB, Gbar (``first.first_pass``), then GbarHead = Bbar^T PhiBT
        with SigmaB freed first (5 V x V at the peak, as before); over kept ids pass 2 makes
        its own K x K compositions instead."""
        acc.context.normalize()
        factors = Factors.from_dense(acc.d_vocab, acc.n_positions, acc.token_counts,
                                     acc.bigram, acc.context.hi, acc.context.lo)
        dev = torch.device(d.device)
        fp = first_pass(acc, consume=True, device=dev, budget_bytes=spec.budget_bytes)
        fp.factors, fp.device = factors, fp.Gbar.device.type
        fp.SigmaB = None
        if getattr(spec, "compose", kept.FULL) != kept.KEPT:
            kw = {"device": dev, "budget_bytes": spec.budget_bytes, "out_device": fp.Gbar.device}
            fp.GbarHead = reduce.broadcast_(d, compose.g_bar_head(fp.Bbar, fp.Phibar, **kw))
        fp.Gbar = reduce.broadcast_(d, fp.Gbar)  # rank 0's bits on every rank
        fp.Phibar = fp.Bbar = None  # the factors hold them: only Gbar, GbarHead are needed
        return fp

    def second_pass(self, fp: FirstPass, windows, ids: Tensor | None, spec,
                    d: Ranks) -> tuple[dict[str, SparseQ], Tensor, list | None]:
        """Qbar, QbarHead and Delta over this rank's windows unit by unit, resuming; summed
        over ranks (Qbar, QbarHead as their non-zero entries). With groups one accumulator
        per group and target (sharing Gbar, GbarHead): also each group's sums, and the totals
        are their sums."""
        dev = torch.device(d.device)
        qs = _accumulators(fp, ids, spec, dev)
        ckpt = second.checkpoint(spec, d, fp)
        if (found := ckpt.load()) is not None:
            second.load_all(qs, *found)
        done = {e["shard"] for e in qs[0].ledger}
        shown = bar(spec, "statistics pass 2", d)
        G = spec.groups or 1
        for unit in windows.units:
            if unit["shard"] in done:
                continue
            cache = windows.load(unit)
            tokens, lengths = cache["tokens"].to(torch.int64), cache["lengths"]
            for g, sel in enumerate(split_rows(cache.get("groups"), spec.groups)):
                if sel is not None:
                    sel = torch.from_numpy(sel)
                t, n = (tokens, lengths) if sel is None else (tokens[sel], lengths[sel])
                for start in range(0, n.numel(), spec.batch_size):
                    sl = slice(start, start + spec.batch_size)
                    for q in qs[g::G]:
                        q.update(t[sl], n[sl])
                    shown.update(int(n[sl].sum()))
            qs[0].ledger.append({"shard": unit["shard"], "index": unit["index"]})
            ckpt.tick(lambda: second.state(qs))
        ckpt.save(*second.state(qs))
        shown.close()
        for q in qs:
            q.Gc = None  # type: ignore[assignment]  # frees 20 GB of device memory at 50,304
            reduce.sum_(d, q.Qbar)
            reduce.sum_(d, q.Delta)
        n_pos = sum(q.n_positions for q in qs[:G])
        check_positions(reduce.total(d, n_pos)[0], fp.n_positions)
        by_group = [{t: qs[j * G + g] for j, t in enumerate(TARGETS)} for g in range(G)]
        if not spec.groups:
            return ({t: SparseQ.from_dense(q.qbar_sum().cpu()) for t, q in by_group[0].items()},
                    qs[0].Delta.cpu(), None)
        parts = [({t: SparseQ.from_dense(q.qbar_sum().cpu()) for t, q in grp.items()},
                  grp["Qbar"].Delta.cpu()) for grp in by_group]
        totals = {t: SparseQ.from_dense(sum((grp[t].qbar_sum() for grp in by_group[1:]),
                                            by_group[0][t].qbar_sum().clone()).cpu())
                  for t in TARGETS}
        D = sum((grp["Qbar"].Delta for grp in by_group[1:]), by_group[0]["Qbar"].Delta.clone())
        return totals, D.cpu(), parts

    def kernel(self, fp: FirstPass, spec) -> dict[str, Any]:
        return dict(fastcount.info(), device=fp.device or fp.Gbar.device.type)


TARGETS = ("Qbar", "QbarHead")
"""What pass 2 accumulates: Qbar (with Gbar) and QbarHead (with GbarHead)."""


def _accumulators(fp: FirstPass, ids: Tensor | None, spec, dev: torch.device
                  ) -> list[second.QAccumulator]:
    """Pass 2's accumulators, target-major: [Qbar of group 0..G-1, QbarHead of group 0..G-1]
    (one without groups), each target's sharing one Gc. Full Gbar, GbarHead (released once
    centred into the accumulators' Gc: no extra V x V in pass 2), or over kept ids the K x K
    compositions' tables (``kept.centred``)."""
    T, G = spec.policy.seq_len, spec.groups or 1
    is_kept = getattr(spec, "compose", kept.FULL) == kept.KEPT
    comp = kept.compositions(fp.factors, ids.numpy()) if is_kept else None
    V = fp.factors.d_vocab
    qs: list[second.QAccumulator] = []
    for name in ("Gbar", "GbarHead"):
        if is_kept:
            table, remap = kept.centred(comp.pop(name), V), kept.remap(ids, V)
        else:
            table, remap = getattr(fp, name), None
            setattr(fp, name, None)  # centred into the accumulators' Gc, then released
        first = len(qs)
        for g in range(G):
            qs.append(second.QAccumulator(table, T, ids, device=dev, remap=remap,
                                   shared=qs[first] if g else None))
        del table
    return qs
