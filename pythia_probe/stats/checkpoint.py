"""The one checkpoint writer of the statistics: pass-1 and pass-2 checkpoints, token caches and
statistics files are safetensors + JSON meta written through ``fileio.atomic_write`` (a temp
file beside the target, renamed: never half-written; the umask; a full disk one line naming
the file). :class:`Checkpoint` is a pass's resumable state under a run identity, written
every so many units of work or seconds."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from pythia_probe.errors import CorruptFileError, MismatchError, MissingFileError
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
    if not Path(path).is_file():
        raise MissingFileError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, KeyError, json.JSONDecodeError, OSError) as e:
        raise CorruptFileError(f"checkpoint {path} is corrupt ({e}); delete it to start over"
                               ) from e
    if identity is not None and meta.get("identity") != identity:
        raise MismatchError(f"checkpoint {path} belongs to another run: "
                            f"{identity_diff(meta.get('identity') or {}, identity)}; rerun with "
                            "the same inputs, or delete it (or use another --work-dir) to "
                            "count from scratch")
    return tensors, meta


def identity_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed between two run identities, in a few words (corpus shards named)."""
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "shards" and isinstance(a, list) and isinstance(b, list):
            named_a = {s.get("name"): s for s in a if isinstance(s, dict)}
            changed = [s["name"] for s in b if isinstance(s, dict)
                       and s.get("name") in named_a and named_a[s["name"]] != s]
            added = [s.get("name") for s in b if isinstance(s, dict) and s.get("name")
                     not in named_a]
            parts.append("corpus shards changed since it was written: "
                         + ", ".join(changed + [f"{n} (new)" for n in added])[:300]
                         if changed or added else "corpus shards removed")
        else:
            parts.append(f"{key} was {str(a)[:80]}, now {str(b)[:80]}")
    return "; ".join(parts)


class Checkpoint:
    """A pass's resumable state at ``path`` (None: not kept), refused under another identity;
    ``tick`` after every unit of work writes it every ``every`` units or ``seconds``."""

    def __init__(self, path: Path | None, identity: dict[str, Any], every: int | None = None,
                 seconds: float | None = None) -> None:
        self.path, self.identity, self.every, self.seconds = path, identity, every, seconds
        self.units, self.last = 0, time.monotonic()

    def load(self) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
        """(tensors, state) of an existing checkpoint, or None."""
        if self.path is None or not self.path.exists():
            return None
        tensors, meta = load_state(self.path, self.identity)
        return tensors, meta["state"]

    def tick(self, state: Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]) -> None:
        """One more unit done: save ``state()`` when due."""
        self.units += 1
        due = ((self.every is not None and self.units >= self.every) or
               (self.seconds is not None and time.monotonic() - self.last >= self.seconds))
        if due:
            self.save(*state())

    def save(self, tensors: dict[str, Tensor], state: dict[str, Any]) -> None:
        if self.path is not None:
            save_state(self.path, tensors, {"identity": self.identity, "state": state})
        self.units, self.last = 0, time.monotonic()
