"""Pass 1 of the dense engine: token counts, bigram counts and context weights in V x V
tensors (``update(batch) -> self``, exact ``merge``, checkpoint ``state``), on any device.

Every pass-1 number is an integer: bigram counts exactly, the context weight 1/t in fixed
point (:mod:`pythia_probe.stats.fixedpoint`), so any chunking, shard split, merge order,
process count or device gives bit-identical state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError, MismatchError, ResourceError
from pythia_probe.planner.budget import memory_budget
from pythia_probe.stats import checksum, engine
from pythia_probe.stats.dense import kernels
from pythia_probe.stats.fixedpoint import FRAC_BITS, FixedPoint
from pythia_probe.stats.sequences import as_ids, check_batch, trimmed


def check_memory(need: int, device: torch.device, what: str) -> None:
    """Refuse up front (clear error) when ``need`` bytes exceed the device's memory budget."""
    limit, how = memory_budget(str(device))
    if limit is not None and need > limit:
        raise ResourceError(f"{what} need {need / 1e9:.1f} GB on {device}, more than the budget "
                            f"{limit / 1e9:.1f} GB ({how}); see pythia_probe/stats/MEMORY.md "
                            "(3 V x V int64 tensors; 60.7 GB at 50,304 tokens)")


class CountAccumulator:
    """Pass 1: token counts, bigram counts and fixed-point context weights over streamed batches."""

    kind = "count"

    def __init__(self, d_vocab: int, T: int, device: str | torch.device = "cpu") -> None:
        if d_vocab < 1 or T < 1:
            raise BadInputError(f"need d_vocab >= 1 and T >= 1, got {d_vocab}, {T}")
        self.d_vocab, self.T, self.device = d_vocab, T, torch.device(device)
        V2 = d_vocab * d_vocab
        check_memory(3 * 8 * V2, self.device, f"pass-1 accumulators for d_vocab = {d_vocab}")
        self.token_counts = torch.zeros(d_vocab, dtype=torch.int64, device=self.device)
        self.bigram = torch.zeros(V2, dtype=torch.int64, device=self.device)
        self.context = FixedPoint(V2, T, self.device)
        self.n_sequences = self.n_positions = self.n_tokens = 0
        self.ledger: list[dict[str, Any]] = []
        self._ws = kernels.Workspace()

    def update(self, tokens: Tensor, lengths: Tensor | None = None) -> CountAccumulator:
        """Count one batch [n, <=T+1] (padding beyond ``lengths`` ignored)."""
        tokens = as_ids(tokens, self.device)
        lengths = check_batch(tokens, lengths, self.d_vocab, self.T)
        tokens = trimmed(tokens, lengths)
        for sl in engine.row_chunks(lengths - 1, self.context.capacity // 2):
            self._update(tokens[sl], lengths[sl])
        return self

    def _update(self, tokens: Tensor, lengths: Tensor) -> None:
        n_pos = int((lengths - 1).sum())
        toks = kernels.counted_tokens(tokens, lengths)
        self.token_counts.index_add_(0, toks, torch.ones_like(toks))
        keys = kernels.bigram_keys(tokens, lengths, self.d_vocab)
        self.bigram.index_add_(0, keys, torch.ones_like(keys))
        self.context.reserve(n_pos)
        kernels.add_context(self.context.lo, tokens, lengths, self.d_vocab, self._ws)
        self.n_sequences += tokens.shape[0]
        self.n_positions += n_pos
        self.n_tokens += int(toks.numel())

    def merge(self, other: CountAccumulator) -> CountAccumulator:
        """Add another partial accumulator (exact, any order); refuses shards counted twice."""
        engine.check_mergeable(self, other)
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
        meta = {"kind": self.kind, "d_vocab": self.d_vocab, "T": self.T,
                "frac_bits": self.context.F, "n_sequences": self.n_sequences,
                "n_positions": self.n_positions, "n_tokens": self.n_tokens, "ledger": self.ledger}
        return tensors, meta

    @classmethod
    def from_state(cls, tensors: dict[str, Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu") -> CountAccumulator:
        if meta.get("kind") != cls.kind or meta.get("frac_bits") != FRAC_BITS:
            raise MismatchError("not a pass-1 checkpoint of this code version")
        acc = cls(meta["d_vocab"], meta["T"], device)
        acc.token_counts.copy_(tensors["token_counts"])
        acc.bigram.copy_(tensors["bigram"])
        acc.context.hi.copy_(tensors["context_hi"])
        acc.context.lo.copy_(tensors["context_lo"])
        for k in ("n_sequences", "n_positions", "n_tokens", "ledger"):
            setattr(acc, k, meta[k])
        return acc

    def release(self) -> None:
        """Drop the V x V storage (after ``first.bbar_phibar(consume=True)`` reused it)."""
        self.bigram = self.context.hi = self.context.lo = None  # type: ignore[assignment]

    def checksum(self) -> list[int]:
        """Exact integer fingerprints of the state (order independent), for stats_id."""
        self.context.normalize()
        return [checksum.dense_digest(t) for t in (self.token_counts, self.bigram,
                                                   self.context.hi, self.context.lo)]
