"""Sparse pass 1: the dense engine's exact counts, stored only where they are non-zero.

``SparseCountAccumulator`` has the interface of ``CountAccumulator`` (``update -> self``, exact
``merge``, ``state``/``from_state`` checkpoints, ``ledger``, ``checksum``) and the same integers:
bigram counts C[x, y] and context weights W[y, a] = sum of round(2^42 / t) over every (target y
at position t, context a at position m <= t), as fixed point hi + lo 2^-42 (0 <= lo < 2^42).
Densified (``testing.counts.as_dense``), its state equals the dense accumulator's bit for bit,
and its ``checksum`` is the dense one, so both engines give the same ``stats_id``.

Storage (section 6 of the algebra: the counts live on the pairs the corpus holds; the tables
in ``stats/tables.py``; pair codes are made and reduced by ``native.sparsecount``):
- C: sorted unique keys x * V + y (int64) with int64 counts (16 B per distinct bigram);
- W: sorted unique keys a * V + y (context-major, so Gbar's column tiles are key ranges) with
  int64 hi and lo (24 B per distinct (target, context) pair), in chunks of <= 2 CHUNK entries
  so that adding to the table never copies all of it;
- a buffer of BUFFER raw pair codes ((a * V + y) << tbits | t, 8 B each): when full it is
  sorted, reduced to one fixed-point sum per key and merged into W.
Peak memory: 24 B x distinct pairs + 16 B x distinct bigrams + 16 B x BUFFER (the buffer and
its reduced sums) + one chunk merge (48 B x CHUNK).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError, MismatchError
from pythia_probe.planner.statistics import BUFFER, HEAD, SPARSE_KIND
from pythia_probe.stats import checksum, engine
from pythia_probe.stats.fixedpoint import INT_MAX, context_weights
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.sequences import as_ids, check_batch
from pythia_probe.stats.tables import CountTable, F, FixedTable, merge_fixed


def t_bits(T: int) -> int:
    """Bits that hold a position 0..T-1 in the low end of a pair code."""
    return max(1, (T - 1).bit_length())


def check_key_range(d_vocab: int, T: int) -> None:
    """Pair codes (a * V + y) << tbits must stay below 2^63."""
    if (d_vocab * d_vocab) << t_bits(T) > INT_MAX:
        raise BadInputError(f"d_vocab {d_vocab} with T = {T} is too large for the sparse "
                            "engine's int64 pair codes (V^2 * 2^ceil(log2 T) >= 2^63)")


def dense_index(keys: np.ndarray, d_vocab: int) -> np.ndarray:
    """Context-major keys a * V + y -> the dense accumulator's flat index y * V + a."""
    return (keys % d_vocab) * d_vocab + keys // d_vocab


def _row_slices(positions: np.ndarray, pairs: np.ndarray, max_positions: int, max_pairs: int
                ) -> list[slice]:
    """Consecutive rows with at most ``max_positions`` positions and ``max_pairs`` pairs."""
    out, start, p, q = [], 0, 0, 0
    for i in range(positions.size):
        if i > start and (p + positions[i] > max_positions or q + pairs[i] > max_pairs):
            out.append(slice(start, i))
            start, p, q = i, 0, 0
        p += int(positions[i])
        q += int(pairs[i])
    out.append(slice(start, positions.size))
    return out


