"""CorpusStats: the frozen section-2 statistics, apart from the engines that fit them.

Every statistic is read one way, ``st.block(name, rows, cols)``: the dense float64 entries of
Bbar, Phibar, SigmaB, PhiBT, Gbar or Qbar at any index tensors (positions 0..d_vocab-1 of
these statistics; ``token_ids`` maps them to tokenizer ids when the vocabulary is restricted),
``st.block("Delta")`` the Delta vector. The properties (``st.Bbar`` ...) and ``st[name]`` are
the whole matrix, ``block(name)``. What is kept and what is composed on first use is decided
here once (:func:`stores_derived`).

The statistics file is safetensors with the JSON metadata (and a sha256 per tensor) in its
header; ``meta["stats_id"]`` (:func:`stats_id`) names what decided the numbers.
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

from pythia_probe import __version__ as CODE_VERSION
from pythia_probe.errors import BadInputError, CorruptFileError, MismatchError, MissingFileError
from pythia_probe.stats import checkpoint
from pythia_probe.stats.dense import compose

FORMAT = "pythia_probe.stats/1"
MATRICES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
PRIMARY = ("Bbar", "Phibar", "Qbar", "Delta")
DERIVED = ("SigmaB", "PhiBT", "Gbar")
DERIVED_LIMIT = 16384
"""Up to this d_vocab (or restricted to a top-k) SigmaB, PhiBT and Gbar are composed when the
statistics are assembled and stored; above, they are composed on first use (20 GB each at
50,304 ids)."""
VERIFY_LIMIT = 4 << 30


def stores_derived(d_vocab: int, restricted: bool) -> bool:
    """The one stored-or-recomputed policy: store SigmaB, PhiBT and Gbar with the primary
    statistics when restricted (a top-k slice cannot be recomposed from its slices) or small."""
    return restricted or d_vocab <= DERIVED_LIMIT


class CorpusStats:
    """Frozen statistics. Rows/columns index ``token_ids`` (all ids unless top-k restricted)."""

    compose_device: str | None = None
    """Device for compositions on first use (None: CUDA when available, else the host)."""

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

    # -- reading --------------------------------------------------------------------------
    def block(self, name: str, rows=None, cols=None) -> Tensor:
        """Dense float64 entries ``name[rows][:, cols]`` (None: every index); ``block("Delta")``
        the Delta vector. Indices are positions 0..d_vocab-1 of these statistics."""
        if name not in MATRICES:
            raise BadInputError(f"unknown statistic {name!r}; valid: {', '.join(MATRICES)}")
        if name == "Delta":
            return self._t["Delta"]
        full = self._matrix(name)
        r, c = self.indices(rows, "row"), self.indices(cols, "column")
        out = full if r is None else full.index_select(0, r.to(full.device))
        return out if c is None else out.index_select(1, c.to(full.device))

    def indices(self, idx, what: str = "row") -> Tensor | None:
        """``idx`` as a LongTensor of positions, checked against 0..d_vocab-1 (None: all)."""
        if idx is None:
            return None
        t = torch.as_tensor(idx)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise BadInputError(f"block {what} indices must be integers, got {t.dtype}")
        t = t.reshape(-1).to(torch.int64)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.d_vocab):
            bad = int(t[(t < 0) | (t >= self.d_vocab)][0])
            raise BadInputError(f"block {what} index {bad} outside 0..{self.d_vocab - 1} (the "
                                f"d_vocab of these statistics is {self.d_vocab})")
        return t

    def _matrix(self, name: str) -> Tensor:
        if name not in self._t:
            if self.restricted:
                raise CorruptFileError(f"{name} missing from a top-k restricted statistics "
                                       "object; recompute the statistics")
            self._t[name] = self._compose(name)
        return self._t[name]

    def _compose(self, name: str) -> Tensor:
        dev = self.compose_device or ("cuda" if torch.cuda.is_available() else None)
        if name == "SigmaB":
            return compose.sigma_b(self.Bbar, device=dev)
        if name == "PhiBT":
            return compose.phi_bt(self.Bbar, self.Phibar, device=dev)
        return compose.g_bar(self.SigmaB, self.Phibar, device=dev)

    def __getitem__(self, name: str) -> Tensor:
        return self.block(name)

    Bbar = property(lambda self: self.block("Bbar"), doc="(1/NT) sum X^T (Y - U); rows current.")
    Phibar = property(lambda self: self.block("Phibar"), doc="(1/NT) sum (Y - U)^T A0 X.")
    SigmaB = property(lambda self: self.block("SigmaB"), doc="Bbar^T Bbar.")
    PhiBT = property(lambda self: self.block("PhiBT"), doc="Phibar^T Bbar^T.")
    Gbar = property(lambda self: self.block("Gbar"), doc="SigmaB Phibar.")
    Qbar = property(lambda self: self.block("Qbar"), doc="(1/NT) sum X^T Q X (query, key).")
    Delta = property(lambda self: self.block("Delta"), doc="Delta[r], r = query - key offset.")

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

        derived: also store SigmaB, PhiBT, Gbar when computed (default: :func:`stores_derived`).
        """
        keep = stores_derived(self.d_vocab, self.restricted) if derived is None else derived
        tensors = {k: v.detach().cpu().contiguous() for k, v in self._t.items()
                   if keep or k not in DERIVED}
        meta = dict(self.meta, format=FORMAT, sha256={k: _sha(v) for k, v in tensors.items()})
        return checkpoint.write_atomic(Path(path), tensors, {"pythia_probe": json.dumps(meta)})

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


# -- identity -----------------------------------------------------------------------------------
def stats_meta(meta: dict[str, Any], ids: Tensor | None, V: int, fp: Any,
               kernel: dict[str, Any]) -> dict[str, Any]:
    """Metadata and stats_id of a statistics file; ``fp`` has n_sequences, n_positions,
    n_tokens and the pass-1 checksum (either engine's first pass)."""
    meta = dict(meta)
    meta.update(format=FORMAT, code_version=CODE_VERSION, full_d_vocab=V,
                counts=dict(meta.get("counts", {}), sequences=fp.n_sequences,
                            positions=fp.n_positions, tokens=fp.n_tokens))
    meta["vocab"] = {"restricted": ids is not None, "compose": "full_then_slice",
                     "ids": None if ids is None else ids.tolist(), "full_d_vocab": V}
    meta["kernel"] = kernel  # recorded, not part of the identity (nor is meta["engine"])
    meta["stats_id"] = stats_id(meta, fp.checksum)
    return meta


def stats_id(meta: dict[str, Any], checksum: list[int]) -> str:
    """12 hex digits naming what decided the numbers: the tokenizer's canonical fingerprint
    (not its name or where it was loaded from), the sequence policy, every shard's content
    digest and counts (not its name: a local shard's name is its path), the vocabulary and the
    pass-1 checksum. The same recipe built anywhere gets the same stats_id."""
    tok = meta.get("tokenizer")
    ident = {"tokenizer": None if tok is None else {k: tok.get(k) for k in
                                                    ("sha256", "d_vocab", "scheme")},
             "ledger": [ledger_identity(e) for e in meta.get("ledger") or []],
             **{k: meta.get(k) for k in ("policy", "counts", "vocab", "T")},
             "format": FORMAT, "checksum": checksum}
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def ledger_identity(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry without the shard's name when its content digest names it."""
    return {k: v for k, v in entry.items() if k != "shard" or "content" not in entry}


# -- files ----------------------------------------------------------------------------------------
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
