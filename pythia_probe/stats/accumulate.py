"""Streaming accumulators (``update(batch) -> self``), kept apart from the frozen CorpusStats.

Pass 1 (``CountAccumulator``): token frequencies, bigram counts and context weights. Every
pass-1 number is an integer: bigram counts exactly, and the context weight 1/t in fixed point
(``FixedPoint``: round(2^42 / t) per term, summed exactly in two int64 limbs). So any chunking,
shard split, merge order, process count or device gives bit-identical state; the only rounding
is the per-term 2^-43 (relative error <= T * 2^-43 per entry, 1.5e-11 at T = 128).

Pass 2 (``QAccumulator``): Qbar and Delta in float64 from the final Gbar. Resume is bit for
bit (same batches, same order); merges of partial Qbar agree to float64 rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError, MismatchError, ResourceError
from pythia_probe.resources import memory_budget
from pythia_probe.stats import kernels
from pythia_probe.stats.compose import slices

INT_MAX = (1 << 63) - 1


def check_batch(tokens: Tensor, lengths: Tensor | None, d_vocab: int, T: int) -> Tensor:
    """Validate a batch; return lengths (full rows when None). Clear errors on bad input."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise BadInputError("tokens must be an integer tensor [n, T+1]")
    if tokens.shape[1] < 2 or tokens.shape[1] > T + 1:
        raise BadInputError(f"tokens have {tokens.shape[1]} columns; valid: 2..T+1 = {T + 1}")
    L = tokens.shape[1]
    if lengths is None:
        lengths = torch.full((tokens.shape[0],), L, dtype=torch.int64, device=tokens.device)
    lengths = lengths.to(device=tokens.device, dtype=torch.int64)
    if lengths.shape != (tokens.shape[0],) or bool(((lengths < 2) | (lengths > L)).any()):
        raise BadInputError(f"lengths must be [n] with 2 <= length <= {L} (T+1 tokens)")
    valid = torch.arange(L, device=tokens.device)[None, :] < lengths[:, None]
    bad = valid & ((tokens < 0) | (tokens >= d_vocab))
    if bool(bad.any()):
        raise BadInputError(f"token id {int(tokens[bad][0])} outside the vocabulary "
                               f"0..{d_vocab - 1} (d_vocab = {d_vocab})")
    return lengths


def check_memory(need: int, device: torch.device, what: str) -> None:
    """Refuse up front (clear error) when ``need`` bytes exceed the device's memory budget."""
    limit, how = memory_budget(str(device))
    if limit is not None and need > limit:
        raise ResourceError(f"{what} need {need / 1e9:.1f} GB on {device}, more than the budget "
                            f"{limit / 1e9:.1f} GB ({how}); see pythia_probe/stats/MEMORY.md "
                            "(3 V x V int64 tensors; 60.7 GB at 50,304 tokens)")


class FixedPoint:
    """Exact sum of non-negative fixed-point terms: value = hi + lo * 2^-F, hi and lo int64."""

    def __init__(self, numel: int, T: int, device: torch.device, frac_bits: int) -> None:
        self.F, self.T = frac_bits, T
        self.hi = torch.zeros(numel, dtype=torch.int64, device=device)
        self.lo = torch.zeros(numel, dtype=torch.int64, device=device)
        self.pending = 1  # positions whose weight may sit in lo (lo < 2^F counts as one)

    @property
    def capacity(self) -> int:
        """Positions that fit in lo before a carry: each adds <= 2^F + T to one entry."""
        return INT_MAX // ((1 << self.F) + self.T) - 1

    def reserve(self, positions: int) -> None:
        """Carry lo into hi first if ``positions`` more could overflow lo."""
        if self.pending + positions > self.capacity:
            self.normalize()
        self.pending += positions

    def normalize(self) -> None:
        """Canonical form: 0 <= lo < 2^F (whole units carried into hi)."""
        carry = self.lo >> self.F
        self.hi += carry
        self.lo -= carry << self.F
        self.pending = 1

    def add_(self, other: FixedPoint) -> None:
        self.normalize()
        other.normalize()
        self.hi += other.hi.to(self.hi.device)
        self.lo += other.lo.to(self.lo.device)
        self.normalize()

    def to_float(self, rows: slice) -> Tensor:
        """float64 values of a slice of the flat state."""
        return self.hi[rows].double() + self.lo[rows].double() * 2.0 ** -self.F


