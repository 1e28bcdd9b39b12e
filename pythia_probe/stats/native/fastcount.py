"""ctypes binding of ``_fastcount.c``: the dense engine's pass-1 context counts on the CPU.

``available()`` says whether the library loaded; ``use_c()`` whether the dense engine calls it
now (the backend switch of :mod:`pythia_probe.stats.native`); otherwise the torch kernel of
``stats/dense/kernels.py`` runs, with the same integers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from pythia_probe.errors import KernelError
from pythia_probe.stats import native
from pythia_probe.stats.fixedpoint import context_weights

ABI_VERSION = 4
STEM = "_fastcount"


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    lib = native.open_library(STEM, "fc_abi_version", ABI_VERSION)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.fc_context.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr]
    lib.fc_context.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True when the compiled library is built and loadable."""
    return _lib() is not None


def use_c() -> bool:
    """True when the dense engine's pass 1 runs the compiled kernel (CPU tensors)."""
    return native.wants_c(STEM, available(), "torch")


def runs_on(device: str) -> bool:
    """Whether pass 1's context counts on ``device`` run the compiled kernel (the planner
    sizes the torch kernels' pair workspace otherwise)."""
    return device == "cpu" and use_c()


def count_context(lo: Tensor, tokens: Tensor, lengths: Tensor, d_vocab: int,
                  torch_kernel: Callable[[], None]) -> None:
    """The one dispatch of pass 1's context weights: the compiled kernel on the CPU (an int64
    contiguous accumulator) when chosen, else ``torch_kernel()`` (``stats/dense/kernels.py``,
    any device, the same integers)."""
    if tokens.device.type == "cpu" and lo.dtype == torch.int64 and lo.is_contiguous() \
            and use_c():
        add_context(lo, tokens.to(torch.int64).contiguous(),
                    lengths.to(torch.int64).contiguous(), d_vocab,
                    context_weights(tokens.shape[1] - 1, tokens.device))
    else:
        torch_kernel()


def info() -> dict:
    """What counted pass 1 (recorded in the statistics metadata)."""
    return {"backend": "c" if use_c() else "torch", "library": STEM if use_c() else None}


def add_context(lo: Tensor, tokens: Tensor, lengths: Tensor, d_vocab: int, w: Tensor) -> None:
    """lo[y_t * V + x_m] += w[t] for every m <= t < lengths - 1 (contiguous CPU tensors)."""
    n, L = tokens.shape
    if lo.numel() != d_vocab * d_vocab or w.numel() < L - 1:
        raise KernelError(f"accumulator has {lo.numel()} entries, need d_vocab^2 = "
                          f"{d_vocab * d_vocab}; weights {w.numel()}, need {L - 1}")
    native.check(_lib().fc_context(tokens.data_ptr(), n, L, lengths.data_ptr(), d_vocab,
                                   w.data_ptr(), lo.data_ptr()), "C kernel")
