"""ctypes binding of ``_sparsecount.c``, the sparse engine's compiled kernels.

Pass 1 (pair codes, the head block, sorted reductions, exact merges) and the sparse products
are the one dispatch: each function runs the C kernel, or its numpy / scipy twin
(``twins.py``) where the library is not built or ``PYTHIA_PROBE_KERNEL=torch`` (``use_c()``),
with the same integers and the same products to float64 rounding. Pass 2 (``sweep``,
``centre_tile``, ``centre``: Eq. 16, tile by tile) exists only here (``require()``): the
sparse engine needs the library; the numpy specification of these kernels is the tests'
oracle (tests/sparse_pass2_oracle.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pythia_probe.errors import KernelError
from pythia_probe.stats import native
from pythia_probe.stats.native import twins

ABI_VERSION = 10
STEM = "_sparsecount"


def library_path() -> Path | None:
    """The built ``_sparsecount`` shared library next to this module, or None."""
    return native.library_path(STEM)


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    lib = native.open_library(STEM, "sc_abi_version", ABI_VERSION)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.sc_pairs.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, i64, ptr, ptr, ptr]
    lib.sc_pairs.restype = i64
    lib.sc_drain.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
    lib.sc_drain.restype = i64
    lib.sc_reduce.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
    lib.sc_reduce.restype = i64
    lib.sc_merge.argtypes = [ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, ptr, ptr, ptr]
    lib.sc_merge.restype = i64
    lib.sc_spmm.argtypes = [i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr,
                            ptr, ctypes.c_double, i64]
    lib.sc_spmm.restype = None
    lib.sc_spgemm_dense.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr,
                                    ptr]
    lib.sc_spgemm_dense.restype = None
    lib.sc_sweep.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, i64, ptr, i64, i64,
                             ptr, ptr, ptr, ptr, ptr]
    lib.sc_sweep.restype = ctypes.c_int
    lib.sc_centre_tile.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i64, ptr, i64, i64, ptr,
                                   ptr, ptr, ptr, i64]
    lib.sc_centre_tile.restype = ctypes.c_int
    lib.sc_centre.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr]
    lib.sc_centre.restype = ctypes.c_int
    lib.sc_touched.argtypes = [ptr, i64]
    lib.sc_touched.restype = i64
    lib.sc_compact.argtypes = [ptr, ptr, i64, ptr, ptr]
    lib.sc_compact.restype = i64
    return lib


def available() -> bool:
    """True when the compiled library is built and loadable."""
    return _lib() is not None


def use_c() -> bool:
    """True when pass 1 and the products run the compiled kernels (else their twins)."""
    return native.wants_c(STEM, available(), "numpy / scipy")


def require() -> None:
    """Pass 2 of the sparse engine runs only here: refuse when the library is not built."""
    if not available():
        raise KernelError(f"the sparse engine needs its C kernels ({STEM}), which "
                          f"{native.REFUSED.get(STEM, 'are not built')}: reinstall with "
                          "`pip install -e .` and a C compiler, or use --engine dense")


def info() -> dict:
    """Which sparse kernels run (recorded in the statistics metadata)."""
    return {"backend": "c" if use_c() else "numpy", "pass2": "c", "library": STEM}


def _p(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _check(rc: int) -> int:
    return native.check(rc, "sparse C kernel")


def _contig(a: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=dtype)


def _need(name: str, a: np.ndarray | None, dtype, size: int | None = None) -> None:
    """The kernels write through raw pointers: refuse a wrong dtype, layout or size."""
    if a is None:
        return
    if a.dtype != dtype or not a.flags.c_contiguous or (size is not None and a.size < size):
        raise KernelError(f"{name}: need a contiguous {np.dtype(dtype)} array of >= "
                                f"{size} entries, got {a.dtype} {a.shape}")


def pairs(tokens: np.ndarray, lengths: np.ndarray, d_vocab: int, tbits: int,
          out: np.ndarray, head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
          ) -> int:
    """Fill ``out`` with the batch's context-pair codes; returns how many. ``head`` =
    (head_of [V], weights w [T], block [H * H]): pairs of two head tokens go to the block."""
    if not use_c():
        return twins.pairs(tokens, lengths, d_vocab, tbits, out, head)
    tokens, lengths = _contig(tokens, np.int64), _contig(lengths, np.int64)
    n, L = tokens.shape
    need = int(((lengths - 1) * lengths // 2).sum())
    if out.size < need or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise KernelError(f"pair buffer holds {out.size} int64, need {need}")
    head_of, w, block = head if head is not None else (None, None, None)
    H = 0
    if head is not None:
        H = int(round(block.size ** 0.5))
        _need("head_of", head_of, np.int64, d_vocab)
        _need("w", w, np.int64, L - 1)
        _need("block", block, np.int64, H * H)
    return _check(_lib().sc_pairs(_p(tokens), n, L, _p(lengths), d_vocab, tbits, _p(head_of),
                                  H, _p(w), _p(block), _p(out)))


def drain(block: np.ndarray, head_ids: np.ndarray, d_vocab: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(keys, raw sums) of the head block's non-zero entries in key order; zeroes the block.
    head_ids ascending, so (context, target) head order is key order."""
    if not use_c():
        return twins.drain(block, head_ids, d_vocab)
    H = head_ids.size
    _need("block", block, np.int64, H * H)
    _need("head_ids", head_ids, np.int64, H)
    keys, lo = np.empty(H * H, dtype=np.int64), np.empty(H * H, dtype=np.int64)
    c = _lib().sc_drain(_p(block), H, _p(head_ids), d_vocab, _p(keys), _p(lo))
    return _shrink(keys, c), _shrink(lo, c)


