"""The authors' top-K rule (pythia.py's find_top_tokens), exact and mergeable.

pythia.py counts every token of each document as TransformerLens' to_tokens gives it (BOS
first, cut at 2,048 tokens) over the documents used, then sorts by count with ties in the order
the tokens were first seen in the document stream (a stable sort of an insertion-ordered dict),
and keeps the first K; with K at least the model's d_vocab it keeps every id (no restriction).

Here each shard's pass 1 records, for every token its documents hold, its count and the place
it was first seen in the shard (document ordinal in the shard x N_CTX + position), in the
shard's token cache (so the cache's sha256 in the ledger covers them, and a resumed run or a
rebuilt cache gives the same numbers). Across shards the counts add and the first place is the
first shard's (shards in corpus order): :func:`rank` gives exactly the order of the one stream,
whatever the shards, ranks, batch size or resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.stats.sequences import N_CTX

KEYS = ("doc_ids", "doc_counts", "doc_first")
"""The token-cache tensors of a shard's document counts."""
NEVER = np.iinfo(np.int64).max


class DocTokens:
    """One shard's document token counts and first places, as its documents stream by."""

    def __init__(self, d_vocab: int, bos: int | None) -> None:
        self.bos = bos
        self.counts = np.zeros(d_vocab, dtype=np.int64)
        self.first = np.full(d_vocab, NEVER, dtype=np.int64)

    def watch(self, docs: Iterable[list[int]]) -> Iterator[list[int]]:
        """``docs`` unchanged, each counted as to_tokens gives it (BOS first, <= N_CTX)."""
        for i, ids in enumerate(docs):
            toks = np.asarray(([] if self.bos is None else [self.bos]) + list(ids[:N_CTX]),
                              dtype=np.int64)[:N_CTX]
            self.add(i, toks)
            yield ids

    def add(self, doc: int, toks: np.ndarray) -> None:
        ids, first, counts = np.unique(toks, return_index=True, return_counts=True)
        self.counts[ids] += counts
        new = self.first[ids] == NEVER
        self.first[ids[new]] = doc * N_CTX + first[new]

    def tensors(self) -> dict[str, Tensor]:
        """The tokens seen, their counts and first places (for the token cache)."""
        seen = np.flatnonzero(self.counts)
        return {"doc_ids": torch.from_numpy(seen),
                "doc_counts": torch.from_numpy(self.counts[seen]),
                "doc_first": torch.from_numpy(self.first[seen])}


def rank(shards: list[tuple[int, dict[str, Tensor]]], d_vocab: int) -> np.ndarray:
    """Every token seen, most frequent first, ties in first-seen order, from each shard's
    (corpus index, :class:`DocTokens` tensors)."""
    counts = np.zeros(d_vocab, dtype=np.int64)
    shard = np.full(d_vocab, NEVER, dtype=np.int64)
    place = np.full(d_vocab, NEVER, dtype=np.int64)
    for index, t in sorted(shards, key=lambda s: s[0]):
        ids = t["doc_ids"].numpy()
        counts[ids] += t["doc_counts"].numpy()
        new = shard[ids] == NEVER
        shard[ids[new]] = index
        place[ids[new]] = t["doc_first"].numpy()[new]
    seen = np.flatnonzero(counts)
    return seen[np.lexsort((place[seen], shard[seen], -counts[seen]))]


def top_ids(windows, k: int, d_vocab: int, d: Ranks) -> Tensor | None:
    """The authors' top-k ids over every rank's shards (None: k >= d_vocab, every id)."""
    if k >= d_vocab:
        return None
    mine = []
    for unit in windows.units:
        t = windows.doc_tokens(unit)
        if any(key not in t for key in KEYS):
            raise MismatchError(f"the token cache of shard {unit['shard']} holds no document "
                                "counts (built without --conventions authors); delete the "
                                "work folder to count from scratch")
        mine.append((int(unit["index"]), {key: t[key] for key in KEYS}))
    shards = [s for part in d.gather(mine) for s in part]
    return torch.from_numpy(rank(shards, d_vocab)[:k].copy())
