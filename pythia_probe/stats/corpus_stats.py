"""CorpusStats: the frozen section-2 statistics, with safetensors + JSON-metadata persistence.

Stored tensors (float64): Bbar, Phibar, Qbar, Delta, plus SigmaB, PhiBT and Gbar when the
vocabulary is restricted (top-k: they were composed at full vocabulary, then sliced, and cannot
be recomputed from the slices) or when they were already computed. At full vocabulary the
missing derived matrices are lazy properties, composed on first use. ``token_counts`` (int64)
holds the frequency of each row's token. ``meta`` is JSON in the safetensors header.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from pythia_probe.errors import BadInputError, CorruptFileError, MismatchError, MissingFileError
from pythia_probe.stats import checkpoint, compose

FORMAT = "pythia_probe.stats/1"
MATRICES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
PRIMARY = ("Bbar", "Phibar", "Qbar", "Delta")
VERIFY_LIMIT = 4 << 30


class CorpusStats:
    """Frozen statistics. Rows/columns index ``token_ids`` (all ids unless top-k restricted)."""

    def __init__(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
        missing = [k for k in PRIMARY if k not in tensors]
        if missing:
            raise ValueError(f"CorpusStats needs {missing}")
        self._t = dict(tensors)
        self.meta = meta
        self.d_vocab = int(tensors["Bbar"].shape[0])
        self.T = int(tensors["Delta"].shape[0])
        meta.setdefault("d_vocab", self.d_vocab)
        meta.setdefault("T", self.T)

    # -- matrices -------------------------------------------------------------------------
    Bbar = property(lambda self: self._t["Bbar"], doc="(1/NT) sum X^T (Y - U); rows current.")
    Phibar = property(lambda self: self._t["Phibar"], doc="(1/NT) sum (Y - U)^T A0 X.")
    Qbar = property(lambda self: self._t["Qbar"], doc="(1/NT) sum X^T Q X (query, key).")
    Delta = property(lambda self: self._t["Delta"], doc="Delta[r], r = query - key offset.")

    @property
    def SigmaB(self) -> Tensor:
        """Bbar^T Bbar."""
        return self._derived("SigmaB", lambda: compose.sigma_b(self.Bbar, **self._kw()))

    @property
    def PhiBT(self) -> Tensor:
        """Phibar^T Bbar^T."""
        return self._derived("PhiBT", lambda: compose.phi_bt(self.Bbar, self.Phibar,
                                                             **self._kw()))

    @property
    def Gbar(self) -> Tensor:
        """SigmaB Phibar."""
        return self._derived("Gbar", lambda: compose.g_bar(self.SigmaB, self.Phibar,
                                                           **self._kw()))

    compose_device: str | None = None
    """Device for lazy compositions (None: CUDA when available, else where Bbar lives)."""

    def _kw(self) -> dict[str, Any]:
        dev = self.compose_device or ("cuda" if torch.cuda.is_available() else None)
        return {"device": dev}

    def _derived(self, name: str, make) -> Tensor:
        if name not in self._t:
            if self.restricted:
                raise CorruptFileError(f"{name} missing from a top-k restricted statistics object")
            self._t[name] = make()
        return self._t[name]

    def __getitem__(self, name: str) -> Tensor:
        if name not in MATRICES:
            raise BadInputError(f"unknown statistic {name!r}; valid: {', '.join(MATRICES)}")
        return getattr(self, name)

    @property
    def restricted(self) -> bool:
        return bool(self.meta.get("vocab", {}).get("restricted", False))

    @property
    def token_ids(self) -> Tensor:
        """Token id of each row/column (LongTensor [d_vocab])."""
        ids = self.meta.get("vocab", {}).get("ids")
        return torch.arange(self.d_vocab) if ids is None else torch.tensor(ids)

    @property
    def token_counts(self) -> Tensor | None:
        return self._t.get("token_counts")

    @property
    def stats_id(self) -> str:
        return str(self.meta["stats_id"])

    def to(self, device: str | torch.device) -> CorpusStats:
        return CorpusStats({k: v.to(device) for k, v in self._t.items()}, self.meta)

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, derived: bool | None = None) -> Path:
        """Write safetensors (atomically) with the JSON meta and per-tensor sha256 in the header.

        derived: also store SigmaB, PhiBT, Gbar when computed (default: when restricted, where
        they cannot be recomputed, or d_vocab <= 16,384; above, loads recompose them lazily).
        """
        path = Path(path)
        keep = derived if derived is not None else (self.restricted or self.d_vocab <= 16384)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self._t.items()
                   if keep or k not in ("SigmaB", "PhiBT", "Gbar")}
        meta = dict(self.meta, format=FORMAT, sha256={k: _sha(v) for k, v in tensors.items()})
        return checkpoint.write_atomic(path, tensors, {"pythia_probe": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, *,
             device: str = "cpu", verify: bool | None = None) -> CorpusStats:
        """Read a stats file; refuse it if ``expect`` (a tokenizer fingerprint) does not match.

        verify: check each tensor's sha256 (default: when the file is under 4 GiB).
        """
        meta, tensors = _read(Path(path), device)
        if expect is not None:
            check_tokenizer(meta, expect, path)
        if verify if verify is not None else Path(path).stat().st_size < VERIFY_LIMIT:
            _verify(tensors, meta.get("sha256", {}), path)
        return cls(tensors, meta)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of a stats file without loading its tensors."""
    return _read(Path(path), "cpu", header_only=True)[0]


