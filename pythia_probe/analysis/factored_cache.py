"""The once-per-statistics vectors of a factored target (D, m, norm, trace, total, null terms),
cached.

Computing them costs one pass of C_T^T over every column of C_T (hours on a CPU at the full
Pythia vocabulary, see :mod:`pythia_probe.analysis.factored`), so they are written once beside
the statistics: a safetensors file ``<name>-factored.safetensors`` (tensors ``scale``, ``mean``
[V] float64; metadata ``format``, ``name``, ``stats_id``, ``norm``, ``trace``, ``total``, the
four non-zero null terms ``null_rowsum_sq``, ``null_frob_sq``, ``null_diag_rowsum``,
``null_diag_sq`` (:mod:`pythia_probe.analysis.chance`) and ``sha256``, the digest of the
tensors' bytes). A file is reused only when its format, name and stats_id (the statistics'
content identity) match and its bytes hash to the recorded digest; anything else (a file of
format /1, written before the null terms, included) is rebuilt, never read.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from pythia_probe.analysis.chance import null_from_meta, null_meta
from pythia_probe.analysis.factored import Vectors, target_vectors
from pythia_probe.fileio import atomic_write

log = logging.getLogger(__name__)

FORMAT = "pythia_probe.factored_target/2"  # /2: the null terms (chance_sd)


def vectors_path(cache_dir: str | os.PathLike, name: str) -> Path:
    return Path(cache_dir) / f"{name}-factored.safetensors"


def _digest(scale: torch.Tensor, mean: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (scale, mean):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def read_vectors(path: Path, name: str, stats_id: str) -> tuple[Vectors | None, str]:
    """(the cached vectors, "") or (None, why they cannot be used)."""
    if not path.is_file():
        return None, "not built yet"
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            scale, mean = f.get_tensor("scale"), f.get_tensor("mean")
    except (SafetensorError, OSError, RuntimeError, KeyError) as e:
        return None, f"unreadable ({e})"
    if meta.get("format") != FORMAT or (meta.get("name"), meta.get("stats_id")) != (
            name, str(stats_id)):
        return None, "built for other statistics or by another version"
    if meta.get("sha256") != _digest(scale, mean):
        return None, "its bytes do not match their recorded sha256 (damaged)"
    try:
        null = null_from_meta(meta)
    except (KeyError, ValueError):
        return None, "its null terms are missing or unreadable"
    return Vectors(scale, mean, float(meta["norm"]), float(meta["trace"]),
                   float(meta["total"]), null), ""


def write_vectors(path: Path, name: str, stats_id: str, v: Vectors) -> Path:
    meta = {"format": FORMAT, "name": name, "stats_id": str(stats_id), "norm": repr(v.norm),
            "trace": repr(v.trace), "total": repr(v.total),
            **null_meta(v.null),
            "sha256": _digest(v.scale, v.mean)}
    tensors = {"scale": v.scale.contiguous(), "mean": v.mean.contiguous()}
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta),
                        16 * v.scale.numel())


def cached_vectors(name: str, get_parts: Callable[[], Mapping[str, Any]],
                   cache_dir: str | os.PathLike, stats_id: str,
                   chunk: int = 1024) -> Vectors:
    """The vectors of target ``name``: from the cache when it holds them for these statistics,
    else computed from ``get_parts()`` (called only then) and written."""
    path = vectors_path(cache_dir, name)
    got, why = read_vectors(path, name, stats_id)
    if got is not None:
        return got
    if path.exists():
        log.warning("factored-target cache %s: %s; rebuilding it", path, why)
    v = target_vectors(name, get_parts(), chunk)
    write_vectors(path, name, stats_id, v)
    return v
