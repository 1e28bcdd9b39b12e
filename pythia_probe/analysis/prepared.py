"""Prepared target matrices on disk, streamed in row blocks so no V x V matrix stays in RAM.

A :class:`~pythia_probe.analysis.cosine.Target` keeps the statistic T [V, V] resident and
rebuilds each column chunk of C_T (T row-normalised, row-centred) on the fly. For the sweep the
target side depends only on the statistics, so it is prepared ONCE per statistics file and
written to a cache file: C_T^T (row j = column j of C_T, exactly the values ``Target.columns``
produces, in the compute dtype) plus ||C_T C_T^T||_F and the chance level's terms
(``trace`` = ||C_T||_F^2, ``total`` = ||C_T^T 1||^2, and for its spread the four non-zero
``null_terms``, :mod:`pythia_probe.analysis.chance`) in the metadata, keyed by ``stats_id``
(the statistics' content identity). Per checkpoint :class:`StreamedTarget` reads row blocks of
C_T^T (= column blocks of C_T) into one reused buffer with plain file reads, so the
per-checkpoint peak is the model's factors + one ``chunk x V`` block (measured in
benchmarks/bench_analysis.py).

The cache file is a valid safetensors file (tensor ``CT_T`` [V, V], metadata ``stats_id``,
``name``, ``norm``, ``trace``, ``total``, ``null_rowsum_sq``, ``null_frob_sq``,
``null_diag_rowsum``, ``null_diag_sq``, ``dtype``, ``format`` and ``sha256``, the digest of the
tensor's bytes) written block by block, atomically. :func:`cached_target` reuses a file only
when its header matches and its bytes hash to the recorded digest (checked once per run, before
use); a file that fails is rebuilt, never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from pythia_probe.analysis.chance import Primitives, null_from_meta, null_meta
from pythia_probe.analysis.cosine import DEFAULT_CHUNK, Target, blocked_grams, prepare_target
from pythia_probe.errors import BadInputError, CorruptFileError
from pythia_probe.fileio import atomic_write

log = logging.getLogger(__name__)

FORMAT = "pythia_probe.prepared_target/4"  # /3: trace, total (chance); /4: null terms
TENSOR = "CT_T"
_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16"}
_DTYPES = {v: k for k, v in _CODES.items()}
_PLACEHOLDER = "0" * 64  # the digest's place in the header, filled in once the data is written


@dataclass(frozen=True)
class StreamedTarget:
    """A target matrix prepared on disk: C_T^T at ``path``, streamed per column block of C_T."""

    name: str
    path: Path
    norm: float
    trace: float
    total: float
    d_vocab: int
    dtype: torch.dtype
    stats_id: str
    data_offset: int
    device: str | torch.device = "cpu"
    sha256: str | None = None
    null_terms: Primitives | None = None

    def column_blocks(self, chunk: int = DEFAULT_CHUNK) -> Iterator[tuple[int, Tensor]]:
        """(s, C_T[:, s:s+chunk]) for every column block; each block is valid until the next."""
        V = self.d_vocab
        buf = torch.empty(min(chunk, V), V, dtype=self.dtype)
        row_bytes = V * buf.element_size()
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.data_offset)
            for s in range(0, V, chunk):
                block = buf[:min(chunk, V - s)]
                read_into(f, block, row_bytes * block.shape[0])
                yield s, block.to(self.device).T

    def grams(self, F: Tensor, edges: Sequence[int], chunk: int = DEFAULT_CHUNK) -> list[Tensor]:
        """Diagonal blocks of (F^T C_T)(F^T C_T)^T over the streamed column blocks."""
        return blocked_grams(F, edges, self.column_blocks(chunk))


def read_into(f, block: Tensor, nbytes: int) -> None:
    """Fill the first ``nbytes`` of contiguous CPU tensor ``block`` from binary file ``f``."""
    view = memoryview(block.view(torch.uint8).numpy()).cast("B")
    got = 0
    while got < nbytes:
        n = f.readinto(view[got:nbytes])
        if not n:
            raise CorruptFileError(f"{f.name}: truncated prepared-target file; delete it to "
                                   "rebuild")
        got += n


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(safetensors header dict, byte offset of the data) of a file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def open_prepared(path: str | os.PathLike, device: str | torch.device = "cpu") -> StreamedTarget:
    """Open a cache file written by :func:`write_prepared` (reads the header only)."""
    header, offset = read_header(path)
    meta, info = header.get("__metadata__", {}), header.get(TENSOR)
    if meta.get("format") != FORMAT or info is None:
        raise BadInputError(f"{path} is not a prepared-target file ({FORMAT})")
    V = info["shape"][0]
    null = null_from_meta(meta)
    return StreamedTarget(meta["name"], Path(path), float(meta["norm"]), float(meta["trace"]),
                          float(meta["total"]), V,
                          _DTYPES[info["dtype"]], meta["stats_id"],
                          offset + info["data_offsets"][0], device, meta.get("sha256"), null)


def write_prepared(th: Target, path: str | os.PathLike, stats_id: str,
                   chunk: int = DEFAULT_CHUNK) -> Path:
    """Write C_T^T of ``th`` block by block (peak O(V * chunk)), atomically, as safetensors,
    with the sha256 of the tensor bytes in the header (written in place once they are known)."""
    path, V = Path(path), th.d_vocab
    itemsize = torch.empty((), dtype=th.dtype).element_size()
    meta = {"format": FORMAT, "name": th.name, "stats_id": str(stats_id), "norm": repr(th.norm),
            "trace": repr(th.trace), "total": repr(th.total),
            **null_meta(th.null_terms),
            "dtype": str(th.dtype).removeprefix("torch."), "sha256": _PLACEHOLDER}
    header = {"__metadata__": meta, TENSOR: {"dtype": _CODES[th.dtype], "shape": [V, V],
                                             "data_offsets": [0, V * V * itemsize]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    where = 8 + raw.index(_PLACEHOLDER.encode())

    def write(tmp: Path) -> None:
        digest = hashlib.sha256()
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for s in range(0, V, chunk):
                data = th.columns(s, s + chunk).T.contiguous().cpu().numpy().tobytes()
                digest.update(data)
                f.write(data)
            f.seek(where)
            f.write(digest.hexdigest().encode())

    return atomic_write(path, write, V * V * itemsize)


def data_digest(p: StreamedTarget) -> str:
    """sha256 of the tensor bytes of a prepared-target file (read in 4 MiB blocks)."""
    h = hashlib.sha256()
    with open(p.path, "rb") as f:
        f.seek(p.data_offset)
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def cache_path(cache_dir: str | os.PathLike, name: str, dtype: torch.dtype) -> Path:
    """Where the prepared target ``name`` in ``dtype`` lives inside ``cache_dir``."""
    return Path(cache_dir) / f"{name}-{str(dtype).removeprefix('torch.')}.safetensors"


def check_cached(path: Path, name: str, stats_id: str, dtype: torch.dtype) -> str | None:
    """Why the cache file at ``path`` cannot be used for (name, stats_id, dtype), or None when it
    can: header of this format and these inputs, full size, bytes matching their digest."""
    if not path.is_file():
        return "not built yet"
    try:
        p = open_prepared(path)
    except (OSError, ValueError, KeyError, struct.error, json.JSONDecodeError, UnicodeError):
        return "not a prepared-target file of this version"
    if (p.name, p.stats_id, p.dtype) != (name, str(stats_id), dtype):
        return f"built for other inputs ({p.name}, stats {p.stats_id}, {p.dtype})"
    nbytes = p.d_vocab**2 * torch.empty((), dtype=p.dtype).element_size()
    if path.stat().st_size != p.data_offset + nbytes:
        return "truncated"
    if p.sha256 is None or data_digest(p) != p.sha256:
        return "its bytes do not match their recorded sha256 (damaged)"
    return None


def cached_target(name: str, get_T: Callable[[], Tensor], cache_dir: str | os.PathLike,
                  stats_id: str, *, dtype: torch.dtype = torch.float64,
                  device: str | torch.device = "cpu",
                  chunk: int = DEFAULT_CHUNK) -> StreamedTarget:
    """The cached prepared target ``name``; built (V^3, once) if missing, for other statistics,
    or damaged (see :func:`check_cached`).

    ``get_T`` returns the [V, V] statistic and is only called when the cache must be (re)built.
    """
    if dtype not in _CODES:
        raise BadInputError(f"prepared target dtype {dtype} not supported; valid: "
                            f"{', '.join(str(d) for d in _CODES)}")
    path = cache_path(cache_dir, name, dtype)
    why = check_cached(path, name, stats_id, dtype)
    if why is not None:
        if path.exists():
            log.warning("prepared-target cache %s: %s; rebuilding it", path, why)
        th = prepare_target(name, get_T(), dtype=dtype, device=device, chunk=chunk)
        write_prepared(th, path, stats_id, chunk)
        del th
    return open_prepared(path, device)
