"""The pass-1 checksum both engines compute (part of ``stats_id``): an exact, order-independent
integer fingerprint of each count array, the same whether the array is dense or stored only
where it is non-zero, so both engines give the same ``stats_id`` for the same corpus."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

MOD = (1 << 31) - 1
STEP = 1 << 24


def dense_digest(t: Tensor) -> int:
    """sum of value * (index mod 1_000_003 + 1) mod 2^31 - 1 over a flat integer tensor."""
    total = 0
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), STEP):
        stop = min(start + STEP, flat.numel())
        idx = torch.arange(start, stop, device=t.device) % 1_000_003 + 1
        v = flat[start:stop] % MOD
        total = (total + int(((v * idx) % MOD).sum())) % MOD
    return total


def sparse_digest(index: np.ndarray, values: np.ndarray) -> int:
    """:func:`dense_digest` of a tensor holding ``values`` at flat ``index``, 0 elsewhere."""
    total = 0
    for i in range(0, index.size, STEP):
        v = values[i:i + STEP] % MOD
        w = index[i:i + STEP] % 1_000_003 + 1
        total = (total + int(((v * w) % MOD).sum())) % MOD
    return total
