"""The exact sparse tables of the factored statistics, shared by both engines and the frozen
result (``factors.py``, ``stores.py``, ``groups.py``):

- ``FixedTable``: sorted unique int64 keys with exact fixed-point sums hi + lo 2^-42
  (0 <= lo < 2^42), in chunks of <= 2 CHUNK entries of disjoint key ranges, so that adding a
  run rewrites only the chunks it touches and never copies the whole table (W);
- ``CountTable``: sorted unique keys with int64 counts (the bigram table C, small).
Merges run through the one kernel dispatch (``stats/native/sparsecount.py``: C, or its numpy
twin, the same integers).
"""

from __future__ import annotations

import numpy as np

from pythia_probe.planner.statistics import CHUNK
from pythia_probe.stats.fixedpoint import FRAC_BITS, INT_MAX, carry, reduce_equal
from pythia_probe.stats.native import sparsecount

F = FRAC_BITS


def merge_fixed(a: tuple[np.ndarray, ...], b: tuple[np.ndarray | None, ...]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two sorted (keys, hi, lo) tables -> their exact sum, canonical. a is canonical; b may
    be a raw run of sums (hi None, any lo < 2^62)."""
    return sparsecount.merge(a, b, F)


class FixedTable:
    """Sorted unique int64 keys with exact fixed-point sums, in chunks of disjoint key ranges."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None):
        self.chunks = list(chunks or [])

    def __len__(self) -> int:
        return sum(c[0].size for c in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for c in self.chunks for x in c)

    def add(self, keys: np.ndarray, hi: np.ndarray | None, lo: np.ndarray) -> None:
        """Add a table with sorted unique keys (exact; hi None: a raw run of sums lo < 2^62);
        only the chunks it touches are rewritten."""
        if keys.size == 0:
            return
        if not self.chunks:  # keys may be a view of the caller's reusable buffer: copied
            self.chunks = _split((keys.copy(), *carry(np.zeros_like(lo) if hi is None else hi,
                                                      lo)))
            return
        firsts = np.array([c[0][0] for c in self.chunks[1:]], dtype=np.int64)
        edges = [0, *np.searchsorted(keys, firsts).tolist(), keys.size]
        old, self.chunks = self.chunks, []
        for i in range(len(old)):
            a, b = edges[i], edges[i + 1]
            part = old[i]
            old[i] = None  # type: ignore[call-overload]  # freed as soon as it is merged
            if a == b:
                self.chunks.append(part)
            else:
                piece = (keys[a:b], None if hi is None else hi[a:b], lo[a:b])
                self.chunks.extend(_split(merge_fixed(part, piece)))

    def key_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries with start <= key < stop (copies)."""
        parts = []
        for k, h, low in self.chunks:
            if k[-1] < start or k[0] >= stop:
                continue
            a, b = np.searchsorted(k, [start, stop])
            parts.append((k[a:b], h[a:b], low[a:b]))
        if not parts:
            return tuple(np.zeros(0, dtype=np.int64) for _ in range(3))
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def columns(self, cols: np.ndarray, d_vocab: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries whose key // d_vocab is one of ``cols`` (sorted by key; copies)."""
        c = np.unique(np.asarray(cols, dtype=np.int64))
        parts = []
        for k, h, low in self.chunks:
            a = np.searchsorted(k, c * d_vocab)
            n = np.searchsorted(k, (c + 1) * d_vocab) - a
            idx = ranges(a[n > 0], n[n > 0])
            parts.append((k[idx], h[idx], low[idx]))
        if not parts:
            return tuple(np.zeros(0, dtype=np.int64) for _ in range(3))
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole table as three arrays (a copy: for tests and small tables)."""
        return self.key_range(-1, INT_MAX)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each start s and length n."""
    total = int(lengths.sum())
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total)


def _split(t: tuple[np.ndarray, ...]) -> list[tuple[np.ndarray, ...]]:
    """A table as chunks of CHUNK entries when it grew past 2 CHUNK. Copies: a chunk that was
    a view would keep its whole base array alive until its last sibling is merged away."""
    n = t[0].size
    if n <= 2 * CHUNK:
        return [t]
    return [tuple(x[i:i + CHUNK].copy() for x in t) for i in range(0, n, CHUNK)]


class CountTable:
    """Sorted unique int64 keys with int64 counts (the bigram table; small)."""

    def __init__(self, keys: np.ndarray | None = None, counts: np.ndarray | None = None):
        self.keys = np.zeros(0, dtype=np.int64) if keys is None else keys
        self.counts = np.zeros(0, dtype=np.int64) if counts is None else counts

    def __len__(self) -> int:
        return self.keys.size

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        k = np.concatenate([self.keys, keys])
        order = np.argsort(k, kind="stable")
        self.keys, self.counts = reduce_equal(k[order],
                                              np.concatenate([self.counts, counts])[order])
