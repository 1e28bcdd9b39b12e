"""ctypes binding of the compiled CPU counting kernels (``_fastcount.c``).

The shared library is built at install time (``setup.py``: ``pip install -e .`` builds it in
place next to this file; it is optional, so an install without a C compiler still succeeds).
``available()`` says whether it loaded; ``kernels.py`` falls back to its torch kernels when it
did not, on non-CPU devices, and when ``PYTHIA_PROBE_KERNEL=torch``.

The pass-2 centre sum reproduces torch's CPU summation order (ATen ``cascade_sum``), whose
vector width depends on the CPU capability torch dispatched to; ``centre_lanes()`` finds it by
comparing with ``torch.sum`` once per process (0 = no match found: a plain left-to-right sum,
equal to torch's within float64 rounding).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from pythia_probe.errors import KernelError

ABI_VERSION = 3
_ERRORS = {-1: "lengths must satisfy 2 <= length <= T+1",
           -2: "a token id is outside the vocabulary 0..d_vocab-1",
           -3: "out of memory for the kernel's scratch buffers"}


def library_path(stem: str = "_fastcount") -> Path | None:
    """A built shared library ``stem`` next to this module, or None."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None


def open_library(stem: str, abi_symbol: str, abi_version: int) -> ctypes.CDLL | None:
    """The C library ``stem`` loaded with ctypes when it is built and speaks ``abi_version``
    (else None: the caller falls back to its torch / numpy kernels)."""
    path = library_path(stem)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    version = getattr(lib, abi_symbol)
    version.restype = ctypes.c_int64
    return lib if version() == abi_version else None


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    lib = open_library("_fastcount", "fc_abi_version", ABI_VERSION)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.fc_context.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr]
    lib.fc_context.restype = ctypes.c_int
    lib.fc_q.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, i64, ptr, ptr, i64]
    lib.fc_q.restype = ctypes.c_int
    lib.fc_torch_sum.argtypes = [ptr, i64, i64]
    lib.fc_torch_sum.restype = ctypes.c_double
    return lib


def available() -> bool:
    """True when the compiled kernel library is built and loadable."""
    return _lib() is not None


def torch_sum(v: Tensor, lanes: int) -> float:
    """The C emulation of torch.sum over a contiguous float64 vector (for checks)."""
    v = v.contiguous()
    return float(_lib().fc_torch_sum(v.data_ptr(), v.numel(), lanes))


@lru_cache(maxsize=1)
def centre_lanes() -> int:
    """Vector width (doubles) under which the C centre sum equals torch.sum bit for bit.

    Compared on rows of every length 1..160 of a [3, P] matrix summed the way kernels.add_q
    does it (torch.sum over a column slice, dim 1); 0 when no width matches.
    """
    g = torch.Generator().manual_seed(12345)
    n, lens = 3, range(1, 161)
    M = torch.randn(n, sum(lens), dtype=torch.float64, generator=g)
    M *= 10.0 ** (torch.rand(M.shape, generator=g, dtype=torch.float64) * 16 - 8)
    offs, off = [], 0
    for length in lens:
        offs.append(off)
        off += length
    want = [torch.sum(M[:, o:o + k], 1) for o, k in zip(offs, lens, strict=True)]
    for lanes in (8, 4, 16, 2):
        if all(torch_sum(M[i, o:o + k], lanes) == float(w[i])
               for o, k, w in zip(offs, lens, want, strict=True) for i in range(n)):
            return lanes
    return 0


def _check(rc: int) -> None:
    if rc != 0:
        raise KernelError(f"C kernel: {_ERRORS.get(rc, f'error code {rc}')}")


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def add_context(lo: Tensor, tokens: Tensor, lengths: Tensor, d_vocab: int, w: Tensor) -> None:
    """lo[y_t * V + x_m] += w[t] for every m <= t < lengths - 1 (contiguous CPU tensors)."""
    n, L = tokens.shape
    if lo.numel() != d_vocab * d_vocab or w.numel() < L - 1:
        raise KernelError(f"accumulator has {lo.numel()} entries, need d_vocab^2 = "
                              f"{d_vocab * d_vocab}; weights {w.numel()}, need {L - 1}")
    _check(_lib().fc_context(tokens.data_ptr(), n, L, lengths.data_ptr(), d_vocab,
                             w.data_ptr(), lo.data_ptr()))


def add_q(Qbar: Tensor, Delta: Tensor, Gc: Tensor, tokens: Tensor, lengths: Tensor,
          d_vocab: int, side: int, row_of: Tensor | None) -> None:
    """Pass 2 scatter of Q into Qbar [side * side] and Delta (contiguous CPU tensors)."""
    n, L = tokens.shape
    if Gc.numel() != d_vocab * d_vocab or Qbar.numel() != side * side or Delta.numel() < L - 1:
        raise KernelError(f"Gc {Gc.numel()} / Qbar {Qbar.numel()} / Delta {Delta.numel()} "
                              f"entries; need {d_vocab}^2 / {side}^2 / >= {L - 1}")
    if row_of is not None and (row_of.numel() != d_vocab or bool((row_of < 0).any())
                               or bool((row_of >= side).any())):
        raise KernelError(f"row_of must map all {d_vocab} ids into 0..{side - 1}")
    _check(_lib().fc_q(tokens.data_ptr(), n, L, lengths.data_ptr(), d_vocab, Gc.data_ptr(),
                       Qbar.data_ptr(), side, _ptr(row_of), Delta.data_ptr(), centre_lanes()))
