"""The sparse engine end to end: shards -> sparse pass 1 -> tile-by-tile pass 2 -> stats file.

Pass 1 is ``pass1.count_pass`` with a ``SparseCountAccumulator`` (same token cache, ledger,
checkpoints and resume as the dense engine). Ranks then exchange their sparse counts and merge
them exactly. Pass 2 needs every position for every Gbar tile, so each rank loads the cached
windows of its shards and all ranks share them (4 B per token); tile i is swept by rank
i % world, the per-position sums S are added across ranks, each rank subtracts the centring
term of its block of sequences, and Qbar and Delta are summed. A pass-2 checkpoint (S, the
partial Qbar and Delta, the tiles done) is written every CHECKPOINT_SECONDS and after the last
tile; a killed run resumes at the next tile with the same bits. Rank 0 composes the outputs
(``outofcore.compositions``) and writes the file, loadable by ``CorpusStats.load`` as ever.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from pythia_probe import fileio
from pythia_probe.errors import BadInputError
from pythia_probe.ranks import Ranks
from pythia_probe.stats import checkpoint, engine, outofcore, pass1, plan, sparsefast, tilepass
from pythia_probe.stats.corpus_stats import CorpusStats
from pythia_probe.stats.sparse import SparseCountAccumulator

log = logging.getLogger(__name__)
CHECKPOINT_SECONDS = 300.0
"""A pass-2 checkpoint at most this often (and after the last tile)."""


def resolve(spec, d: Ranks) -> plan.EngineChoice:
    """``spec.engine`` resolved once (rank 0 decides for every rank); printed on rank 0."""
    path = spec.work_dir / f"pass1-rank{d.rank}-of{d.world}.safetensors"
    choice = plan.choose_engine(spec.engine, spec.d_vocab, spec.policy.seq_len, spec.top_k,
                                spec.device, checkpoint_kind=checkpoint_kind(path),
                                tile_budget=spec.budget_bytes, docs=spec.max_docs)
    choice = d.gather(choice)[0]
    if choice.resolved == "sparse":
        plan.check_sparse_fits(choice, spec.d_vocab, spec.top_k)
        plan.check_pass2_windows(choice, spec.policy.seq_len, spec.max_docs, spec.policy.short)
    if d.is_main:
        log.info(choice.line())
    return choice


def checkpoint_kind(path: Path) -> str | None:
    """The accumulator kind recorded in a pass-1 checkpoint's header (None: no checkpoint)."""
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["meta"])["state"]["kind"]
    except Exception as e:  # a corrupt file: the loader will say so with its own message
        log.warning("cannot read the engine of %s: %s", path, e)
        return None


def compute_stats(shards: list, spec, meta: dict[str, Any], d: Ranks) -> CorpusStats | None:
    """Both passes of the sparse engine; returns the stats on rank 0 (None on other ranks)."""
    spec = replace(spec, engine="sparse")
    quotas = pass1.plan_quotas(shards, spec) if d.world > 1 else None
    mine = [(i, s) for i, s in enumerate(shards) if i % d.world == d.rank]
    acc = reduce_counts(d, pass1.count_pass(mine, spec, d, torch.device("cpu"), quotas))
    pass1.check_counted(acc, spec)
    fp = outofcore.first_pass(acc)
    ids = None if spec.top_k is None else engine.top_k_ids(fp.token_counts, spec.top_k)
    entries = {e["shard"]: e for e in acc.ledger}
    tokens, lengths = gather_tokens(d, load_tokens(spec, [(entries[s.name], s) for _, s in mine
                                                          if s.name in entries]))
    if int((lengths - 1).sum()) != fp.n_positions:
        raise BadInputError(f"pass 2 holds {int((lengths - 1).sum())} positions, pass 1 "
                            f"counted {fp.n_positions}: the token cache changed")
    width = plan.tile_width(spec.d_vocab, spec.budget_bytes)
    Q, D = tile_pass(fp, tokens, lengths, ids, width, spec, d)
    if d.rank != 0:
        d.barrier()
        return None
    stats = assemble(fp, Q, D, pass1.run_meta(meta, spec, acc.ledger), ids, width)
    d.barrier()
    return stats


