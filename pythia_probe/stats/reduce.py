"""The one reduction over ranks of both engines (:class:`~pythia_probe.ranks.Ranks`).

Integer pass-1 sums are exact, so counts equal a single-process run bit for bit; pass-2 float
sums agree to float64 rounding. NCCL needs device tensors: host tensors are summed or
broadcast through this rank's device in slices.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from pythia_probe.ranks import Ranks

SLICE = 1 << 25
"""Entries per slice staged through the device under NCCL (268 MB of float64)."""


def _nccl_host(d: Ranks, t: Tensor) -> bool:
    return dist.get_backend() == "nccl" and not t.is_cuda


def sum_(d: Ranks, x: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """In-place sum over ranks of a tensor or host array; returns ``x``."""
    if d.world == 1:
        return x
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    if not _nccl_host(d, t):
        d.sum_(t)
        return x
    dev = torch.device(d.device)
    for part in t.view(-1).split(SLICE):
        part.copy_(d.sum_(part.to(dev)).cpu())
    return x


def broadcast_(d: Ranks, t: Tensor) -> Tensor:
    """Rank 0's ``t`` on every rank, in place (so every rank uses identical bits)."""
    if d.world == 1:
        return t
    t = t.contiguous()
    if not _nccl_host(d, t):
        return d.broadcast_(t)
    dev = torch.device(d.device)
    for part in t.view(-1).split(SLICE):
        part.copy_(d.broadcast_(part.to(dev)).cpu())
    return t


def merged_ledger(d: Ranks, ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's ledger entries, in shard order."""
    if d.world == 1:
        return ledger
    return sorted((e for part in d.gather(ledger) for e in part), key=lambda e: e["index"])


def total(d: Ranks, *counts: int) -> tuple[int, ...]:
    """Integer counters summed over the ranks."""
    if d.world == 1:
        return counts
    parts = d.gather(list(counts))
    return tuple(sum(p[i] for p in parts) for i in range(len(counts)))


def gather(d: Ranks, obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (sparse states, windows)."""
    return [obj] if d.world == 1 else d.gather(obj)
