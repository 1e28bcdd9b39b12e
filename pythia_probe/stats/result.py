"""CorpusStats: the frozen section-2 statistics, apart from the engines that fit them.

Every statistic is read one way, ``st.block(name, rows, cols)``: the dense float64 entries of Bbar,
Phibar, SigmaB, PhiBT, Gbar, Qbar, GbarHead or QbarHead at any index tensors (positions 0..d_vocab-1
of these statistics; ``token_ids`` maps them to tokenizer ids when the vocabulary is restricted),
``st.block("Delta")`` the Delta vector. The properties (``st.Bbar`` ...) and ``st[name]`` are the
whole matrix, ``block(name)``: fine at small vocabularies, V x V at the full one. Products with a
dense X [d_vocab, d] never form a V x V matrix: ``st.mul(name, X)`` = B X and ``st.tmul(name, X)`` =
X^T B; ``st.parts()`` exposes the sparse parts and vectors.

Storage is factored (leading-terms section 6, ``stats/factors.py``): the bigram counts C and the
context weights W where the corpus has them (exact integers), the token counts, Qbar and QbarHead on
the (query, key) pairs that occur, and Delta; Bbar, Phibar, SigmaB, PhiBT, Gbar and GbarHead are
composed from them when read (Bbar and Phibar bit-identical to the dense engine, the rest to float64
rounding). QbarHead is pass 2 run with GbarHead = Bbar^T Phibar^T Bbar^T in place of Gbar (the
per-head target of pythia-per-head.py, transposed: rows = query token, like Qbar); a file built
before it existed still loads (``st.has("QbarHead")`` is False). A file of the first format (dense
tensors) still loads; ``meta["stats_id"]`` (:func:`stats_id`) names what decided the numbers,
``meta["conventions"]`` whose conventions (``stats/conventions.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from pythia_probe import __version__ as CODE_VERSION
from pythia_probe.errors import BadInputError, CorruptFileError, MismatchError, MissingFileError
from pythia_probe.stats import checkpoint
from pythia_probe.stats.consistency import check_factored
from pythia_probe.stats.stores import DenseStore, FactoredStore

FORMAT = "pythia_probe.stats/2"
DENSE_FORMAT = "pythia_probe.stats/1"
"""The first format (dense V x V tensors), still read."""
MATRICES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "GbarHead", "QbarHead",
            "Delta")
PRODUCTS = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "GbarHead", "QbarHead")
VERIFY_LIMIT = 4 << 30


class CorpusStats:
    """Frozen statistics. Rows/columns index ``token_ids`` (all ids unless top-k restricted)."""

    def __init__(self, data: FactoredStore | dict[str, Tensor], meta: dict[str, Any]) -> None:
        self.meta = meta
        restricted = bool(meta.get("vocab", {}).get("restricted", False))
        self.store = data if isinstance(data, FactoredStore) else DenseStore(data, restricted)
        self.d_vocab = self.store.d_vocab
        self.T = int(self.store.delta.shape[0])
        meta.setdefault("d_vocab", self.d_vocab)
        meta.setdefault("T", self.T)

    @property
    def compose_device(self) -> str | None:
        """Device for the compositions of a dense (first-format) file."""
        return getattr(self.store, "compose_device", None)

    @compose_device.setter
    def compose_device(self, device: str | None) -> None:
        if isinstance(self.store, DenseStore):
            self.store.compose_device = device

    # -- reading --------------------------------------------------------------------------
    def block(self, name: str, rows=None, cols=None) -> Tensor:
        """Dense float64 entries ``name[rows][:, cols]`` (None: every index; any order,
        repeats allowed); ``block("Delta")`` the Delta vector. Indices are positions
        0..d_vocab-1 of these statistics."""
        if name not in MATRICES:
            raise BadInputError(f"unknown statistic {name!r}; valid: {', '.join(MATRICES)}")
        self._require(name)
        if name == "Delta":
            if rows is not None or cols is not None:
                raise BadInputError("block('Delta') is the whole Delta vector (T entries, one "
                                    "per offset): give no row or column indices")
            return self.store.delta
        r, c = self.indices(rows, "row"), self.indices(cols, "column")
        (ru, ri), (cu, ci) = _unique(r), _unique(c)
        out = self.store.block(name, ru, cu)
        if ri is not None:
            out = out.index_select(0, ri.to(out.device))
        return out if ci is None else out.index_select(1, ci.to(out.device))

    def has(self, name: str) -> bool:
        """Whether these statistics hold ``name`` (False for QbarHead in a file built before
        it existed; unknown names are False)."""
        return name in MATRICES and self.store.has(name)

    def _require(self, name: str) -> None:
        if not self.store.has(name):
            raise BadInputError(
                f"statistics {self.meta.get('stats_id', '?')} hold no {name} (pass 2 with "
                "GbarHead, the per-head target): they were built before it existed; rebuild "
                "them with `python -m pythia_probe.stats compute ...`")

    def indices(self, idx, what: str = "row") -> Tensor | None:
        """``idx`` as a LongTensor of positions, checked against 0..d_vocab-1 (None: all)."""
        if idx is None:
            return None
        try:
            t = torch.as_tensor(idx)
        except (TypeError, ValueError, RuntimeError) as e:
            raise BadInputError(f"block {what} indices must be an integer tensor or a sequence "
                                f"of integers, got {type(idx).__name__}") from e
        if t.numel() == 0:
            return torch.zeros(0, dtype=torch.int64)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise BadInputError(f"block {what} indices must be integers, got {t.dtype}")
        t = t.reshape(-1).to(torch.int64).cpu()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.d_vocab):
            bad = int(t[(t < 0) | (t >= self.d_vocab)][0])
            raise BadInputError(f"block {what} index {bad} outside 0..{self.d_vocab - 1} (the "
                                f"d_vocab of these statistics is {self.d_vocab})")
        return t

    def mul(self, name: str, X: Tensor) -> Tensor:
        """``name`` @ X for a dense X [d_vocab, d] (float64), never forming ``name``."""
        return self.store.product(self._product_name(name, X), X, False)

    def tmul(self, name: str, X: Tensor) -> Tensor:
        """X^T ``name`` [d, d_vocab] for a dense X [d_vocab, d], never forming ``name``."""
        return self.store.product(self._product_name(name, X), X, True).T

    def _product_name(self, name: str, X: Tensor) -> str:
        if name not in PRODUCTS:
            raise BadInputError(f"no product with {name!r}; valid: {', '.join(PRODUCTS)}")
        self._require(name)
        if X.ndim != 2 or X.shape[0] != self.d_vocab:
            raise BadInputError(f"X must be [d_vocab, d] = [{self.d_vocab}, d], got "
                                f"{tuple(X.shape)}")
        return name

    def parts(self) -> dict[str, Any]:
        """The sparse parts and rank-one vectors (factored statistics only): C, W (scipy CSR,
        token ids), n = C 1, w = 1^T W, the positions P, the full d_vocab, the restriction's
        ids, Qbar and (when held) QbarHead (scipy CSC over positions, / P) and Delta."""
        if not isinstance(self.store, FactoredStore):
            raise BadInputError("these statistics are dense tensors (a first-format file): "
                                "recompute them for the factored parts")
        return self.store.parts()

    def __getitem__(self, name: str) -> Tensor:
        return self.block(name)

    Bbar = property(lambda self: self.block("Bbar"), doc="(1/NT) sum X^T (Y - U); rows current.")
    Phibar = property(lambda self: self.block("Phibar"), doc="(1/NT) sum (Y - U)^T A0 X.")
    SigmaB = property(lambda self: self.block("SigmaB"), doc="Bbar^T Bbar.")
    PhiBT = property(lambda self: self.block("PhiBT"), doc="Phibar^T Bbar^T.")
    Gbar = property(lambda self: self.block("Gbar"), doc="SigmaB Phibar.")
    Qbar = property(lambda self: self.block("Qbar"), doc="(1/NT) sum X^T Q X (query, key).")
    GbarHead = property(lambda self: self.block("GbarHead"), doc="Bbar^T Phibar^T Bbar^T.")
    QbarHead = property(lambda self: self.block("QbarHead"), doc="Qbar with GbarHead for Gbar.")
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
        return self.store.token_counts

    @property
    def stats_id(self) -> str:
        return str(self.meta["stats_id"])

    # -- parts of the corpus (stats/groups.py) ----------------------------------------------
    @property
    def groups(self) -> int:
        """G: the document groups these statistics keep (0: none)."""
        return int((self.meta.get("groups") or {}).get("G", 0))

    def filled_groups(self) -> list[int]:
        """The groups holding counted positions: the jackknife's replicates (a file built
        before empty groups were refused may hold others)."""
        counts = (self.meta.get("groups") or {}).get("counts", [])
        return [g for g, c in enumerate(counts) if c.get("positions", 1)]

    def subset(self, groups: Sequence[int]) -> CorpusStats:
        """The statistics of the documents in ``groups`` (document ordinal mod G): their
        pass-1 counts summed exactly (Bbar, Phibar, SigmaB, PhiBT, Gbar as a build over those
        documents alone would give), Qbar and Delta from the same build's pass 2, i.e.
        conditioned on the FULL corpus's Gbar. N, T of that part; a stats_id of its own."""
        which = self._group_list(groups)
        store = self.store.subset(which)
        info = self.meta["groups"]
        counts = {k: sum(info["counts"][g][k] for g in which)
                  for k in ("docs", "sequences", "positions", "tokens")}
        meta = {k: v for k, v in self.meta.items() if k not in ("groups", "sha256")}
        meta.update(counts=counts, subset={"of": self.stats_id, "groups": which,
                                           "G": self.groups,
                                           "qbar_delta": "conditioned on the full corpus's Gbar"})
        # (QbarHead likewise on the full corpus's GbarHead)
        blob = json.dumps({"of": self.stats_id, "groups": which, "G": self.groups})
        meta["stats_id"] = hashlib.sha256(blob.encode()).hexdigest()[:12]
        return CorpusStats(store, meta)

    def leave_out(self, g: int) -> CorpusStats:
        """subset(every group but ``g``): the delete-a-group jackknife's replicate."""
        self._group_list([g])
        return self.subset([i for i in range(self.groups) if i != g])

    def halves(self) -> tuple[CorpusStats, CorpusStats]:
        """(groups 0 .. G/2 - 1, groups G/2 .. G - 1) of the :meth:`filled_groups`: two
        disjoint halves of the documents."""
        self._group_list([0])
        filled = self.filled_groups()
        if len(filled) < 2:
            raise BadInputError(f"statistics {self.stats_id}: {len(filled)} of their "
                                f"{self.groups} document groups hold documents; halves need 2")
        n = len(filled) // 2
        return self.subset(filled[:n]), self.subset(filled[n:])

    def _group_list(self, groups: Sequence[int]) -> list[int]:
        G = self.groups
        if not G or not isinstance(self.store, FactoredStore) or not self.store.groups:
            raise BadInputError(
                f"statistics {self.meta.get('stats_id', '?')} keep no document groups; rebuild "
                "them with `python -m pythia_probe.stats compute ... --groups 10`")
        if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
            raise BadInputError(f"groups {groups!r}: need a sequence of group ids 0..{G - 1}")
        groups = list(groups)
        for g in groups:
            if not _is_int(g):
                raise BadInputError(f"group id {g!r} is not an integer: group ids are 0..{G - 1}")
        out = sorted({int(g) for g in groups})
        if not out or out[0] < 0 or out[-1] >= G:
            raise BadInputError(f"groups {list(groups)!r}: need one or more of 0..{G - 1}")
        return out

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write safetensors (atomically) with the JSON meta and a sha256 per tensor in the
        header: the factors (never a V x V array), or the tensors of a dense store."""
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.store.tensors().items()}
        meta = dict(self.meta, sha256={k: _sha(v) for k, v in tensors.items()})
        if isinstance(self.store, FactoredStore):
            meta.update(format=FORMAT, layout=self.store.layout())
        else:
            meta["format"] = DENSE_FORMAT
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
        if meta["format"] == FORMAT:  # the values against the header, after their digests
            _check(path, meta, tensors)
        if meta["format"] == DENSE_FORMAT:
            return cls(tensors, meta)
        try:
            vocab = meta.get("vocab", {})
            store = FactoredStore.from_tensors(tensors, meta["layout"], vocab.get("ids"),
                                               vocab.get("compose"))
        except (KeyError, ValueError, IndexError, TypeError) as e:
            raise _corrupt(path, e) from e
        return cls(store, meta)


def _is_int(g) -> bool:
    """An integer group id: a Python or numpy integer or a 0-d integer tensor (not a bool)."""
    if isinstance(g, Tensor):
        return g.ndim == 0 and not g.dtype.is_floating_point and not g.dtype.is_complex \
            and g.dtype != torch.bool
    return isinstance(g, (int, np.integer)) and not isinstance(g, bool)


def _unique(idx: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(sorted unique indices, where each asked index sits among them) or (idx, None) when
    ``idx`` is already sorted and unique (None: all)."""
    if idx is None or idx.numel() < 2 or bool((idx[1:] > idx[:-1]).all()):
        return idx, None
    u, inverse = torch.unique(idx, sorted=True, return_inverse=True)
    return u, inverse