def reduce_counts(d: Ranks, acc: SparseCountAccumulator) -> SparseCountAccumulator:
    """Exact sum of the ranks' sparse counts; every rank gets the total and the ledger."""
    if d.world == 1:
        return acc
    parts = d.gather(acc.state())
    total = SparseCountAccumulator.from_state(*parts[0])
    for tensors, meta in parts[1:]:
        total.merge(SparseCountAccumulator.from_state(tensors, meta))
    total.ledger = sorted(total.ledger, key=lambda e: e["index"])
    return total


def load_tokens(spec, shards: list) -> tuple[np.ndarray, np.ndarray]:
    """The checked cached windows of ``shards`` ((ledger entry, shard) pairs; pass-2 layout:
    int32, padding 0; int64 lengths)."""
    T1 = spec.policy.seq_len + 1
    toks, lens = [np.zeros((0, T1), dtype=np.int32)], [np.zeros(0, dtype=np.int64)]
    for entry, shard in shards:
        cache = pass1.cached_windows(spec, entry, shard)
        x, n = tilepass.pass2_tokens(cache["tokens"], cache["lengths"])
        toks.append(x)
        lens.append(n)
    return np.concatenate(toks), np.concatenate(lens)


def gather_tokens(d: Ranks, part: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's windows, in rank order, on every rank (each Gbar tile sweeps them all)."""
    if d.world == 1:
        return part
    parts = d.gather(part)
    return (np.ascontiguousarray(np.concatenate([p[0] for p in parts])),
            np.ascontiguousarray(np.concatenate([p[1] for p in parts])))


# -- pass 2 ------------------------------------------------------------------------------------
def tile_pass(fp: outofcore.SparseFirstPass, tokens: np.ndarray, lengths: np.ndarray,
              ids: Tensor | None, width: int, spec, d: Ranks) -> tuple[Tensor, Tensor]:
    """(Qbar sum [k, k], Delta sum [T]) over all ranks, resuming this rank's tiles."""
    rows = tilepass.QRows.of(ids, fp.d_vocab)
    n_tiles = len(tilepass.tiles(fp.ctx_ids, width))
    path = spec.work_dir / f"pass2-sparse-rank{d.rank}-of{d.world}.safetensors"
    ident = dict(spec.identity, checksum=fp.checksum, tile_width=width,
                 ids=None if ids is None else ids.tolist())
    sums = _resume(path, ident) or tilepass.TileSums.zeros(tokens.shape[0], fp.T, rows.side)
    todo = [i for i in range(n_tiles) if i % d.world == d.rank]
    shown = pass1.bar(spec, "statistics pass 2", d, unit="tile", total=len(todo))
    shown.update(len(set(todo) & set(sums.done)))
    saver = _Saver(path, ident)
    tilepass.sweep_tiles(fp, tokens, lengths, rows, width, todo, sums,
                         after_tile=lambda s: (shown.update(1), saver.maybe(s)))
    saver.save(sums)
    shown.close()
    _sum(d, sums.S, spec.device)  # complete S on every rank (after the last checkpoint)
    n = tokens.shape[0]
    Q, D = tilepass.finish(tokens, lengths, rows, sums,
                           (n * d.rank // d.world, n * (d.rank + 1) // d.world))
    _sum(d, Q, spec.device)
    _sum(d, D, spec.device)
    return tilepass.qbar_sum(Q, rows), torch.from_numpy(D)


def _sum(d: Ranks, a: np.ndarray, device: str) -> None:
    """In-place sum over ranks of a host array (through this rank's GPU under NCCL)."""
    if d.world == 1:
        return
    t = torch.from_numpy(a)
    if torch.distributed.get_backend() != "nccl":
        d.sum_(t)
        return
    dev = torch.device(d.device)
    for part in t.view(-1).split(1 << 25):
        part.copy_(d.sum_(part.to(dev)).cpu())


class _Saver:
    """Writes the pass-2 checkpoint at most every CHECKPOINT_SECONDS."""

    def __init__(self, path: Path, ident: dict[str, Any]) -> None:
        self.path, self.ident, self.last = path, ident, time.monotonic()

    def maybe(self, sums: tilepass.TileSums) -> None:
        if time.monotonic() - self.last >= CHECKPOINT_SECONDS:
            self.save(sums)

    def save(self, sums: tilepass.TileSums) -> None:
        tensors = {k: torch.from_numpy(getattr(sums, k)) for k in ("S", "Delta", "Dc", "QAt")}
        meta = {"identity": self.ident, "state": {"kind": "sparse_q", "done": sums.done}}
        nbytes = sum(t.nbytes for t in tensors.values())
        fileio.atomic_write(self.path, lambda tmp: save_file(tensors, str(tmp),
                                                             {"meta": json.dumps(meta)}), nbytes)
        self.last = time.monotonic()


def _resume(path: Path, ident: dict[str, Any]) -> tilepass.TileSums | None:
    if not path.exists():
        return None
    tensors, meta = checkpoint.load_state(path, ident)
    arrays = (tensors[k].numpy().copy() for k in ("S", "Delta", "Dc", "QAt"))
    return tilepass.TileSums(*arrays, list(meta["state"]["done"]))


# -- results -----------------------------------------------------------------------------------
def assemble(fp: outofcore.SparseFirstPass, Q: Tensor, D: Tensor, meta: dict[str, Any],
             ids: Tensor | None, width: int) -> CorpusStats:
    """The same tensors as the dense engine's ``engine.assemble`` (restricted to ``ids``)."""
    P, V = fp.n_positions, fp.d_vocab
    t = {"Bbar": outofcore.bbar_block(fp, ids, ids), "Phibar": outofcore.phibar_block(fp, ids, ids),
         "Qbar": Q.div_(P), "Delta": D / P,
         "token_counts": fp.token_counts if ids is None else fp.token_counts[ids]}
    if ids is not None or V <= engine.EAGER_LIMIT:
        t.update(outofcore.compositions(fp, torch.arange(V) if ids is None else ids, width))
    kernel = dict(sparsefast.info(), tile_width=width)
    return CorpusStats(t, engine.stats_meta(meta, ids, V, fp, kernel))


def batch_stats(tokens: Tensor, d_vocab: int, *, lengths: Tensor | None = None,
                top_k: int | None = None, tokenizer: dict[str, Any] | None = None,
                width: int | None = None) -> CorpusStats:
    """``engine.batch_stats`` with the sparse engine: both passes over one batch [N, T+1]."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise BadInputError("tokens must be a LongTensor [N, T+1]")
    T = tokens.shape[1] - 1
    acc = SparseCountAccumulator(d_vocab, T).update(tokens, lengths)
    digest = hashlib.sha256(tokens.cpu().to(torch.int64).numpy().tobytes())
    if lengths is not None:
        digest.update(lengths.cpu().to(torch.int64).numpy().tobytes())
    acc.ledger = [{"shard": "batch", "sequences": tokens.shape[0], "sha256": digest.hexdigest()}]
    fp = outofcore.first_pass(acc)
    ids = None if top_k is None else engine.top_k_ids(fp.token_counts, top_k)
    width = width or plan.tile_width(d_vocab)
    Q, D = tilepass.second_pass(fp, *tilepass.pass2_tokens(tokens.cpu(), lengths), ids, width)
    meta = {"T": T, "tokenizer": tokenizer, "ledger": acc.ledger, "policy": {"kind": "batch"},
            "engine": {"requested": "sparse", "resolved": "sparse", "reason": "batch_stats"}}
    return assemble(fp, Q, D, meta, ids, width)
