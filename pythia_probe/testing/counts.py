"""The sparse pass-1 accumulator as a dense one, for the tests (small vocabularies): the two
engines' counts compared entry by entry. Kept here so the sparse engine imports no dense code."""

from __future__ import annotations

import torch

from pythia_probe.stats.dense.count import CountAccumulator
from pythia_probe.stats.sparse.count import SparseCountAccumulator, dense_index


def as_dense(sparse: SparseCountAccumulator) -> CountAccumulator:
    """The same state as a dense CountAccumulator."""
    sparse.flush()
    acc = CountAccumulator(sparse.d_vocab, sparse.T)
    acc.token_counts.copy_(torch.from_numpy(sparse.token_counts))
    acc.bigram[torch.from_numpy(sparse.bigram.keys)] = torch.from_numpy(sparse.bigram.counts)
    keys, hi, lo = sparse.context.arrays()
    idx = torch.from_numpy(dense_index(keys, sparse.d_vocab))
    acc.context.hi[idx] = torch.from_numpy(hi)
    acc.context.lo[idx] = torch.from_numpy(lo)
    for k in ("n_sequences", "n_positions", "n_tokens"):
        setattr(acc, k, getattr(sparse, k))
    acc.ledger = list(sparse.ledger)
    return acc
