"""Prepared theory matrices on disk, streamed in row blocks so no V x V matrix stays in RAM.

A :class:`~pythia_probe.analysis.cosine.Theory` keeps the statistic T [V, V] resident and
rebuilds each column chunk of C_T (T row-normalised, row-centred) on the fly. For the sweep the
theory side depends only on the statistics, so it is prepared ONCE per statistics file and
written to a cache file: C_T^T (row j = column j of C_T, exactly the values ``Theory.columns``
produces, in the compute dtype) plus ||C_T C_T^T||_F in the metadata, keyed by ``stats_id``.
Per checkpoint :class:`PreparedTheory` reads row blocks of C_T^T (= column blocks of C_T) into
one reused buffer with plain file reads, so the per-checkpoint peak is the model's factors +
one ``chunk x V`` block (measured in benchmarks/bench_analysis.py).

The cache file is a valid safetensors file (tensor ``CT_T`` [V, V], metadata ``stats_id``,
``name``, ``norm``, ``dtype``, ``format``) written block by block, atomically.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from pythia_probe.analysis.cosine import DEFAULT_CHUNK, Theory, prepare_theory
from pythia_probe.errors import BadInputError, CorruptFileError
from pythia_probe.fileio import atomic_write

FORMAT = "pythia_probe.prepared_theory/1"
TENSOR = "CT_T"
_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16"}
_DTYPES = {v: k for k, v in _CODES.items()}


@dataclass(frozen=True)
class PreparedTheory:
    """A theory matrix prepared on disk: C_T^T at ``path``, streamed per column block of C_T."""

    name: str
    path: Path
    norm: float
    d_vocab: int
    dtype: torch.dtype
    stats_id: str
    data_offset: int
    device: str | torch.device = "cpu"

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


def read_into(f, block: Tensor, nbytes: int) -> None:
    """Fill the first ``nbytes`` of contiguous CPU tensor ``block`` from binary file ``f``."""
    view = memoryview(block.view(torch.uint8).numpy()).cast("B")
    got = 0
    while got < nbytes:
        n = f.readinto(view[got:nbytes])
        if not n:
            raise CorruptFileError(f"{f.name}: truncated prepared-theory file; delete it to "
                                   "rebuild")
        got += n


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(safetensors header dict, byte offset of the data) of a file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def open_prepared(path: str | os.PathLike, device: str | torch.device = "cpu") -> PreparedTheory:
    """Open a cache file written by :func:`write_prepared` (reads the header only)."""
    header, offset = read_header(path)
    meta, info = header.get("__metadata__", {}), header.get(TENSOR)
    if meta.get("format") != FORMAT or info is None:
        raise BadInputError(f"{path} is not a prepared-theory file ({FORMAT})")
    V = info["shape"][0]
    return PreparedTheory(meta["name"], Path(path), float(meta["norm"]), V,
                          _DTYPES[info["dtype"]], meta["stats_id"],
                          offset + info["data_offsets"][0], device)


def write_prepared(th: Theory, path: str | os.PathLike, stats_id: str,
                   chunk: int = DEFAULT_CHUNK) -> Path:
    """Write C_T^T of ``th`` block by block (peak O(V * chunk)), atomically, as safetensors."""
    path, V = Path(path), th.d_vocab
    itemsize = torch.empty((), dtype=th.dtype).element_size()
    meta = {"format": FORMAT, "name": th.name, "stats_id": str(stats_id), "norm": repr(th.norm),
            "dtype": str(th.dtype).removeprefix("torch.")}
    header = {"__metadata__": meta, TENSOR: {"dtype": _CODES[th.dtype], "shape": [V, V],
                                             "data_offsets": [0, V * V * itemsize]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for s in range(0, V, chunk):
                f.write(th.columns(s, s + chunk).T.contiguous().cpu().numpy().tobytes())

    return atomic_write(path, write, V * V * itemsize)


def cache_path(cache_dir: str | os.PathLike, name: str, dtype: torch.dtype) -> Path:
    """Where the prepared theory ``name`` in ``dtype`` lives inside ``cache_dir``."""
    return Path(cache_dir) / f"{name}-{str(dtype).removeprefix('torch.')}.safetensors"


def _valid(path: Path, name: str, stats_id: str, dtype: torch.dtype) -> bool:
    try:
        p = open_prepared(path)
    except (OSError, ValueError, KeyError, struct.error, json.JSONDecodeError):
        return False
    nbytes = p.d_vocab**2 * torch.empty((), dtype=p.dtype).element_size()
    return (p.name, p.stats_id, p.dtype) == (name, str(stats_id), dtype) and \
        path.stat().st_size == p.data_offset + nbytes


def prepared_theory(name: str, get_T: Callable[[], Tensor], cache_dir: str | os.PathLike,
                    stats_id: str, *, dtype: torch.dtype = torch.float64,
                    device: str | torch.device = "cpu",
                    chunk: int = DEFAULT_CHUNK) -> PreparedTheory:
    """The cached prepared theory ``name``; built (V^3, once) if missing or for other statistics.

    ``get_T`` returns the [V, V] statistic and is only called when the cache must be (re)built;
    a cache file of another ``stats_id``, name, dtype or truncated is replaced.
    """
    if dtype not in _CODES:
        raise BadInputError(f"prepared theory dtype {dtype} not supported; valid: "
                            f"{', '.join(str(d) for d in _CODES)}")
    path = cache_path(cache_dir, name, dtype)
    if not _valid(path, name, stats_id, dtype):
        th = prepare_theory(name, get_T(), dtype=dtype, device=device, chunk=chunk)
        write_prepared(th, path, stats_id, chunk)
        del th
    return open_prepared(path, device)
