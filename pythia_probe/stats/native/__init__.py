"""The compiled CPU kernels of both statistics engines: one loader, one backend switch, one
error (:class:`~pythia_probe.errors.KernelError`).

``_fastcount.c`` (the dense engine's pass-1 context counts) and ``_sparsecount.c`` (the sparse
engine: pair codes, exact table merges, sparse products, pass 2 tile by tile) are plain C
built at install time next to this file (``setup.py``; optional, so an install without a C
compiler still succeeds) and loaded with ctypes by :func:`open_library`.

The switch ``PYTHIA_PROBE_KERNEL=auto|c|torch`` (or :func:`use_backend`): "auto" runs the C
kernels on the CPU when they are built (else the torch / numpy twins, said once in the log),
"c" insists (a :class:`KernelError` when they are not built), "torch" never uses them.
Each binding's ``info()`` records what ran in the statistics metadata.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from pythia_probe.errors import BadInputError, KernelError

log = logging.getLogger(__name__)
BACKENDS = ("auto", "c", "torch")
_backend = os.environ.get("PYTHIA_PROBE_KERNEL", "auto")
_ERRORS = {-1: "lengths must satisfy 2 <= length <= T+1 (or a context position past it)",
           -2: "a token id is outside the vocabulary 0..d_vocab-1 (or the tile)",
           -3: "out of memory for the kernel's scratch buffers"}


def library_path(stem: str) -> Path | None:
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


def check(rc: int, what: str) -> int:
    """A kernel's return code: negative codes become one KernelError naming ``what``."""
    if rc < 0:
        raise KernelError(f"{what}: {_ERRORS.get(rc, f'error code {rc}')}")
    return rc


def backend() -> str:
    """The requested backend, checked (``PYTHIA_PROBE_KERNEL`` or :func:`use_backend`)."""
    if _backend not in BACKENDS:
        raise BadInputError(f"kernel backend {_backend!r} (PYTHIA_PROBE_KERNEL); valid: "
                            f"{', '.join(BACKENDS)}")
    return _backend


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Temporarily force a kernel backend: "auto" (C on CPU when built), "c" or "torch"."""
    global _backend
    old, _backend = _backend, name
    try:
        backend()
        yield
    finally:
        _backend = old


def wants_c(library: str, available: bool, instead: str) -> bool:
    """Whether to call ``library`` now: the backend allows it and it is built. "c" without
    the library is a KernelError; "auto" without it falls back (said once in the log)."""
    b = backend()
    if b == "torch":
        return False
    if not available:
        if b == "c":
            raise KernelError(f"PYTHIA_PROBE_KERNEL=c, but the C kernel {library} is not built "
                              "(reinstall with `pip install -e .` and a C compiler, or use "
                              "PYTHIA_PROBE_KERNEL=torch)")
        log_fallback(library, instead)
    return available


@cache
def log_fallback(library: str, instead: str) -> None:
    """Say once per process that a C library is not built and what runs instead."""
    log.warning("the C kernel %s is not built: using the %s kernels (same numbers, slower); "
                "`pip install -e .` with a C compiler builds it", library, instead)


@cache
def _malloc_trim():
    """glibc's ``malloc_trim`` (None where the C library has none: not glibc)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Hand the heap's freed memory back to the system (glibc ``malloc_trim(0)``): many
    medium-sized arrays (pass 2's per-tile Qbar parts, a few MB each), once freed, otherwise
    stay in the process's resident memory. A no-op where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
