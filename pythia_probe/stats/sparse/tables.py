"""Exact sparse tables and pair codes for the sparse pass 1 (``sparse.SparseCountAccumulator``).

- ``FixedTable``: sorted unique int64 keys with exact fixed-point sums hi + lo 2^-42
  (0 <= lo < 2^42), in chunks of <= 2 CHUNK entries of disjoint key ranges, so that adding a
  run rewrites only the chunks it touches and never copies the whole table;
- ``CountTable``: sorted unique keys with int64 counts (the bigram table, small);
- pair codes ((a * V + y) << tbits) | t of every (target y_t, context a = x_m) pair, reduced
  after a sort to one fixed-point sum per key; pairs of two head tokens are summed in a dense
  block instead (``drain`` turns it back into sorted keys).
Each numpy function has a compiled twin in ``stats/native/sparsecount.py`` (used when built);
both give the same integers.
"""

from __future__ import annotations

import numpy as np
import torch

from pythia_probe.errors import BadInputError
from pythia_probe.stats.fixedpoint import FRAC_BITS, INT_MAX
from pythia_probe.stats.native import sparsecount

F = FRAC_BITS
MASK = (1 << F) - 1
CHUNK = 1 << 22
"""Entries per chunk of the context table (a merge copies at most two chunks at a time)."""


def t_bits(T: int) -> int:
    """Bits that hold a position 0..T-1 in the low end of a pair code."""
    return max(1, (T - 1).bit_length())


def check_key_range(d_vocab: int, T: int) -> None:
    """Pair codes (a * V + y) << tbits must stay below 2^63."""
    if (d_vocab * d_vocab) << t_bits(T) > INT_MAX:
        raise BadInputError(f"d_vocab {d_vocab} with T = {T} is too large for the sparse "
                            "engine's int64 pair codes (V^2 * 2^ceil(log2 T) >= 2^63)")


# -- exact tables ---------------------------------------------------------------------------
def reduce_equal(keys: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sorted keys with repeats -> unique keys and the exact sum of each value per key."""
    if keys.size == 0:
        return (keys, *values)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return (keys[starts], *(np.add.reduceat(v, starts) for v in values))


def carry(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical fixed point: whole units of lo moved into hi, 0 <= lo < 2^F."""
    return hi + (lo >> F), lo & MASK


def merge_fixed(a: tuple[np.ndarray, ...], b: tuple[np.ndarray | None, ...]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two sorted (keys, hi, lo) tables -> their exact sum, canonical. a is canonical; b may
    be a raw run of sums (hi None, any lo < 2^62)."""
    if sparsecount.use_c():
        return sparsecount.merge(a, b, F)
    hb = np.zeros_like(b[2]) if b[1] is None else b[1]
    k = np.concatenate([a[0], b[0]])
    order = np.argsort(k, kind="stable")
    keys, hi, lo = reduce_equal(k[order], np.concatenate([a[1], hb])[order],
                                np.concatenate([a[2], b[2]])[order])
    return (keys, *carry(hi, lo))


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


# -- raw pair codes ---------------------------------------------------------------------------
def pair_codes(tokens: np.ndarray, lengths: np.ndarray, d_vocab: int, tbits: int,
               out: np.ndarray, head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
               ) -> int:
    """Write the code ((x_m V + y_t) << tbits) | t of every context pair into ``out``; with
    ``head`` = (head_of, w, block), pairs of two head tokens add w[t] to
    block[head_of[y] * H + head_of[x_m]] instead. Returns the number of codes written."""
    if sparsecount.use_c():
        return sparsecount.pairs(tokens, lengths, d_vocab, tbits, out, head)
    base, y = tokens[:, :-1] * d_vocab, tokens[:, 1:]
    c = 0
    for t in range(tokens.shape[1] - 1):
        rows = lengths - 1 > t
        if not rows.any():
            continue
        block = ((base[rows, : t + 1] + y[rows, t:t + 1]) << tbits) | t
        out[c:c + block.size] = block.reshape(-1)
        c += block.size
    return c if head is None else _to_head(out, c, d_vocab, tbits, *head)


def _to_head(out: np.ndarray, c: int, d_vocab: int, tbits: int, head_of: np.ndarray,
             w: np.ndarray, block: np.ndarray) -> int:
    """Move the codes of head-token pairs out of ``out[:c]`` into the dense block."""
    codes = out[:c]
    keys = codes >> tbits
    H = int(round(block.size ** 0.5))
    hy, ha = head_of[keys % d_vocab], head_of[keys // d_vocab]
    both = (hy >= 0) & (ha >= 0)
    torch.from_numpy(block).index_add_(0, torch.from_numpy(hy[both] * H + ha[both]),
                                       torch.from_numpy(w[codes[both] & ((1 << tbits) - 1)]))
    rest = codes[~both]
    out[:rest.size] = rest
    return rest.size


def drain(block: np.ndarray, head_ids: np.ndarray, d_vocab: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(keys a * V + y, raw sums) of the head block's non-zero entries in key order; the
    block is zeroed. head_ids ascending, so (context, target) head order is key order."""
    if sparsecount.use_c():
        return sparsecount.drain(block, head_ids, d_vocab)
    H = head_ids.size
    bt = block.reshape(H, H).T  # [context, target]
    ha, hy = np.nonzero(bt)
    lo = bt[ha, hy]
    block[:] = 0
    return head_ids[ha] * d_vocab + head_ids[hy], lo


def reduce_codes(codes: np.ndarray, tbits: int, w: np.ndarray, lo: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted pair codes -> unique keys and the sum of the fixed-point weight w[t] per key
    (``lo``: scratch of codes.size int64 the C kernel writes into)."""
    if sparsecount.use_c():
        return sparsecount.reduce_sorted(codes, tbits, w, lo)
    return reduce_equal(codes >> tbits, w[codes & ((1 << tbits) - 1)])


def dense_index(keys: np.ndarray, d_vocab: int) -> np.ndarray:
    """Context-major keys a * V + y -> the dense accumulator's flat index y * V + a."""
    return (keys % d_vocab) * d_vocab + keys // d_vocab
