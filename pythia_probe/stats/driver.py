"""The one statistics driver: corpus shards (or one batch) -> pass 1 -> first pass -> pass 2 ->
CorpusStats, with either engine behind ``stats/engine.py``'s interface.

The driver owns what both engines share: the engine choice (``choose_engine`` of
``planner.statistics``, once, on rank 0 for every rank), the shards each rank takes, pass 1 with
its token caches, ledger, checkpoints and resume (``pass1.py``), the check that something was
counted, the top-k ids (counted in the windows, or by the authors' rule over the documents:
``doctop.py``), the windows pass 2 reads again (checked against the ledger) and the barrier
before rank 0 returns the statistics. :func:`batch_stats` runs the same steps over one batch in
memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.planner import statistics as engine_plan
from pythia_probe.ranks import Ranks
from pythia_probe.stats import doctop, kept
from pythia_probe.stats.dense.engine import DenseEngine
from pythia_probe.stats.engine import Engine, top_k_ids
from pythia_probe.stats.groups import (
    check_groups,
    count_groups,
    docs_per_group,
    empty_groups,
    spilled,
)
from pythia_probe.stats.pass1 import (
    RunSpec,
    Windows,
    check_counted,
    count_pass,
    pass1_path,
    plan_quotas,
    remove_work,
    run_meta,
    spec_identity,
)
from pythia_probe.stats.result import CorpusStats
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse.engine import SparseEngine

__all__ = ["ENGINES", "RunSpec", "batch_stats", "compute_stats", "remove_work",
           "spec_identity"]
log = logging.getLogger(__name__)
ENGINES: dict[str, Engine] = {e.name: e for e in (DenseEngine(), SparseEngine())}


def compute_stats(shards: list, spec: RunSpec, meta: dict[str, Any],
                  ranks: Ranks | None = None) -> CorpusStats | None:
    """Both passes over ``shards``; returns the stats on rank 0 (None on other ranks).

    ``ranks``: the process group of a multi-process launch (built by the entry point)."""
    d = ranks or Ranks(device=spec.device)
    choice = resolve(spec, d)
    engine = ENGINES[choice.resolved]
    meta = dict(meta, engine=choice.meta())
    dev = torch.device(d.device if engine.name == "dense" else "cpu")
    quotas = plan_quotas(shards, spec) if d.world > 1 else None
    mine = [(i, s) for i, s in enumerate(shards) if i % d.world == d.rank]
    acc = engine.reduce_counts(d, count_pass(mine, spec, d, engine, dev, quotas, shards))
    check_counted(acc, spec)
    ledger = list(acc.ledger)
    windows = Windows.of_shards(spec, ledger, mine)
    with spilled(spec.work_dir) as spill:
        parts = count_groups(engine, windows, spec, d, dev, spill) if spec.groups else None
        _say_empty(parts or [], d)
        ids = kept_ids(spec, acc, windows, d)
        spec = dataclasses.replace(spec, compose=spec.compose if ids is not None else kept.FULL)
        fp = engine.first_pass(acc, spec, d)
        del acc  # its pass-1 buffers; the tables live on in fp
        Q, D, sums = engine.second_pass(fp, windows, ids, spec, d)
        if d.rank != 0:
            d.barrier()
            return None
        spill.restore()
    meta = with_groups(run_meta(meta, spec, ledger), parts, sums, ledger)
    stats = engine.assemble(fp, Q, D, meta, ids, spec, parts)
    d.barrier()
    return stats


def _say_empty(parts: list, d: Ranks) -> None:
    """Name, once (rank 0), the groups that hold no counted window."""
    line = empty_groups(parts)
    if line and d.is_main:
        log.warning(line)


def kept_ids(spec: RunSpec, acc, windows: Windows, d: Ranks) -> Tensor | None:
    """The top-k ids (None: the full vocabulary): by the windows' token counts (ties by id),
    or by the authors' rule over the documents (``doctop.py``; None when k >= d_vocab)."""
    if spec.top_k is None:
        return None
    if spec.top_rule == "documents":
        return doctop.top_ids(windows, spec.top_k, spec.d_vocab, d)
    return top_k_ids(torch.as_tensor(acc.token_counts), spec.top_k)


