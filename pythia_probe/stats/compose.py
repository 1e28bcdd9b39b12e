"""Compositions (SigmaB, Phibar^T Bbar^T, Gbar, GbarHead) by row-tiled matmuls under a memory
budget.

``matmul_tiled(A, B)`` keeps B whole on the compute device and streams row tiles of A through
it, writing each tile of the product to the output's device. With A, B and the output on the
host and a GPU as compute device, device memory is |B| + 2 tiles: 20.2 GB + budget at
|V| = 50,304 (see MEMORY.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pythia_probe.planner.budget import memory_budget
from pythia_probe.planner.statistics import DEFAULT_CPU_BUDGET


def slices(n: int, step: int) -> list[slice]:
    """[0, n) in consecutive slices of at most ``step``."""
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]



def tile_budget(device: torch.device, budget_bytes: int | None) -> int:
    """Bytes allowed for the A and output tiles on ``device``."""
    if budget_bytes is not None:
        return max(int(budget_bytes), 1)
    if device.type == "cuda":
        limit, _ = memory_budget(str(device))
        return max(int(limit or 0) // 4, 1 << 20)
    return DEFAULT_CPU_BUDGET


def matmul_tiled(A: Tensor, B: Tensor, *, device: str | torch.device | None = None,
                 budget_bytes: int | None = None, out_device: str | torch.device | None = None
                 ) -> Tensor:
    """A @ B in float64, row tiles of A on ``device`` (default A's), result on ``out_device``."""
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"cannot multiply {tuple(A.shape)} by {tuple(B.shape)}")
    dev = torch.device(device) if device is not None else A.device
    odev = torch.device(out_device) if out_device is not None else A.device
    Bd = B.to(dev, torch.float64)
    row_bytes = 8 * (A.shape[1] + B.shape[1])
    rows = max(1, tile_budget(dev, budget_bytes) // row_bytes)
    out = torch.empty(A.shape[0], B.shape[1], dtype=torch.float64, device=odev)
    for r in range(0, A.shape[0], rows):
        tile = A[r:r + rows].to(dev, torch.float64)
        out[r:r + rows] = (tile @ Bd).to(odev)
    return out


def sigma_b(Bbar: Tensor, **kw) -> Tensor:
    """SigmaB = Bbar^T Bbar (Eq. 10)."""
    return matmul_tiled(Bbar.T, Bbar, **kw)


def phi_bt(Bbar: Tensor, Phibar: Tensor, **kw) -> Tensor:
    """Phibar^T Bbar^T (value-matrix leading term)."""
    return matmul_tiled(Phibar.T, Bbar.T, **kw)


def g_bar(SigmaB: Tensor, Phibar: Tensor, **kw) -> Tensor:
    """Gbar = SigmaB Phibar."""
    return matmul_tiled(SigmaB, Phibar, **kw)


def g_bar_head(Bbar: Tensor, Phibar: Tensor, **kw) -> Tensor:
    """GbarHead = Bbar^T Phibar^T Bbar^T = Bbar^T PhiBT (pythia-per-head.py's G_bar,
    transposed); PhiBT is held only while it is multiplied."""
    return matmul_tiled(Bbar.T, phi_bt(Bbar, Phibar, **kw), **kw)
