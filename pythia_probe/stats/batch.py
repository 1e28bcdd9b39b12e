"""Both passes, exactly, over one batch of token windows held in memory."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from pythia_probe.stats.accumulate import CountAccumulator, QAccumulator
from pythia_probe.stats.corpus_stats import CorpusStats
from pythia_probe.stats.engine import assemble, first_pass, top_k_ids


def batch_stats(tokens: Tensor, d_vocab: int, *, lengths: Tensor | None = None,
                top_k: int | None = None, device: str | torch.device | None = None,
                tokenizer: dict[str, Any] | None = None) -> CorpusStats:
    """Both passes, exactly, over one batch [N, T+1] (padding beyond ``lengths`` ignored)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise ValueError("tokens must be a LongTensor [N, T+1]")
    dev = torch.device(device) if device is not None else tokens.device
    T = tokens.shape[1] - 1
    acc = CountAccumulator(d_vocab, T, dev).update(tokens, lengths)
    digest = hashlib.sha256(tokens.cpu().to(torch.int64).numpy().tobytes())
    if lengths is not None:
        digest.update(lengths.cpu().to(torch.int64).numpy().tobytes())
    acc.ledger = [{"shard": "batch", "sequences": tokens.shape[0], "sha256": digest.hexdigest()}]
    fp = first_pass(acc, consume=True)
    ids = None if top_k is None else top_k_ids(fp.token_counts, top_k)
    q = QAccumulator(fp.Gbar, T, ids).update(tokens, lengths)
    meta = {"T": T, "tokenizer": tokenizer, "ledger": acc.ledger,
            "policy": {"kind": "batch"}}
    return assemble(fp, q, meta, ids)