def with_groups(meta: dict[str, Any], parts: list | None, sums: list | None,
                ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """``meta`` with the groups recorded (G, the rule, each group's counts), and each group's
    pass-2 sums (Qbar, QbarHead, Delta) attached to its counts."""
    if not parts:
        return meta
    for part, (q, delta) in zip(parts, sums, strict=True):
        q = q if isinstance(q, dict) else {"Qbar": q}
        part.qbar, part.qbar_head, part.delta = q["Qbar"], q.get("QbarHead"), delta.double()
    docs = docs_per_group(ledger, len(parts))
    return dict(meta, groups={"G": len(parts), "rule": "document ordinal mod G",
                              "counts": [dict(p.counts(), docs=n)
                                         for p, n in zip(parts, docs, strict=True)]})


def batch_stats(tokens: Tensor, d_vocab: int, *, lengths: Tensor | None = None,
                top_k: int | None = None, device: str | torch.device | None = None,
                tokenizer: dict[str, Any] | None = None, engine: str = "dense",
                budget_bytes: int | None = None, groups: int = 0,
                documents: Tensor | None = None, keep=None,
                compose: str = kept.FULL) -> CorpusStats:
    """Both passes, exactly, over one batch [N, T+1] in memory (padding beyond ``lengths``
    ignored), with the dense (default) or the sparse engine; ``groups`` G: row i in the group
    of its document, ``documents[i]`` mod G (default: row i is document i), so the windows of
    one document share a group (packed windows: the document of the first token).
    ``keep``: the kept ids themselves, in order (instead of ``top_k``); ``compose``:
    'full_then_slice' or 'kept' (their compositions over the kept ids only,
    ``stats/kept.py``)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise BadInputError("tokens must be a LongTensor [N, T+1]")
    docs = _documents(documents, tokens.shape[0])
    if engine not in ENGINES:
        raise BadInputError(f"engine {engine!r}; valid: {', '.join(ENGINES)}")
    if keep is not None and top_k is not None:
        raise BadInputError("give top_k or keep (the kept ids), not both")
    kept.check_compose(compose, top_k is not None or keep is not None)
    eng = ENGINES[engine]
    dev = torch.device(device) if device is not None else tokens.device
    dev = dev if engine == "dense" else torch.device("cpu")
    T = tokens.shape[1] - 1
    acc = eng.counter(d_vocab, T, dev).update(tokens, lengths)
    acc.ledger = ledger1 = [{"shard": "batch", "sequences": tokens.shape[0],
                             "sha256": _batch_digest(tokens, lengths)}]
    spec = RunSpec(d_vocab, SequencePolicy(T, short="keep"), None, {}, None, top_k=top_k,
                   device=str(dev), budget_bytes=budget_bytes, progress=False, engine=engine,
                   groups=check_groups(groups), compose=compose)
    d = Ranks(device=str(dev))
    grp = docs % groups if groups else None
    windows = Windows.of_batch(tokens, lengths, grp)
    with spilled(None) as spill:
        parts = count_groups(eng, windows, spec, d, dev, spill) if groups else None
        _say_empty(parts or [], d)
        ids = kept_ids(spec, acc, windows, d) if keep is None else _kept(keep, d_vocab)
        fp = eng.first_pass(acc, spec, d)
        del acc
        Q, D, sums = eng.second_pass(fp, windows, ids, spec, d)
        spill.restore()
    meta = {"T": T, "tokenizer": tokenizer, "ledger": ledger1, "policy": {"kind": "batch"},
            "engine": {"requested": engine, "resolved": engine, "reason": "batch_stats"}}
    ledger = [{"docs": int(docs.max()) + 1 if docs.numel() else 0, "doc_offset": 0}]
    return eng.assemble(fp, Q, D, with_groups(meta, parts, sums, ledger), ids, spec, parts)


def _documents(documents: Tensor | None, n: int) -> Tensor:
    """The document ordinal of each of ``n`` rows (int64, non-decreasing from 0), checked."""
    if documents is None:
        return torch.arange(n)
    docs = torch.as_tensor(documents)
    if docs.dtype.is_floating_point or docs.shape != (n,) or (n and (
            int(docs.min()) < 0 or bool((docs.diff() < 0).any()))):
        raise BadInputError(f"documents must be {n} non-negative, non-decreasing integer "
                            "ordinals (one per row)")
    return docs.to(torch.int64).cpu()


def _kept(keep, d_vocab: int) -> Tensor:
    """Given kept ids: distinct, in 0..d_vocab-1."""
    ids = torch.as_tensor(keep, dtype=torch.int64).reshape(-1).cpu()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= d_vocab or \
            torch.unique(ids).numel() != ids.numel():
        raise BadInputError(f"keep: need distinct ids in 0..{d_vocab - 1}, got {ids.numel()} "
                            "ids")
    return ids


def _batch_digest(tokens: Tensor, lengths: Tensor | None) -> str:
    digest = hashlib.sha256(tokens.cpu().to(torch.int64).numpy().tobytes())
    if lengths is not None:
        digest.update(lengths.cpu().to(torch.int64).numpy().tobytes())
    return digest.hexdigest()


def resolve(spec: RunSpec, d: Ranks) -> engine_plan.EngineChoice:
    """``spec.engine`` resolved once (rank 0 decides for every rank); printed on rank 0. A
    composition over kept ids is refused up front when its K x K matrices cannot fit."""
    if spec.compose == kept.KEPT and spec.top_k is not None and spec.top_k < spec.d_vocab:
        engine_plan.check_kept(spec.top_k, spec.groups)
    shape = engine_plan.StatsShape(spec.d_vocab, spec.policy.seq_len, spec.top_k, spec.max_docs,
                                   spec.groups, spec.budget_bytes)
    choice = engine_plan.choose_engine(spec.engine, shape, spec.device,
                                       checkpoint_kind=checkpoint_kind(pass1_path(spec, d)),
                                       sparse_built=ENGINES["sparse"].available())
    choice = d.gather(choice)[0]
    if choice.resolved == "sparse":
        engine_plan.check_sparse_fits(choice, spec.d_vocab, spec.top_k)
        engine_plan.check_pass2_windows(choice, spec.policy.seq_len, spec.max_docs,
                                        spec.policy.short)
    else:
        engine_plan.check_dense_batches(spec.policy.seq_len, spec.batch_size, spec.device)
    if d.is_main:
        log.info(choice.line())
    return choice


def checkpoint_kind(path) -> str | None:
    """The accumulator kind recorded in a pass-1 checkpoint's header (None: no checkpoint)."""
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["meta"])["state"]["kind"]
    except Exception as e:  # noqa: BLE001 - a corrupt file: the loader will say so
        log.warning("cannot read the engine of %s: %s", path, e)
        return None
