"""Accumulator checkpoints and per-shard token caches: safetensors + JSON meta, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint that is corrupt or belongs to another run configuration."""


def write_atomic(path: str | os.PathLike, tensors: dict[str, Tensor],
                 metadata: dict[str, str]) -> Path:
    """Write a safetensors file via a temp file beside it, then rename (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
    os.close(fd)
    try:
        cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(cpu, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


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
        raise CheckpointError(f"checkpoint {path} is corrupt ({e}); delete it to start over"
                              ) from e
    if identity is not None and meta.get("identity") != identity:
        raise CheckpointError(f"checkpoint {path} belongs to another configuration "
                              f"({meta.get('identity')} != {identity}); use another --work-dir "
                              "or delete it")
    return tensors, meta
