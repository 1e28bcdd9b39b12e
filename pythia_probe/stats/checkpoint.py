"""Accumulator checkpoints and per-shard token caches: safetensors + JSON meta, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from pythia_probe.errors import CorruptFileError, MismatchError
from pythia_probe.fileio import atomic_write


def write_atomic(path: str | os.PathLike, tensors: dict[str, Tensor],
                 metadata: dict[str, str]) -> Path:
    """Write a safetensors file via a temp file beside it, then rename (never half-written)."""
    cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    nbytes = sum(v.numel() * v.element_size() for v in cpu.values())
    return atomic_write(path, lambda tmp: save_file(cpu, str(tmp), metadata=metadata), nbytes)


def save_state(path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict[str, Any]
               ) -> Path:
    """Write tensors + meta to ``path`` atomically."""
    return write_atomic(path, tensors, {"meta": json.dumps(meta)})


def load_state(path: str | os.PathLike, identity: dict[str, Any] | None = None
               ) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read a checkpoint; refuse it if its recorded ``identity`` differs from the given one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, KeyError, json.JSONDecodeError, OSError) as e:
        raise CorruptFileError(f"checkpoint {path} is corrupt ({e}); delete it to start over"
                               ) from e
    if identity is not None and meta.get("identity") != identity:
        raise MismatchError(f"checkpoint {path} belongs to another configuration "
                            f"({meta.get('identity')} != {identity}); use another --work-dir "
                            "or delete it")
    return tensors, meta
