"""Multiply-adds per second of the two kinds of product a sweep step is made of, measured on
the scoring device now (so a plan's expected seconds per step are this machine's, never typed
in): ``dense`` a square GEMM in the compute dtype, ``sparse`` a CSR matrix (random, ``density``
non-zeros per row) times a dense [n, k] block, the shape of a factored target's product.

Each is timed as the best of ``repeats`` after one warm-up, well under a second in all.
"""

from __future__ import annotations

import time
import warnings

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


def dense_rate(device="cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
               repeats: int = 3) -> float:
    """Multiply-adds per second of an n x n x n GEMM."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    A = torch.randn(n, n, generator=g, device=device, dtype=dtype)
    B = torch.randn(n, n, generator=g, device=device, dtype=dtype)
    return n ** 3 / _best(lambda: A @ B, device, repeats)


def sparse_rate(device="cpu", dtype: torch.dtype = torch.float32, n: int = 8000,
                per_row: int = 16, k: int = 257, repeats: int = 3) -> float:
    """Multiply-adds per second of CSR [n, n] (``per_row`` non-zeros a row) times [n, k]."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(1)
    cols = torch.randint(0, n, (n * per_row,), generator=g)
    crow = torch.arange(0, n * per_row + 1, per_row)
    cols = cols.view(n, per_row).sort(dim=1).values.reshape(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        S = torch.sparse_csr_tensor(crow, cols, torch.rand(n * per_row, generator=g,
                                                           dtype=torch.float64).to(dtype),
                                    size=(n, n)).to(device)
    X = torch.randn(n, k, generator=g, dtype=torch.float64).to(device, dtype)
    return n * per_row * k / _best(lambda: S @ X, device, repeats)


def measure(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """{"dense": ..., "sparse": ...} multiply-adds per second on ``device`` in ``dtype``; on
    the CPU the sparse product has the shape of one column tile of a factored target's
    products (32,768 rows of 64 non-zeros times [32,768, 128], as in factored.Parts.tiled).
    ``host_dense``, ``host_sparse``: the host's float64 rates, those of the targets'
    once-per-statistics norms (smaller products: a few milliseconds)."""
    host = {"host_dense": dense_rate("cpu", torch.float64, n=256),
            "host_sparse": sparse_rate("cpu", torch.float64, n=8192, per_row=16, k=128)}
    if torch.device(device).type == "cpu":
        return {"dense": dense_rate(device, dtype),
                "sparse": sparse_rate(device, dtype, n=32768, per_row=64, k=128), **host}
    return {"dense": dense_rate(device, dtype), "sparse": sparse_rate(device, dtype), **host}
