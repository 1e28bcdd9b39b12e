"""The deterministic inputs of the frozen statistics baseline (make_stats_baseline.py and
tests/test_stats_baseline.py both build them here)."""

from __future__ import annotations

import torch

from pythia_probe.testing.shards import IdShard


def random_tokens(V: int = 37, used: int = 25, N: int = 30, T: int = 9, seed: int = 7):
    """Ragged random windows over ``used`` ids scattered in 0..V-1 (the rest absent)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(V, generator=g)[torch.randint(0, used, (N, T + 1), generator=g)]
    lengths = torch.randint(2, T + 2, (N,), generator=g)
    lengths[0] = T + 1
    tokens[torch.arange(T + 1)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def id_shards(n: int = 5, docs: int = 7, V: int = 23, seed: int = 3, fail: int | None = None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(n):
        texts = []
        for _ in range(docs):
            k = int(torch.randint(3, 15, (1,), generator=g))
            ids = torch.randint(0, V - 4, (k,), generator=g)  # ids V-4..V-1 absent
            texts.append(" ".join(map(str, ids.tolist())))
        out.append(IdShard(f"shard{s}", tuple(texts), fail=(s == fail)))
    return out
