"""The statistics driver: corpus shards -> pass 1 -> Gbar -> pass 2 -> CorpusStats.

The engine (``--engine``) is chosen once (:func:`pythia_probe.stats.sparse_run.resolve`): the
sparse one runs in :mod:`~pythia_probe.stats.sparse_run`, the dense one here. Pass 1 is
:mod:`~pythia_probe.stats.pass1` for both; dense pass 2 reads the cached windows of every
counted shard, resuming from its own checkpoint.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pythia_probe.ranks import Ranks
from pythia_probe.stats import checkpoint, engine, sparse_run
from pythia_probe.stats.accumulate import QAccumulator
from pythia_probe.stats.corpus_stats import CorpusStats
from pythia_probe.stats.dist import reduce_counts, reduce_q, share_gbar
from pythia_probe.stats.pass1 import (
    RunSpec,
    bar,
    cached_windows,
    check_counted,
    count_pass,
    plan_quotas,
    remove_work,
    run_meta,
    spec_identity,
)

__all__ = ["RunSpec", "compute_stats", "remove_work", "spec_identity"]


def compute_stats(shards: list, spec: RunSpec, meta: dict[str, Any],
                  ranks: Ranks | None = None) -> CorpusStats | None:
    """Both passes over ``shards``; returns the stats on rank 0 (None on other ranks).

    ``ranks``: the process group of a multi-process launch (built by the entry point)."""
    d = ranks or Ranks(device=spec.device)
    choice = sparse_run.resolve(spec, d)  # auto: dense when it fits, else sparse
    meta = dict(meta, engine=choice.meta())
    if choice.resolved == "sparse":
        return sparse_run.compute_stats(shards, spec, meta, d)
    spec = replace(spec, engine="dense")
    dev = torch.device(d.device)
    quotas = plan_quotas(shards, spec) if d.world > 1 else None
    mine = [(i, s) for i, s in enumerate(shards) if i % d.world == d.rank]
    acc = reduce_counts(d, count_pass(mine, spec, d, dev, quotas))
    check_counted(acc, spec)
    fp = engine.first_pass(acc, consume=True, device=dev, budget_bytes=spec.budget_bytes)
    fp.Gbar = share_gbar(d, fp.Gbar, dev)
    ids = None if spec.top_k is None else engine.top_k_ids(fp.token_counts, spec.top_k)
    if ids is None and fp.Bbar.shape[0] > engine.EAGER_LIMIT:
        fp.SigmaB = None  # lazy: saves 20 GB of host memory at 50,304 tokens
    entries = {e["shard"]: e for e in acc.ledger}
    q = reduce_q(d, q_pass([(entries[s.name], s) for _, s in mine if s.name in entries], fp,
                           ids, spec, d, dev))
    q.Gc = None  # type: ignore[assignment]  # frees 20 GB of device memory at 50,304 tokens
    if d.rank != 0:
        d.barrier()
        return None
    stats = engine.assemble(fp, q, run_meta(meta, spec, acc.ledger), ids, device=dev,
                            budget_bytes=spec.budget_bytes)
    d.barrier()
    return stats


# -- pass 2 --------------------------------------------------------------------------------
def q_pass(mine: list, fp: engine.FirstPass, ids, spec: RunSpec, d: Ranks,
           dev: torch.device) -> QAccumulator:
    """Pass 2 over the cached windows of this rank's counted shards ((ledger entry, shard)
    pairs), resuming if possible."""
    path = spec.work_dir / f"pass2-rank{d.rank}-of{d.world}.safetensors"
    q = QAccumulator(fp.Gbar, spec.policy.seq_len, ids, device=dev)
    ident = dict(spec.identity, checksum=fp.checksum)
    if path.exists():
        tensors, meta = checkpoint.load_state(path, ident)
        q.load_state(tensors, meta["state"])
    done = {e["shard"] for e in q.ledger}
    bar_ = bar(spec, "statistics pass 2", d)
    since = 0
    for entry, shard in mine:
        if shard.name in done:
            continue
        _q_shard(q, cached_windows(spec, entry, shard), spec, bar_)
        q.ledger.append({"shard": shard.name, "index": entry["index"]})
        since += 1
        if since >= spec.checkpoint_every:
            _save_q(path, q, ident)
            since = 0
    _save_q(path, q, ident)
    bar_.close()
    return q


def _q_shard(q: QAccumulator, cache: dict, spec: RunSpec, bar) -> None:
    tokens, lengths = cache["tokens"].to(torch.int64), cache["lengths"]
    for start in range(0, lengths.numel(), spec.batch_size):
        sl = slice(start, start + spec.batch_size)
        q.update(tokens[sl], lengths[sl])
        bar.update(int(lengths[sl].sum()))


def _save_q(path: Path, q: QAccumulator, ident: dict) -> None:
    tensors, state = q.state()
    checkpoint.save_state(path, tensors, {"identity": ident, "state": state})


