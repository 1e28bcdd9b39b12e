"""The dense engine's first pass: Bbar and Phibar from the pass-1 counts, then SigmaB and Gbar
(row-tiled float64 matmuls under a memory budget; offloaded to the host when a GPU cannot hold
them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.planner.budget import memory_budget
from pythia_probe.stats import compose
from pythia_probe.stats.dense.count import CountAccumulator

TILE_ROWS = 1 << 10


@dataclass
class FirstPass:
    """Final pass-1 matrices (float64) and the accumulator's identity."""

    Bbar: Tensor
    Phibar: Tensor
    SigmaB: Tensor | None
    Gbar: Tensor
    token_counts: Tensor
    n_positions: int
    n_sequences: int
    n_tokens: int
    checksum: list[int]
    factors: Any = None
    """The pass-1 counts where they are non-zero (``stats/factors.py``): the statistics."""
    GbarHead: Tensor | None = None
    """Bbar^T Phibar^T Bbar^T (pass 2's QbarHead; made by ``DenseEngine.first_pass``)."""
    device: str | None = None
    """The device type the compositions ran on (recorded in the metadata)."""


def bbar_phibar(acc: CountAccumulator, consume: bool = False) -> tuple[Tensor, Tensor]:
    """Bbar = counts/P - rowsum/(P V); Phibar = (W - 1 colsum(W)^T / V) / P, W the context sums.

    consume=True writes the float64 results into the accumulator's own int64 storage (no extra
    memory; the accumulator is unusable afterwards).
    """
    V, P = acc.d_vocab, acc.n_positions
    if P == 0:
        raise BadInputError("no positions were counted (empty corpus or every document skipped)")
    acc.context.normalize()
    big = acc.bigram.view(V, V)
    rowsum = big.sum(1).double()
    hi, lo = acc.context.hi.view(V, V), acc.context.lo.view(V, V)
    colsum = hi.sum(0).double() + lo.sum(0).double() * 2.0 ** -acc.context.F
    B = big.view(torch.float64) if consume else torch.empty(V, V, dtype=torch.float64,
                                                             device=big.device)
    Phi = hi.view(torch.float64) if consume else torch.empty_like(B)
    for sl in compose.slices(V, TILE_ROWS):
        B[sl] = big[sl].double() / P - (rowsum[sl] / (P * V))[:, None]
        W = hi[sl].double() + lo[sl].double() * 2.0 ** -acc.context.F
        Phi[sl] = (W - colsum[None, :] / V) / P
    if consume:
        acc.release()
    return B, Phi


def first_pass(acc: CountAccumulator, *, consume: bool = False,
               device: str | torch.device | None = None, budget_bytes: int | None = None,
               offload: bool | None = None) -> FirstPass:
    """Finalize pass 1: Bbar, Phibar, then SigmaB and Gbar at full vocabulary (tiled).

    offload: keep the V x V results in host memory and use ``device`` only for matmul tiles
    (default: when a CUDA device could not hold six V x V float64 matrices; see MEMORY.md).
    """
    checksum = acc.checksum()
    counts = acc.token_counts.clone()
    n = (acc.n_positions, acc.n_sequences, acc.n_tokens)
    dev = torch.device(device) if device is not None else acc.device
    host = needs_offload(acc.d_vocab, dev) if offload is None else offload
    Bbar, Phibar = bbar_phibar(acc, consume=consume)
    if host:
        Bbar, Phibar = Bbar.cpu(), Phibar.cpu()
    kw = {"device": dev, "budget_bytes": budget_bytes, "out_device": "cpu" if host else dev}
    SigmaB = compose.sigma_b(Bbar, **kw)
    Gbar = compose.g_bar(SigmaB, Phibar, **kw)
    return FirstPass(Bbar, Phibar, SigmaB, Gbar, counts, *n, checksum)


def needs_offload(d_vocab: int, device: torch.device) -> bool:
    """True when a CUDA device's memory budget cannot hold six V x V float64 matrices."""
    if device.type != "cuda":
        return False
    limit, _ = memory_budget(str(device))
    return limit is None or 6 * 8 * d_vocab * d_vocab > limit