# -- the accumulator --------------------------------------------------------------------------
class SparseCountAccumulator:
    """Pass 1 over streamed batches with counts stored sparsely (host memory)."""

    kind = SPARSE_KIND

    def __init__(self, d_vocab: int, T: int, device: str | torch.device = "cpu",
                 buffer_pairs: int = BUFFER, head: int = HEAD) -> None:
        if d_vocab < 1 or T < 1:
            raise BadInputError(f"need d_vocab >= 1 and T >= 1, got {d_vocab}, {T}")
        check_key_range(d_vocab, T)
        self.d_vocab, self.T = d_vocab, T
        self.device = torch.device("cpu")  # the tables live in host memory on any --device
        self.token_counts = np.zeros(d_vocab, dtype=np.int64)
        self.bigram = CountTable()
        self.context = FixedTable()
        self.n_sequences = self.n_positions = self.n_tokens = 0
        self.ledger: list[dict[str, Any]] = []
        self._tbits = t_bits(T)
        self._w = context_weights(T, torch.device("cpu")).numpy()
        self._buf_size = max(int(buffer_pairs), T * (T + 1) // 2)
        self._buf = np.empty(self._buf_size, dtype=np.int64)
        self._lo = np.empty(0, dtype=np.int64)  # reduce scratch, as large as _buf once used
        self._fill = self._pending = 0
        self._n_head = min(int(head), d_vocab)
        self._head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (of, w, block)
        self._head_ids = np.zeros(0, dtype=np.int64)
        self._bigrams: list[np.ndarray] = []
        self._capacity = INT_MAX // ((1 << F) + T) - 1  # positions per reduced run

    def update(self, tokens: Tensor, lengths: Tensor | None = None) -> SparseCountAccumulator:
        """Count one batch [n, <=T+1] (padding beyond ``lengths`` ignored)."""
        tokens = as_ids(tokens, self.device)
        lengths = check_batch(tokens, lengths, self.d_vocab, self.T)
        if self._buf.size < self._buf_size:  # released by release_buffers
            self._buf = np.empty(self._buf_size, dtype=np.int64)
        x, n = tokens.numpy(), lengths.numpy()
        pos = n - 1
        for sl in _row_slices(pos, pos * n // 2, self._capacity // 2, self._buf.size):
            self._update(x[sl], n[sl])
        return self

    def _update(self, x: np.ndarray, lengths: np.ndarray) -> None:
        n_pos = int((lengths - 1).sum())
        n_pairs = int(((lengths - 1) * lengths // 2).sum())
        if self._fill + n_pairs > self._buf.size or self._pending + n_pos > self._capacity:
            self.flush()
        self._fill += sparsecount.pairs(x, lengths, self.d_vocab, self._tbits,
                                        self._buf[self._fill:self._fill + n_pairs],
                                        self._head)
        self._pending += n_pos
        valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
        self.token_counts += np.bincount(x[valid], minlength=self.d_vocab)
        self._bigrams.append((x[:, :-1] * self.d_vocab + x[:, 1:])[valid[:, 1:]])
        self.n_sequences += x.shape[0]
        self.n_positions += n_pos
        self.n_tokens += int(valid.sum())

    def flush(self) -> None:
        """Sort and reduce the buffered pairs, drain the head block, add both to the tables
        (the state is then canonical); the first flush picks the head tokens."""
        runs = [r for r in (self._buffered_run(), self._drained_run()) if r is not None]
        if len(runs) == 1:
            self.context.add(runs[0][0], None, runs[0][1])
        elif len(runs) == 2:  # disjoint keys (head pairs and the rest): a merge, no sums
            (k1, l1), (k2, l2) = runs
            self.context.add(*merge_fixed((k1, np.zeros_like(l1), l1), (k2, None, l2)))
        if self._bigrams:
            keys, counts = np.unique(np.concatenate(self._bigrams), return_counts=True)
            self.bigram.add(keys.astype(np.int64), counts.astype(np.int64))
        self._fill = self._pending = 0
        self._bigrams = []
        if self._head is None and self._n_head and self.n_positions:
            self._choose_head()

    def _drained_run(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(keys, raw sums) of the head block (zeroed), or None before the head is chosen."""
        if self._head is None:
            return None
        return sparsecount.drain(self._head[2], self._head_ids, self.d_vocab)

    def _buffered_run(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(keys, raw sums) of the buffered pair codes, or None when the buffer is empty."""
        if not self._fill:
            return None
        codes = self._buf[: self._fill]
        codes.sort()
        return sparsecount.reduce_sorted(codes, self._tbits, self._w, self._scratch)

    def _scratch(self, n: int) -> np.ndarray:
        """The C reduction's output buffer (>= n int64; allocated once, BUFFER entries)."""
        if self._lo.size < max(n, self._buf.size):
            self._lo = np.empty(max(n, self._buf.size), dtype=np.int64)
        return self._lo

    def _choose_head(self) -> None:
        """The n_head most frequent tokens so far (ascending ids) get the dense block."""
        top = np.argsort(-self.token_counts, kind="stable")[: self._n_head]
        self._head_ids = np.sort(top).astype(np.int64)
        head_of = np.full(self.d_vocab, -1, dtype=np.int64)
        head_of[self._head_ids] = np.arange(self._head_ids.size)
        block = np.zeros(self._head_ids.size ** 2, dtype=np.int64)
        self._head = (head_of, self._w, block)

    def release_buffers(self) -> None:
        """Flush, then free the pair buffer, its reduce scratch (16 B x BUFFER) and the head
        block once the counting is done (the tables stay; ``update`` allocates them again)."""
        self.flush()
        self._buf = self._lo = np.empty(0, dtype=np.int64)
        self._head = None  # the head block (drained): chosen again if counting resumes

    @property
    def nbytes(self) -> int:
        """Bytes held: tables, token counts and the pair buffer."""
        block = 0 if self._head is None else self._head[2].nbytes
        return (self.context.nbytes + self.bigram.keys.nbytes + self.bigram.counts.nbytes
                + self.token_counts.nbytes + self._buf.nbytes + self._lo.nbytes + block)

    def merge(self, other: SparseCountAccumulator) -> SparseCountAccumulator:
        """Add another partial accumulator (exact, any order); refuses shards counted twice."""
        engine.check_mergeable(self, other)
        self.flush()
        other.flush()
        self.token_counts += other.token_counts
        self.bigram.add(other.bigram.keys, other.bigram.counts)
        for chunk in other.context.chunks:
            self.context.add(*chunk)
        self.n_sequences += other.n_sequences
        self.n_positions += other.n_positions
        self.n_tokens += other.n_tokens
        self.ledger = self.ledger + other.ledger
        return self

    # -- checkpoints ----------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """(tensors, json-able meta), flushed; context chunks stored as they are."""
        self.flush()
        t = {"token_counts": self.token_counts, "bigram_keys": self.bigram.keys,
             "bigram_counts": self.bigram.counts}
        for i, (k, h, low) in enumerate(self.context.chunks):
            t.update({f"context_keys.{i}": k, f"context_hi.{i}": h, f"context_lo.{i}": low})
        meta = {"kind": self.kind, "d_vocab": self.d_vocab, "T": self.T, "frac_bits": F,
                "chunks": len(self.context.chunks), "n_sequences": self.n_sequences,
                "n_positions": self.n_positions, "n_tokens": self.n_tokens,
                "ledger": self.ledger}
        return {k: torch.from_numpy(v) for k, v in t.items()}, meta

    @classmethod
    def from_state(cls, tensors: dict[str, Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu") -> SparseCountAccumulator:
        """Rebuild from a sparse checkpoint, or from a dense one (kind "count") by its non-zeros."""
        if meta.get("frac_bits") != F or meta.get("kind") not in (cls.kind, "count"):
            raise MismatchError("not a pass-1 checkpoint of this code version")
        acc = cls(meta["d_vocab"], meta["T"], device)
        acc.token_counts = tensors["token_counts"].numpy().astype(np.int64, copy=True)
        if meta["kind"] == "count":
            acc._load_dense(tensors)
        else:
            acc.bigram = CountTable(tensors["bigram_keys"].numpy().copy(),
                                    tensors["bigram_counts"].numpy().copy())
            acc.context = FixedTable([tuple(tensors[f"context_{p}.{i}"].numpy().copy()
                                            for p in ("keys", "hi", "lo"))
                                      for i in range(meta["chunks"])])
        for k in ("n_sequences", "n_positions", "n_tokens", "ledger"):
            setattr(acc, k, meta[k])
        return acc

    def _load_dense(self, tensors: dict[str, Tensor]) -> None:
        V = self.d_vocab
        big = tensors["bigram"].numpy()
        nz = np.flatnonzero(big)
        self.bigram = CountTable(nz.astype(np.int64), big[nz].astype(np.int64))
        hi, lo = tensors["context_hi"].numpy(), tensors["context_lo"].numpy()
        idx = np.flatnonzero((hi != 0) | (lo != 0))  # target-major y * V + a
        keys = (idx % V) * V + idx // V
        order = np.argsort(keys)
        self.context = FixedTable()
        self.context.add(keys[order], hi[idx][order], lo[idx][order])

    def checksum(self) -> list[int]:
        """The dense accumulator's fingerprints, computed from the non-zero entries only."""
        self.flush()
        V = self.d_vocab
        sums = [checksum.sparse_digest(np.arange(V), self.token_counts),
                checksum.sparse_digest(self.bigram.keys, self.bigram.counts), 0, 0]
        for k, h, low in self.context.chunks:
            idx = dense_index(k, V)
            sums[2] = (sums[2] + checksum.sparse_digest(idx, h)) % checksum.MOD
            sums[3] = (sums[3] + checksum.sparse_digest(idx, low)) % checksum.MOD
        return sums
