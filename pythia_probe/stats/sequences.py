"""Sequence policy: token ids of documents -> batches of windows of T+1 tokens (with lengths).

mode "first" (the paper): the first T+1 tokens of each document; mode "packed": documents
concatenated (optionally separated by ``eos``) and cut into consecutive, non-overlapping
windows of T+1 tokens, as Pythia's training packs its 2049-token sequences; the stream restarts
at every shard so shards stay independent units; mode "authors" (``--conventions authors``,
pythia.py's windows): the document as TransformerLens' to_tokens gives it (``bos`` first, cut
at N_CTX = 2,048 tokens), its first T tokens zero-padded to T as the inputs and the inputs
shifted by one with the last target 0 as the targets, i.e. pad(ids[:T], T, 0) + [0]: every
document gives one window of T+1 tokens whose T positions all count (the padding too), and
none is skipped for being short or empty. Documents (or a packed remainder) shorter than
T+1 tokens are skipped and counted (``short="skip"``) or kept as variable-length rows whose
padding is never counted (``short="keep"``). Ids outside the vocabulary skip the document
(counted; the paper's rule for word:K) or raise (``oov="error"``); ``oov="unk"`` records that
the tokenizer's [UNK] id was made a statistic id, so nothing is out of the vocabulary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError

MODES = ("first", "packed")
AUTHORS = "authors"
"""The window mode of ``--conventions authors`` (not a --mode choice of its own)."""
N_CTX = 2048
"""TransformerLens' to_tokens cuts a document at the model's n_ctx (2,048 for Pythia)."""
OOV = ("skip", "unk", "error")


@dataclass(frozen=True)
class SequencePolicy:
    """How documents become counted sequences; recorded in every stats file."""

    seq_len: int = 128
    """T: predicted positions per sequence (windows hold T+1 tokens)."""
    mode: str = "first"
    """'first' (first T+1 tokens of each document, the paper), 'packed', or 'authors'
    (pythia.py's windows: see the module docstring)."""
    short: str = "skip"
    """Sequences shorter than T+1 tokens: 'skip' (counted in meta) or 'keep' (masked)."""
    oov: str = "skip"
    """Documents with ids outside 0..d_vocab-1: 'skip' (counted), 'error', or 'unk' (the
    [UNK] id is inside the statistics' vocabulary, so no document is dropped for it)."""
    bos: int | None = None
    """Id prepended to every document (None: nothing)."""
    eos: int | None = None
    """Id appended to every document (the packed separator; None: nothing)."""

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise BadInputError(f"seq_len (T) must be an integer >= 1, got {self.seq_len!r}")
        for name, value, valid in (("mode", self.mode, (*MODES, AUTHORS)), ("short", self.short,
                                   ("skip", "keep")), ("oov", self.oov, OOV)):
            if value not in valid:
                raise BadInputError(f"{name} must be one of {valid}, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)


class Sequencer:
    """Turns one shard's documents into windows; ``skipped`` counts what was left out."""

    def __init__(self, policy: SequencePolicy, d_vocab: int) -> None:
        self.p, self.d_vocab = policy, d_vocab
        self.skipped: Counter[str] = Counter()
        self.origins: list[int] = []
        """The document (0, 1, ... in the order given) of each window yielded: its own in mode
        'first', the document of its first token in mode 'packed'."""
        self._stream: list[int] = []
        self._starts: list[tuple[int, int]] = []  # (stream offset, document) in the stream

    def windows(self, docs: Iterable[list[int]]) -> Iterator[list[int]]:
        """All windows (lists of 2..T+1 ids) of a shard's documents, in order."""
        for doc, ids in enumerate(docs):
            ids = self._wrap(ids)
            if ids is None:
                continue
            if self.p.mode == "first":
                yield from self._keep_or_skip(ids[: self.p.seq_len + 1], "docs_short", doc)
            elif self.p.mode == AUTHORS:
                self.origins.append(doc)
                yield authors_window(ids, self.p.seq_len)
            else:
                yield from self._pack(ids, doc)
        if self.p.mode == "packed" and self._stream:
            yield from self._keep_or_skip(self._stream, "packed_remainder", self._origin(0))
            self._stream, self._starts = [], []

    def _wrap(self, ids: list[int]) -> list[int] | None:
        if not ids and self.p.mode != AUTHORS:  # to_tokens('') is [BOS]: kept
            self.skipped["docs_empty"] += 1
            return None
        if ids and (min(ids) < 0 or max(ids) >= self.d_vocab):
            bad = next(i for i in ids if not 0 <= i < self.d_vocab)
            if self.p.oov == "error":
                raise ValueError(f"token id {bad} outside the vocabulary 0..{self.d_vocab - 1}"
                                 "; use oov='skip' to drop such documents")
            self.skipped["docs_oov"] += 1
            return None
        head = [self.p.bos] if self.p.bos is not None else []
        tail = [self.p.eos] if self.p.eos is not None else []
        return head + list(ids) + tail

    def _keep_or_skip(self, ids: list[int], reason: str, doc: int) -> Iterator[list[int]]:
        if len(ids) == self.p.seq_len + 1 or (self.p.short == "keep" and len(ids) >= 2):
            self.origins.append(doc)
            yield ids
        else:
            self.skipped[reason] += 1

    def _origin(self, at: int) -> int:
        """The document of stream offset ``at``."""
        return next(d for start, d in reversed(self._starts) if start <= at)

    def _pack(self, ids: list[int], doc: int) -> Iterator[list[int]]:
        self._starts.append((len(self._stream), doc))
        self._stream.extend(ids)
        L = self.p.seq_len + 1
        n = len(self._stream) // L
        for i in range(n):
            self.origins.append(self._origin(i * L))
            yield self._stream[i * L:(i + 1) * L]
        del self._stream[: n * L]
        first = self._origin(n * L) if self._stream else doc
        self._starts = [(max(s - n * L, 0), d) for s, d in self._starts if d >= first]


def authors_window(ids: list[int], T: int) -> list[int]:
    """pythia.py's window of a document (``ids`` with its BOS): the first T of its first N_CTX
    tokens zero-padded to T (inputs), then one 0 (the last target): T+1 tokens."""
    head = ids[:min(T, N_CTX)]
    return head + [0] * (T - len(head)) + [0]


def batches(windows: Iterable[list[int]], T: int, batch_size: int
            ) -> Iterator[tuple[Tensor, Tensor]]:
    """Group windows into (tokens [n, T+1] int64 zero-padded, lengths [n])."""
    buf: list[list[int]] = []
    for w in windows:
        buf.append(w)
        if len(buf) == batch_size:
            yield to_batch(buf, T)
            buf = []
    if buf:
        yield to_batch(buf, T)


def to_batch(rows: list[list[int]], T: int) -> tuple[Tensor, Tensor]:
    """Pad rows to T+1 with 0 (never counted: lengths mark the valid prefix)."""
    if all(len(r) == T + 1 for r in rows):
        return torch.tensor(rows, dtype=torch.int64), torch.full((len(rows),), T + 1)
    out = torch.zeros(len(rows), T + 1, dtype=torch.int64)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.int64)
    return out, lengths


def describe_skips(counts: dict, T: int) -> str:
    """What was left out and why, in one line (from a run's document counts)."""
    read = counts.get("docs_read", counts.get("docs", 0))
    parts = [f"{read:,} documents read"]
    reasons = (("docs_oov", "dropped for a token outside the vocabulary (with word:K, a word "
                "outside the K most frequent: the paper's rule; --oov unk maps such words to "
                "the [UNK] id instead)"),
               ("docs_short", f"shorter than T+1 = {T + 1:,} tokens (--keep-short keeps them)"),
               ("packed_remainder", "packed remainders shorter than T+1 tokens"),
               ("docs_under_min_chars", "under --min-chars"), ("docs_empty", "empty"))
    parts += [f"{counts[k]:,} {why}" for k, why in reasons if counts.get(k)]
    if read <= 1:
        parts.append("a .txt file is cut into documents at <|endoftext|> lines, or at blank "
                     "lines when it has none (--doc-split line|blank-line|endoftext|whole)")
    return "; ".join(parts)


def as_ids(tokens: Tensor, device: torch.device) -> Tensor:
    """An integer batch as int64 on ``device`` (anything else is refused in one line)."""
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
        raise BadInputError("tokens must be an integer tensor [n, T+1]")
    return tokens.to(device, torch.int64)


def check_batch(tokens: Tensor, lengths: Tensor | None, d_vocab: int, T: int) -> Tensor:
    """Validate a batch of windows for a pass; return lengths (full rows when None)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise BadInputError("tokens must be an integer tensor [n, T+1]")
    if tokens.shape[1] < 2 or tokens.shape[1] > T + 1:
        raise BadInputError(f"tokens have {tokens.shape[1]} columns; valid: 2..T+1 = {T + 1}")
    L = tokens.shape[1]
    if lengths is None:
        lengths = torch.full((tokens.shape[0],), L, dtype=torch.int64, device=tokens.device)
    lengths = lengths.to(device=tokens.device, dtype=torch.int64)
    if lengths.shape != (tokens.shape[0],) or bool(((lengths < 2) | (lengths > L)).any()):
        raise BadInputError(f"lengths must be [n] with 2 <= length <= {L} (T+1 tokens)")
    valid = torch.arange(L, device=tokens.device)[None, :] < lengths[:, None]
    bad = valid & ((tokens < 0) | (tokens >= d_vocab))
    if bool(bad.any()):
        raise BadInputError(f"token id {int(tokens[bad][0])} outside the vocabulary "
                            f"0..{d_vocab - 1} (d_vocab = {d_vocab})")
    return lengths


def trimmed(tokens: Tensor, lengths: Tensor) -> Tensor:
    """The batch without the columns no row reaches (padding only): the kernels then cost
    what the longest window of the batch needs, not T (--keep-short with a large T)."""
    if lengths.numel() == 0:
        return tokens
    L = int(lengths.max())
    return tokens if L >= tokens.shape[1] else tokens[:, :L]
