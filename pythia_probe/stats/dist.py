"""Sums of the dense engine's accumulators over the ranks of :class:`~pythia_probe.ranks.Ranks`.

Integer pass-1 sums are exact, so counts equal a single-process run bit for bit; pass-2 float
sums agree to float64 rounding.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from pythia_probe.ranks import Ranks
from pythia_probe.stats.accumulate import CountAccumulator, QAccumulator


def reduce_counts(d: Ranks, acc: CountAccumulator) -> CountAccumulator:
    """Sum pass-1 accumulators over ranks (exact integers); every rank gets the total."""
    if d.world == 1:
        return acc
    acc.context.normalize()
    for t in (acc.token_counts, acc.bigram, acc.context.hi, acc.context.lo):
        d.sum_(t)
    acc.context.normalize()
    parts = d.gather([acc.n_sequences, acc.n_positions, acc.n_tokens, acc.ledger])
    acc.n_sequences, acc.n_positions, acc.n_tokens = (sum(p[i] for p in parts) for i in range(3))
    acc.ledger = sorted((e for p in parts for e in p[3]), key=lambda e: e["index"])
    return acc


def reduce_q(d: Ranks, q: QAccumulator) -> QAccumulator:
    """Sum pass-2 accumulators over ranks."""
    if d.world == 1:
        return q
    d.sum_(q.Qbar)
    d.sum_(q.Delta)
    parts = d.gather([q.n_positions, q.ledger])
    q.n_positions = sum(p[0] for p in parts)
    q.ledger = sorted((e for p in parts for e in p[1]), key=lambda e: e["index"])
    return q


def share_gbar(d: Ranks, Gbar: Tensor, device: torch.device) -> Tensor:
    """Rank 0's Gbar on every rank (so pass 2 uses identical bits everywhere).

    NCCL needs CUDA tensors: a host-resident Gbar is sent in row tiles through ``device``.
    """
    if d.world == 1:
        return Gbar
    if dist.get_backend() != "nccl" or Gbar.is_cuda:
        return d.broadcast_(Gbar.contiguous())
    rows = max(1, (1 << 28) // (8 * Gbar.shape[1]))
    for r in range(0, Gbar.shape[0], rows):
        tile = Gbar[r:r + rows].to(device)
        d.broadcast_(tile)
        Gbar[r:r + rows] = tile.cpu()
    return Gbar
