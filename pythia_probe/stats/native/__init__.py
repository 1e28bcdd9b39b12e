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
import struct
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


DIR = Path(__file__).resolve().parent
"""Where the built libraries are looked for (the tests point it at planted copies)."""
REFUSED: dict[str, str] = {}
"""Why a library that is there was not loaded (the one warning says it)."""


def library_path(stem: str) -> Path | None:
    """A built shared library ``stem`` in :data:`DIR`, or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = DIR / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None


def open_library(stem: str, abi_symbol: str, abi_version: int) -> ctypes.CDLL | None:
    """The C library ``stem`` loaded with ctypes when it is built, whole (:func:`elf_fault`:
    a truncated file would kill the process with SIGBUS once mapped) and speaks
    ``abi_version`` through ``abi_symbol``; else None (the caller falls back to its torch /
    numpy kernels, said once by :func:`wants_c`, with the reason in :data:`REFUSED`)."""
    path = library_path(stem)
    if path is None:
        return None
    why = elf_fault(path)
    try:
        lib = None if why else ctypes.CDLL(str(path))
        version = None if why else getattr(lib, abi_symbol)
    except OSError as e:
        why = f"cannot be loaded ({e})"
    except AttributeError:
        why = f"has no {abi_symbol} (another library under its name?)"
    if not why:
        version.restype = ctypes.c_int64
        got = version()
        why = None if got == abi_version else f"speaks ABI {got}, this code {abi_version}"
    if why:
        REFUSED[stem] = f"at {path} {why}"
        return None
    return lib


def elf_fault(path: Path) -> str | None:
    """Why the 64-bit ELF file ``path`` is not whole (None: it is, or it is another format):
    every loaded segment and the section header table must lie inside the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4:5] not in (b"\x02", b""):
            return None  # not a 64-bit ELF file: dlopen decides (an OSError: not loaded)
        if len(head) < 64:
            return f"is truncated ({size} bytes)"
        order = "<" if head[5] == 1 else ">"
        phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    end = shoff + shentsize * shnum
    if len(table) == phentsize * phnum:
        for i in range(phnum):
            kind, _, offset = struct.unpack_from(order + "IIQ", table, i * phentsize)
            filesz = struct.unpack_from(order + "Q", table, i * phentsize + 32)[0]
            end = max(end, offset + filesz) if kind == 1 else end  # PT_LOAD
    else:
        end = phoff + phentsize * phnum
    return None if end <= size else f"is truncated ({size} bytes, its headers need {end})"


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
            raise KernelError(f"PYTHIA_PROBE_KERNEL=c, but the C kernel {library} "
                              f"{REFUSED.get(library, 'is not built')} "
                              "(reinstall with `pip install -e .` and a C compiler, or use "
                              "PYTHIA_PROBE_KERNEL=torch)")
        log_fallback(library, instead)
    return available


@cache
def log_fallback(library: str, instead: str) -> None:
    """Say once per process that a C library is not built and what runs instead."""
    log.warning("the C kernel %s %s: using the %s kernels (same numbers, slower); "
                "`pip install -e .` with a C compiler builds it", library,
                REFUSED.get(library, "is not built"), instead)


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