def _shrink(a: np.ndarray, n: int) -> np.ndarray:
    """``a[:n]`` owning its memory, without a copy (realloc shrinks in place)."""
    a.resize(n, refcheck=False)
    return a


def reduce_sorted(codes: np.ndarray, tbits: int, w: np.ndarray,
                  scratch: Callable[[int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, summed weights w[t]) of sorted codes; the kernel writes them into
    ``codes`` and ``lo = scratch(codes.size)`` (views of their first entries are returned)."""
    if not use_c():
        return twins.reduce_sorted(codes, tbits, w)
    lo = scratch(codes.size)
    _need("lo", lo, np.int64, codes.size)
    w = _contig(w, np.int64)
    u = _lib().sc_reduce(_p(codes), codes.size, tbits, _p(w), _p(codes), _p(lo))
    return codes[:u], lo[:u]


def merge(a: tuple[np.ndarray, ...], b: tuple[np.ndarray | None, ...], frac_bits: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two sorted fixed-point tables (keys, hi, lo); exact, carried. b's hi may be
    None (zeros: a raw run of sums)."""
    if not use_c():
        return twins.merge(a, b)
    a = tuple(_contig(x, np.int64) for x in a)
    b = tuple(None if x is None else _contig(x, np.int64) for x in b)
    n = a[0].size + b[0].size
    out = tuple(np.empty(n, dtype=np.int64) for _ in range(3))
    o = _lib().sc_merge(*map(_p, a), a[0].size, *map(_p, b), b[0].size, frac_bits,
                        *map(_p, out))
    return tuple(_shrink(x, o) for x in out)


class Correction(NamedTuple):
    """The rank-one term and scale of a product (A @ X - u v^T) * scale: ``u`` None means
    ones, ``v`` None no rank-one term."""

    u: np.ndarray | None = None
    v: np.ndarray | None = None
    scale: float = 1.0


def _in_parts(part: Callable[[int], None], threads: int) -> None:
    """``part(0..threads-1)``, in a thread each when more than one (ctypes releases the GIL)."""
    if threads == 1:
        part(0)
        return
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(part, range(threads)))


def spmm(a: tuple[np.ndarray, np.ndarray, np.ndarray], X: np.ndarray, threads: int = 1,
         transposed: bool = False, correction: Correction | None = None,
         x_transposed: bool = False) -> np.ndarray:
    """(A @ X - u v^T) * scale (``correction``) for a CSR matrix A = (int64 indptr, int64 col,
    float64 val) and dense X [*, w]; ``transposed``: the result's transpose, [w, rows]
    contiguous; ``x_transposed``: X is given as its transpose [w, *] (the same sums, no
    transposed copy made). Threads split the columns (blocks of 32).

    The caller guarantees 0 <= col < X's rows (checked once where the CSR is built)."""
    if not use_c():
        return twins.spmm(a, X, transposed, correction or Correction(), x_transposed)
    (indptr, col, val), (u, v, scale) = a, correction or Correction()
    X = _contig(X, np.float64)
    nx, w = (X.shape[1], X.shape[0]) if x_transposed else X.shape
    rows = indptr.size - 1
    _need("indptr", indptr, np.int64)
    _need("col", col, np.int64, int(indptr[-1]))
    _need("val", val, np.float64, int(indptr[-1]))
    u = None if u is None else _contig(u, np.float64)
    v = None if v is None else _contig(v, np.float64)
    _need("u", u, np.float64, rows)
    _need("v", v, np.float64, w)
    out = np.empty((w, rows) if transposed else (rows, w), dtype=np.float64)
    lib = _lib()
    blocks = -(-w // 32)
    threads = max(1, min(threads, blocks))
    cuts = [min(w, 32 * (blocks * i // threads)) for i in range(threads + 1)]

    def part(i: int) -> None:  # ctypes releases the GIL: column blocks run in parallel
        pack = np.empty(nx * 32, dtype=np.float64)
        lib.sc_spmm(rows, _p(indptr), _p(col), _p(val), _p(X), nx, w, cuts[i],
                    cuts[i + 1], _p(pack), _p(out), int(transposed), _p(u), _p(v),
                    float(scale), int(x_transposed))

    _in_parts(part, threads)
    return out


def spgemm_dense(a: tuple[np.ndarray, np.ndarray, np.ndarray],
                 b: tuple[np.ndarray, np.ndarray, np.ndarray], ncols: int,
                 threads: int = 1, u: np.ndarray | None = None,
                 v: np.ndarray | None = None) -> np.ndarray:
    """A @ B - u v^T as a dense [rows of A, ncols] float64 array for CSR matrices A = (int64
    indptr, int64 col, float64 val) and B = (int64 indptr, int32 col, float64 val) whose rows
    are A's columns (u, v None: no correction); each entry is -u[r] v[a], then the products
    added in the order of A's entries, then B's. Threads split A's rows.

    The caller guarantees A's columns index B's rows and B's columns are < ncols."""
    if not use_c():
        return twins.spgemm_dense(a, b, ncols, u, v)
    (ai, ac, av), (bi, bc, bv) = a, b
    rows = ai.size - 1
    u = None if u is None else _contig(u, np.float64)
    v = None if v is None else _contig(v, np.float64)
    if (u is None) != (v is None):
        raise KernelError("spgemm_dense: give both u and v, or neither")
    _need("u", u, np.float64, rows)
    _need("v", v, np.float64, ncols)
    for name, x, dt, size in (("a_indptr", ai, np.int64, None),
                              ("a_col", ac, np.int64, int(ai[-1])),
                              ("a_val", av, np.float64, int(ai[-1])),
                              ("b_indptr", bi, np.int64, None),
                              ("b_col", bc, np.int32, int(bi[-1])),
                              ("b_val", bv, np.float64, int(bi[-1]))):
        _need(name, x, dt, size)
    out = np.empty((rows, ncols))
    lib = _lib()
    threads = max(1, min(threads, rows))
    cuts = [rows * i // threads for i in range(threads + 1)]

    def part(i: int) -> None:  # ctypes releases the GIL: row blocks run in parallel
        lib.sc_spgemm_dense(cuts[i], cuts[i + 1], _p(ai), _p(ac), _p(av), _p(bi), _p(bc),
                            _p(bv), ncols, _p(out), _p(u), _p(v))

    _in_parts(part, threads)
    return out


class TokenWindows(NamedTuple):
    """The windows pass 2 reads: tokens int32 [n, L] (C order), lengths int64 [n] (how many
    tokens of each row count)."""

    tokens: np.ndarray
    lengths: np.ndarray


class Tile(NamedTuple):
    """One tile of pass 2 as the kernels read it: ``occ`` the context positions s * L + k of
    its key tokens (int64, by token), ``col_of`` [V] a key token's column in the tile (-1
    outside it), ``row_of`` [V] a token's Qbar row (None: the token id), ``side`` the block's
    rows per key, ``dummy`` the row of tokens outside the top-k (-1: none)."""

    occ: np.ndarray
    col_of: np.ndarray
    row_of: np.ndarray | None
    side: int
    dummy: int


def sweep(windows: TokenWindows, tile: Tile, GcT: np.ndarray, sums, block: np.ndarray,
          touched: np.ndarray) -> None:
    """One tile of pass 2 (``_sparsecount.c``: sc_sweep), in place: ``sums`` (pass 2's running
    sums, ``second.TileSums``: S [n * (L - 1)] per position, Delta [L - 1] and Dc, its
    compensation) and the tile's Qbar block [width, side] (``touched``, a uint64 bitmap of the
    block: bit j of the whole marks entry j, set where a pair landed)."""
    (tokens, lengths), (occ, col_of, row_of, side, dummy) = windows, tile
    S, Delta, Dc = sums.S, sums.Delta, sums.Dc
    n, L = tokens.shape
    V, w = GcT.shape[1], GcT.shape[0]
    for name, a, dt, size in (("tokens", tokens, np.int32, n * L),
                              ("lengths", lengths, np.int64, n), ("occ", occ, np.int64, None),
                              ("col_of", col_of, np.int64, V), ("GcT", GcT, np.float64, None),
                              ("row_of", row_of, np.int64, V),
                              ("S", S, np.float64, n * (L - 1)),
                              ("Delta", Delta, np.float64, L - 1), ("Dc", Dc, np.float64, L - 1),
                              ("block", block, np.float64, w * side),
                              ("touched", touched, np.uint64, bitmap_words(w * side))):
        _need(name, a, dt, size)
    _check(_lib().sc_sweep(_p(tokens), n, L, _p(lengths), _p(occ), occ.size, _p(col_of),
                           _p(GcT), V, _p(row_of), side, dummy, _p(S), _p(Delta), _p(Dc),
                           _p(block), _p(touched)))


def centre_tile(windows: TokenWindows, tile: Tile, S: np.ndarray, block: np.ndarray,
                flat: np.ndarray, vals: np.ndarray) -> None:
    """The centring term of Q subtracted from one tile's kept entries (places ``flat``,
    values ``vals``, updated in place) through the cleared block (sc_centre_tile)."""
    (tokens, lengths), (occ, col_of, row_of, side, dummy) = windows, tile
    n, L = tokens.shape
    V = col_of.size
    for name, a, dt, size in (("tokens", tokens, np.int32, n * L),
                              ("lengths", lengths, np.int64, n), ("occ", occ, np.int64, None),
                              ("col_of", col_of, np.int64, V), ("row_of", row_of, np.int64, V),
                              ("S", S, np.float64, n * (L - 1)),
                              ("block", block, np.float64, None), ("flat", flat, np.int32, None),
                              ("vals", vals, np.float64, flat.size)):
        _need(name, a, dt, size)
    width = int(col_of.max()) + 1 if col_of.size else 0
    if block.size < width * side or (flat.size and not 0 <= int(flat[0]) <= int(flat[-1])
                                     < block.size):
        raise KernelError(f"block: need a contiguous float64 array of >= {width * side} "
                          f"entries holding every kept place, got {block.size}")
    _check(_lib().sc_centre_tile(_p(tokens), n, L, _p(lengths), _p(occ), occ.size, _p(col_of),
                                 V, _p(row_of), side, dummy, _p(S), _p(block), _p(flat),
                                 _p(vals), flat.size))


def centre(windows: TokenWindows, sums, rows: tuple[int, int] | None = None) -> None:
    """The centring term of Q subtracted from ``sums``' Delta for sequences ``rows`` (default
    all)."""
    tokens, lengths = windows
    S, Delta, Dc = sums.S, sums.Delta, sums.Dc
    n, L = tokens.shape
    for name, a, dt, size in (("tokens", tokens, np.int32, n * L),
                              ("lengths", lengths, np.int64, n),
                              ("S", S, np.float64, n * (L - 1)),
                              ("Delta", Delta, np.float64, L - 1), ("Dc", Dc, np.float64, L - 1)):
        _need(name, a, dt, size)
    s0, s1 = rows if rows is not None else (0, n)
    _check(_lib().sc_centre(_p(tokens), s0, s1, L, _p(lengths), _p(S), _p(Delta), _p(Dc)))


def bitmap_words(n: int) -> int:
    """uint64 words of a bitmap of n entries."""
    return -(-n // 64)


def compact(block: np.ndarray, touched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(places int32, values) of the block entries the pairs reached (bits of the uint64
    bitmap ``touched``), ascending; the block and the bitmap are cleared there (one pass
    each over the bitmap, sc_touched + sc_compact)."""
    _need("block", block, np.float64)
    _need("touched", touched, np.uint64, bitmap_words(block.size))
    lib = _lib()
    n = int(lib.sc_touched(_p(touched), bitmap_words(block.size)))
    flat, vals = np.empty(n, dtype=np.int32), np.empty(n)
    got = int(lib.sc_compact(_p(block), _p(touched), block.size, _p(flat), _p(vals)))
    if got != n:
        raise KernelError(f"sparse C kernel: compaction found {got} entries, counted {n}")
    return flat, vals
