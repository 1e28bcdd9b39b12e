"""The only module that knows about ranks: whole shards per process, sums, rank 0 writes.

Under ``torchrun`` or ``accelerate launch`` (WORLD_SIZE/RANK in the environment) the process
group is initialised here (gloo on CPU, nccl on CUDA). Integer pass-1 sums are exact, so counts
equal a single-process run bit for bit; pass-2 float sums agree to float64 rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pythia_probe.stats.accumulate import CountAccumulator, QAccumulator


@dataclass
class Dist:
    """rank / world of this process (world 1: no process group)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls, device: str = "cpu") -> Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            backend = "nccl" if str(device).startswith("cuda") else "gloo"
            dist.init_process_group(backend)
        return cls(dist.get_rank(), dist.get_world_size())

    def sum_(self, t: Tensor) -> Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_(self, t: Tensor) -> Tensor:
        if self.world > 1:
            dist.broadcast(t, 0)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def reduce_counts(d: Dist, acc: CountAccumulator) -> CountAccumulator:
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


def reduce_q(d: Dist, q: QAccumulator) -> QAccumulator:
    """Sum pass-2 accumulators over ranks."""
    if d.world == 1:
        return q
    d.sum_(q.Qbar)
    d.sum_(q.Delta)
    parts = d.gather([q.n_positions, q.ledger])
    q.n_positions = sum(p[0] for p in parts)
    q.ledger = sorted((e for p in parts for e in p[1]), key=lambda e: e["index"])
    return q


def share_gbar(d: Dist, Gbar: Tensor, device: torch.device) -> Tensor:
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


def device_for(device: str, d: Dist) -> torch.device:
    """cuda -> this rank's GPU (LOCAL_RANK); cpu stays cpu."""
    if device.startswith("cuda") and ":" not in device and d.world > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", d.rank)))
    return torch.device(device)
