"""The exact fixed point of pass 1, shared by both engines: the context weight 1/t of a
(target, context) pair is round(2^FRAC_BITS / t), summed exactly as integers, so any chunking,
shard split, merge order, process count or device gives the same bits. The only rounding is
the per-term 2^-43 (relative error <= T 2^-43 per entry, 1.5e-11 at T = 128).

The dense engine keeps the sums in two int64 limbs hi + lo 2^-F (:class:`FixedPoint`), the
sparse engine in sorted tables of the same limbs (``stats/tables.py``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

FRAC_BITS = 42
"""Fraction bits of the context weights 1/t."""
INT_MAX = (1 << 63) - 1
MASK = (1 << FRAC_BITS) - 1


@lru_cache(maxsize=32)
def context_weights(T: int, device: torch.device) -> Tensor:
    """round(2^FRAC_BITS / (t + 1)) for t < T, exact integer rounding (int64)."""
    d = torch.arange(1, T + 1, dtype=torch.int64, device=device)
    return ((1 << (FRAC_BITS + 1)) + d) // (2 * d)


def capacity(T: int) -> int:
    """Positions that fit in the low limb before a carry: each adds <= 2^F + T to one entry."""
    return INT_MAX // ((1 << FRAC_BITS) + T) - 1


class FixedPoint:
    """Exact sum of non-negative fixed-point terms: value = hi + lo * 2^-F, hi and lo int64."""

    def __init__(self, numel: int, T: int, device: torch.device,
                 frac_bits: int = FRAC_BITS) -> None:
        self.F, self.T = frac_bits, T
        self.hi = torch.zeros(numel, dtype=torch.int64, device=device)
        self.lo = torch.zeros(numel, dtype=torch.int64, device=device)
        self.pending = 1  # positions whose weight may sit in lo (lo < 2^F counts as one)

    @property
    def capacity(self) -> int:
        return capacity(self.T)

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


def reduce_equal(keys: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sorted keys with repeats -> unique keys and the exact sum of each value per key."""
    if keys.size == 0:
        return (keys, *values)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return (keys[starts], *(np.add.reduceat(v, starts) for v in values))


def carry(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical fixed point: whole units of lo moved into hi, 0 <= lo < 2^F."""
    return hi + (lo >> FRAC_BITS), lo & MASK