def _read(path: Path, device: str, header_only: bool = False) -> tuple[dict, dict]:
    if not path.is_file():
        raise MissingFileError(f"statistics file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            raw = (f.metadata() or {}).get("pythia_probe")
            meta = json.loads(raw) if raw else {}
            if meta.get("format") != FORMAT:
                raise CorruptFileError(f"{path} is not a pythia_probe statistics file "
                                     f"(format {meta.get('format')!r}, expected {FORMAT!r})")
            tensors = {} if header_only else {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, json.JSONDecodeError, OSError, RuntimeError) as e:
        raise CorruptFileError(f"{path} is corrupt or not a safetensors statistics file: {e}"
                             ) from e
    return meta, tensors


def _verify(tensors: dict[str, Tensor], digests: dict[str, str], path: Any) -> None:
    for k, v in tensors.items():
        if k in digests and _sha(v.cpu()) != digests[k]:
            raise CorruptFileError(f"{path}: tensor {k} does not match its stored sha256 "
                                 "(file corrupted); recompute the statistics")


def check_tokenizer(meta: dict[str, Any], expect: dict[str, Any], path: Any = "stats") -> None:
    """Raise MismatchError unless meta's tokenizer fingerprint matches ``expect``."""
    have = meta.get("tokenizer")
    if not have:
        raise MismatchError(f"{path} records no tokenizer, cannot check it against "
                                 f"{expect.get('name')!r}; pass expect=None to skip the check")
    if "scheme" in expect and have.get("scheme") != expect["scheme"]:
        raise MismatchError(
            f"{path} records its tokenizer in an older form (scheme {have.get('scheme')!r}, this "
            f"version uses {expect['scheme']!r}); recompute it with "
            "`python -m pythia_probe.stats compute ...`")
    for key in ("sha256", "d_vocab"):
        if key in expect and have.get(key) != expect[key]:
            raise MismatchError(
                f"{path} was computed with tokenizer {have.get('name')!r} ({key} "
                f"{have.get(key)}) but this analysis uses {expect.get('name')!r} ({key} "
                f"{expect[key]}); recompute with "
                "`python -m pythia_probe.stats compute --tokenizer ...`")


def _sha(t: Tensor) -> str:
    h = hashlib.sha256()
    flat = t.reshape(-1)
    step = 1 << 24
    for i in range(0, flat.numel(), step):
        h.update(flat[i:i + step].numpy().tobytes())
    return h.hexdigest()