# -- identity -----------------------------------------------------------------------------------
def stats_meta(meta: dict[str, Any], ids: Tensor | None, V: int, fp: Any,
               kernel: dict[str, Any], compose: str = "full_then_slice") -> dict[str, Any]:
    """Metadata and stats_id of a statistics file; ``fp`` has n_sequences, n_positions,
    n_tokens and the pass-1 checksum (either engine's first pass); ``compose``: how a
    restricted vocabulary's compositions are made (``stats/kept.py``)."""
    meta = dict(meta)
    meta.update(format=FORMAT, code_version=CODE_VERSION, full_d_vocab=V,
                counts=dict(meta.get("counts", {}), sequences=fp.n_sequences,
                            positions=fp.n_positions, tokens=fp.n_tokens))
    meta["vocab"] = {"restricted": ids is not None, "compose": compose,
                     "ids": None if ids is None else ids.tolist(), "full_d_vocab": V}
    meta["kernel"] = kernel  # recorded, not part of the identity (nor is meta["engine"])
    meta["stats_id"] = stats_id(meta, fp.checksum)
    return meta


def stats_id(meta: dict[str, Any], checksum: list[int]) -> str:
    """12 hex digits naming what decided the numbers: the tokenizer's canonical fingerprint
    (not its name or where it was loaded from), the sequence policy, every shard's content
    digest and counts (not its name: a local shard's name is its path), the vocabulary, the
    conventions (when not the paper's: a paper file keeps the id it had before conventions
    existed) and the pass-1 checksum. The same recipe built anywhere gets the same stats_id."""
    tok = meta.get("tokenizer")
    ident = {"tokenizer": None if tok is None else {k: tok.get(k) for k in
                                                    ("sha256", "d_vocab", "scheme")},
             "ledger": [ledger_identity(e) for e in meta.get("ledger") or []],
             **{k: meta.get(k) for k in ("policy", "counts", "vocab", "T")},
             "format": FORMAT, "checksum": checksum}
    if meta.get("groups"):  # G is part of the recipe (a file without groups keeps its id)
        ident["groups"] = meta["groups"]
    if meta.get("conventions", "paper") != "paper":
        ident["conventions"] = meta["conventions"]
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def ledger_identity(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry without the shard's name when its content digest names it."""
    return {k: v for k, v in entry.items() if k != "shard" or "content" not in entry}


# -- files ----------------------------------------------------------------------------------------
def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of a stats file without loading its tensors."""
    return _read(Path(path), "cpu", header_only=True)[0]


def part_counts(path: str | os.PathLike) -> dict[str, int]:
    """The stored entries of a factored file's sparse parts, from its header alone (nothing
    loaded): ``C`` the bigrams, ``W`` the (target, context) pairs, ``Qbar`` the (query, key)
    pairs, and ``QbarHead`` its pairs where the file holds it, totals only (document groups'
    parts not counted). Empty for a dense file."""
    meta = read_meta(path)
    if meta["format"] != FORMAT:
        return {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            size = {k: f.get_slice(k).get_shape()[0] for k in f.keys()
                    if k in ("bigram_keys", "qbar_vals", "qbar_head_vals")
                    or k.startswith("context_keys.")}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CorruptFileError(f"{path} is corrupt or not a safetensors statistics file: {e}"
                               ) from e
    out = {"C": int(size.get("bigram_keys", 0)), "Qbar": int(size.get("qbar_vals", 0)),
           "W": int(sum(v for k, v in size.items() if k.startswith("context_keys.")))}
    if "qbar_head_vals" in size:
        out["QbarHead"] = int(size["qbar_head_vals"])
    return out


def _read(path: Path, device: str, header_only: bool = False) -> tuple[dict, dict]:
    if not path.is_file():
        raise MissingFileError(f"statistics file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw = (f.metadata() or {}).get("pythia_probe")
            meta = json.loads(raw) if raw else {}
            if meta.get("format") not in (FORMAT, DENSE_FORMAT):
                raise CorruptFileError(
                    f"{path} is not a statistics file this version reads (format "
                    f"{meta.get('format')!r}; reads {FORMAT!r} and {DENSE_FORMAT!r}); rebuild "
                    "it with `python -m pythia_probe.stats compute ...`")
            tensors = {} if header_only else {k: f.get_tensor(k) for k in f.keys()}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, json.JSONDecodeError, OSError, RuntimeError) as e:
        raise CorruptFileError(f"{path} is corrupt or not a safetensors statistics file: {e}"
                               ) from e
    if meta["format"] == FORMAT:
        _check(path, meta, shapes)
    if meta["format"] == DENSE_FORMAT and device != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return meta, tensors


def _check(path: Path, meta: dict, found: dict) -> None:
    """A factored file's header against its tensors' shapes (``found``: name -> shape) or, given
    the tensors, their values too: one 'corrupt, recompute' line."""
    shapes = {k: tuple(v.shape) if isinstance(v, Tensor) else v for k, v in found.items()}
    tensors = found if all(isinstance(v, Tensor) for v in found.values()) else None
    try:
        check_factored(shapes, meta, tensors)
    except (KeyError, ValueError, IndexError, TypeError) as e:
        raise _corrupt(path, e) from e


def _corrupt(path: Any, e: Exception) -> CorruptFileError:
    """One line: the file, what disagrees, the command that recomputes it."""
    what = f"tensor or header entry {e} missing" if isinstance(e, KeyError) else e
    return CorruptFileError(f"{path}: corrupt ({what}); recompute it with `python -m "
                            "pythia_probe.stats compute ...`")


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