class CountAccumulator:
    """Pass 1: token counts, bigram counts and fixed-point context weights over streamed batches."""

    def __init__(self, d_vocab: int, T: int, device: str | torch.device = "cpu") -> None:
        if d_vocab < 1 or T < 1:
            raise BadInputError(f"need d_vocab >= 1 and T >= 1, got {d_vocab}, {T}")
        self.d_vocab, self.T, self.device = d_vocab, T, torch.device(device)
        V2 = d_vocab * d_vocab
        check_memory(3 * 8 * V2, self.device, f"pass-1 accumulators for d_vocab = {d_vocab}")
        self.token_counts = torch.zeros(d_vocab, dtype=torch.int64, device=self.device)
        self.bigram = torch.zeros(V2, dtype=torch.int64, device=self.device)
        self.context = FixedPoint(V2, T, self.device, kernels.FRAC_BITS)
        self.n_sequences = self.n_positions = self.n_tokens = 0
        self.ledger: list[dict[str, Any]] = []
        self._ws = kernels.Workspace()

    def update(self, tokens: Tensor, lengths: Tensor | None = None) -> CountAccumulator:
        """Count one batch [n, <=T+1] (padding beyond ``lengths`` ignored)."""
        tokens = _as_ids(tokens, self.device)
        lengths = check_batch(tokens, lengths, self.d_vocab, self.T)
        for sl in _row_chunks(lengths - 1, self.context.capacity // 2):
            self._update(tokens[sl], lengths[sl])
        return self

    def _update(self, tokens: Tensor, lengths: Tensor) -> None:
        n_pos = int((lengths - 1).sum())
        V = self.d_vocab
        toks = kernels.counted_tokens(tokens, lengths)
        self.token_counts.index_add_(0, toks, torch.ones_like(toks))
        keys = kernels.bigram_keys(tokens, lengths, V)
        self.bigram.index_add_(0, keys, torch.ones_like(keys))
        self.context.reserve(n_pos)
        kernels.add_context(self.context.lo, tokens, lengths, V, self._ws)
        self.n_sequences += tokens.shape[0]
        self.n_positions += n_pos
        self.n_tokens += int(toks.numel())

    def merge(self, other: CountAccumulator) -> CountAccumulator:
        """Add another partial accumulator (exact, any order); refuses shards counted twice."""
        _check_compatible(self, other)
        self.token_counts += other.token_counts.to(self.device)
        self.bigram += other.bigram.to(self.device)
        self.context.add_(other.context)
        self.n_sequences += other.n_sequences
        self.n_positions += other.n_positions
        self.n_tokens += other.n_tokens
        self.ledger = self.ledger + other.ledger
        return self

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """(tensors, json-able meta) in canonical form, for checkpoints."""
        self.context.normalize()
        tensors = {"token_counts": self.token_counts, "bigram": self.bigram,
                   "context_hi": self.context.hi, "context_lo": self.context.lo}
        meta = {"kind": "count", "d_vocab": self.d_vocab, "T": self.T,
                "frac_bits": self.context.F, "n_sequences": self.n_sequences,
                "n_positions": self.n_positions, "n_tokens": self.n_tokens, "ledger": self.ledger}
        return tensors, meta

    @classmethod
    def from_state(cls, tensors: dict[str, Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu") -> CountAccumulator:
        if meta.get("kind") != "count" or meta.get("frac_bits") != kernels.FRAC_BITS:
            raise MismatchError("not a pass-1 checkpoint of this code version")
        acc = cls(meta["d_vocab"], meta["T"], device)
        acc.token_counts.copy_(tensors["token_counts"])
        acc.bigram.copy_(tensors["bigram"])
        acc.context.hi.copy_(tensors["context_hi"])
        acc.context.lo.copy_(tensors["context_lo"])
        for k in ("n_sequences", "n_positions", "n_tokens", "ledger"):
            setattr(acc, k, meta[k])
        return acc

    def checksum(self) -> list[int]:
        """Exact integer fingerprints of the state (order independent), for stats_id."""
        self.context.normalize()
        return [_int_digest(t) for t in (self.token_counts, self.bigram,
                                         self.context.hi, self.context.lo)]


class QAccumulator:
    """Pass 2: Qbar (optionally only the top-k block) and Delta from the final Gbar."""

    def __init__(self, Gbar: Tensor, T: int, ids: Tensor | None = None,
                 device: str | torch.device | None = None) -> None:
        self.device = torch.device(device) if device is not None else Gbar.device
        self.d_vocab, self.T = Gbar.shape[0], T
        self.Gc = torch.empty(Gbar.numel(), dtype=torch.float64, device=self.device)
        Gc = self.Gc.view(self.d_vocab, self.d_vocab)
        Gc.copy_(Gbar)  # M_i[t, k] = Gbar[y_t, x_k] - colsum(Gbar)[x_k] / V, no extra copy
        Gc -= Gc.sum(0, keepdim=True) / self.d_vocab
        self.k = self.d_vocab if ids is None else int(ids.numel())
        self.row_of = None
        side = self.k
        if ids is not None:  # top-k block plus one dummy row/column for all other tokens
            self.row_of = torch.full((self.d_vocab,), self.k, dtype=torch.int64,
                                     device=self.device)
            self.row_of[ids.to(self.device)] = torch.arange(self.k, device=self.device)
            side = self.k + 1
        self.Qbar = torch.zeros(side * side, dtype=torch.float64, device=self.device)
        self.Delta = torch.zeros(T, dtype=torch.float64, device=self.device)
        self.n_positions = 0
        self.ledger: list[dict[str, Any]] = []
        self._ws = kernels.Workspace()

    def qbar_sum(self) -> Tensor:
        """The accumulated sum of X^T Q X as [k, k] (dummy row/column dropped)."""
        side = int(round(self.Qbar.numel() ** 0.5))
        return self.Qbar.view(side, side)[: self.k, : self.k]

    def update(self, tokens: Tensor, lengths: Tensor | None = None) -> QAccumulator:
        tokens = _as_ids(tokens, self.device)
        lengths = check_batch(tokens, lengths, self.d_vocab, self.T)
        kernels.add_q(self.Qbar, self.Delta, self.Gc, tokens, lengths, self.d_vocab, self.row_of,
                      self._ws)
        self.n_positions += int((lengths - 1).sum())
        return self

    def merge(self, other: QAccumulator) -> QAccumulator:
        _check_compatible(self, other)
        self.Qbar += other.Qbar.to(self.device)
        self.Delta += other.Delta.to(self.device)
        self.n_positions += other.n_positions
        self.ledger = self.ledger + other.ledger
        return self

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return ({"Qbar_sum": self.Qbar, "Delta_sum": self.Delta},
                {"kind": "q", "d_vocab": self.d_vocab, "T": self.T,
                 "n_positions": self.n_positions, "ledger": self.ledger})

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> QAccumulator:
        if meta.get("kind") != "q" or meta["T"] != self.T or meta["d_vocab"] != self.d_vocab:
            raise MismatchError("pass-2 checkpoint does not match these statistics")
        self.Qbar.copy_(tensors["Qbar_sum"])
        self.Delta.copy_(tensors["Delta_sum"])
        self.n_positions, self.ledger = meta["n_positions"], meta["ledger"]
        return self


def _as_ids(tokens: Tensor, device: torch.device) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
        raise BadInputError("tokens must be an integer tensor [n, T+1]")
    return tokens.to(device, torch.int64)


def _check_compatible(a: Any, b: Any) -> None:
    if type(a) is not type(b) or (a.d_vocab, a.T) != (b.d_vocab, b.T):
        raise MismatchError(f"cannot merge {type(b).__name__}(d_vocab={b.d_vocab}, T={b.T}) "
                               f"into {type(a).__name__}(d_vocab={a.d_vocab}, T={a.T})")
    twice = {e["shard"] for e in a.ledger} & {e["shard"] for e in b.ledger}
    if twice:
        raise MismatchError(f"shards counted twice in merge: {sorted(twice)[:5]}")


def _row_chunks(positions: Tensor, max_positions: int) -> list[slice]:
    """Split rows so that each chunk has at most ``max_positions`` predicted positions."""
    csum = torch.cumsum(positions.cpu(), 0).tolist()
    out, start, base = [], 0, 0
    for i, c in enumerate(csum):
        if c - base > max_positions and i > start:
            out.append(slice(start, i))
            start, base = i, csum[i - 1]
    out.append(slice(start, len(csum)))
    return out


def _int_digest(t: Tensor) -> int:
    """Order-independent exact fingerprint: sum of value * (index mod 1_000_003), mod 2^31 - 1."""
    mod = (1 << 31) - 1
    total = 0
    for sl in slices(t.numel(), 1 << 24):
        idx = torch.arange(sl.start, sl.stop, device=t.device) % 1_000_003 + 1
        v = t.reshape(-1)[sl] % mod
        total = (total + int(((v * idx) % mod).sum())) % mod
    return total
