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

from pythia_probe.errors import MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.stats import reduce
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.dense.count import CountAccumulator
from pythia_probe.stats.dense.first import FirstPass, first_pass
from pythia_probe.stats.dense.second import QAccumulator
from pythia_probe.stats.engine import Engine, check_positions
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.groups import split_rows
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
                    d: Ranks) -> tuple[SparseQ, Tensor, list | None]:
        """Qbar and Delta over this rank's windows unit by unit, resuming; summed over ranks
        (Qbar as its non-zero entries). With groups one accumulator per group (sharing Gbar):
        also each group's (Qbar, Delta) sums, and the totals are their sums."""
        dev = torch.device(d.device)
        qs: list[QAccumulator] = []
        for _ in range(spec.groups or 1):
            qs.append(QAccumulator(fp.Gbar, spec.policy.seq_len, ids, device=dev,
                                   shared=qs[0] if qs else None))
        ckpt = Checkpoint(_path(spec, d), _identity(spec, fp), every=spec.checkpoint_every)
        if (found := ckpt.load()) is not None:
            _load(qs, *found)
        done = {e["shard"] for e in qs[0].ledger}
        shown = bar(spec, "statistics pass 2", d)
        for unit in windows.units:
            if unit["shard"] in done:
                continue
            cache = windows.load(unit)
            tokens, lengths = cache["tokens"].to(torch.int64), cache["lengths"]
            for q, sel in zip(qs, split_rows(cache.get("groups"), spec.groups), strict=True):
                if sel is not None:
                    sel = torch.from_numpy(sel)
                t, n = (tokens, lengths) if sel is None else (tokens[sel], lengths[sel])
                for start in range(0, n.numel(), spec.batch_size):
                    sl = slice(start, start + spec.batch_size)
                    q.update(t[sl], n[sl])
                    shown.update(int(n[sl].sum()))
            qs[0].ledger.append({"shard": unit["shard"], "index": unit["index"]})
            ckpt.tick(lambda: _state(qs))
        ckpt.save(*_state(qs))
        shown.close()
        qs[0].Gc = None  # type: ignore[assignment]  # frees 20 GB of device memory at 50,304
        for q in qs:
            q.Gc = None  # type: ignore[assignment]
            reduce.sum_(d, q.Qbar)
            reduce.sum_(d, q.Delta)
        n_pos = sum(q.n_positions for q in qs)
        check_positions(reduce.total(d, n_pos)[0], fp.n_positions)
        if not spec.groups:
            return SparseQ.from_dense(qs[0].qbar_sum().cpu()), qs[0].Delta.cpu(), None
        parts = [(SparseQ.from_dense(q.qbar_sum().cpu()), q.Delta.cpu()) for q in qs]
        total = sum((q.qbar_sum() for q in qs[1:]), qs[0].qbar_sum().clone())
        D = sum((q.Delta for q in qs[1:]), qs[0].Delta.clone())
        return SparseQ.from_dense(total.cpu()), D.cpu(), parts

    def assemble(self, fp: FirstPass, Q: SparseQ, D: Tensor, meta: dict[str, Any],
                 ids: Tensor | None, spec, groups: list | None = None) -> CorpusStats:
        """The factors of pass 1, Qbar's non-zeros and Delta, divided by the positions (the
        same statistics file as the sparse engine's; each group's counts and sums as they
        are)."""
        P = fp.n_positions
        Q.vals /= P
        kernel = dict(fastcount.info(), device=fp.Gbar.device.type)
        store = FactoredStore(fp.factors, Q, D.double() / P, ids, groups)
        return CorpusStats(store, stats_meta(meta, ids, fp.factors.d_vocab, fp, kernel))


def _path(spec, d: Ranks):
    if spec.work_dir is None:
        return None
    return spec.work_dir / f"pass2-rank{d.rank}-of{d.world}.safetensors"


def _state(qs: list[QAccumulator]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """One pass-2 checkpoint of every group's accumulator (the first's ledger: units done)."""
    if len(qs) == 1:
        return qs[0].state()
    tensors, meta = qs[0].state()
    for g, q in enumerate(qs[1:], 1):
        t, m = q.state()
        tensors.update({f"{k}.{g}": v for k, v in t.items()})
        meta[f"n_positions.{g}"] = m["n_positions"]
    return tensors, dict(meta, parts=len(qs))


def _load(qs: list[QAccumulator], tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    if meta.get("parts", 1) != len(qs):
        raise MismatchError("the pass-2 checkpoint has another number of groups; delete it to "
                            "run pass 2 again")
    qs[0].load_state(tensors, meta)
    for g, q in enumerate(qs[1:], 1):
        q.load_state({k: tensors[f"{k}.{g}"] for k in ("Qbar_sum", "Delta_sum")},
                     dict(meta, n_positions=meta[f"n_positions.{g}"], ledger=[]))


def _identity(spec, fp: FirstPass) -> dict[str, Any]:
    return dict(spec.identity, checksum=fp.checksum)
