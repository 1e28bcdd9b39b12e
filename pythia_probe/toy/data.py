"""The paper's TinyStories pipeline for the toy model (Sec. 5.1 and App. B).

Word variant: word-level tokens (lower-case letter runs; every other non-space character alone),
the ``d_vocab`` most common tokens, stories containing any other token dropped, stories with at
least T+1 tokens kept and truncated to T+1, the first ``n_seqs`` of them.
BPE variant (App. B): a byte-level BPE tokenizer trained with the ``tokenizers`` library
(``d_vocab`` = 10,000 in the paper); no story is dropped for out-of-vocabulary tokens.
Sources: "builtin" (offline default), a local file, or a hub id such as roneneldan/TinyStories.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor

from pythia_probe.corpus import iter_documents
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import atomic_write, write_json
from pythia_probe.tokenizer import (
    build_word_tokenizer,
    d_vocab,
    encode_documents,
    tokenizer_fingerprint,
)

TOKENIZERS = ("word", "bpe")


@dataclass(frozen=True)
class ToyDataConfig:
    """Which sequences to train on: source, tokenizer, vocabulary size, T and N."""

    source: str = "builtin"
    tokenizer: str = "word"
    d_vocab: int = 3000
    seq_len: int = 200
    n_seqs: int = 65536
    max_docs: int | None = None
    corpus_opts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise BadInputError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        for name in ("d_vocab", "seq_len", "n_seqs"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_docs is not None and self.max_docs < 1:
            raise BadInputError(f"max_docs must be >= 1 or None, got {self.max_docs}")


@dataclass
class ToyData:
    """Training sequences [N, T+1] (int64), the id -> token strings, and provenance."""

    tokens: Tensor
    d_vocab: int
    vocab: list[str]
    meta: dict


def _documents(cfg: ToyDataConfig) -> Callable[[], Iterator[str]]:

    def docs() -> Iterator[str]:
        return iter_documents(cfg.source, max_docs=cfg.max_docs, **cfg.corpus_opts)

    return docs


def collect_sequences(encoded: Iterable[list[int]], seq_len: int, n_seqs: int,
                      d_vocab: int) -> Tensor:
    """The first n_seqs encoded stories with >= seq_len + 1 ids (all < d_vocab), truncated."""
    rows = []
    for ids in encoded:
        if len(ids) > seq_len and max(ids) < d_vocab:
            rows.append(ids[: seq_len + 1])
            if len(rows) == n_seqs:
                break
    if len(rows) < n_seqs:
        raise BadInputError(f"only {len(rows)} stories have >= {seq_len + 1} in-vocabulary tokens, "
                            f"{n_seqs} requested; lower --n-seqs or --seq-len, or add documents")
    return torch.tensor(rows, dtype=torch.int64)


def word_data(cfg: ToyDataConfig) -> ToyData:
    """The paper's word-level pipeline (top-d_vocab words, OOV stories dropped)."""

    docs = _documents(cfg)
    tok = build_word_tokenizer(docs(), cfg.d_vocab)
    k = d_vocab(tok)
    tokens = collect_sequences(encode_documents(tok, docs(), drop_oov=True), cfg.seq_len,
                               cfg.n_seqs, k)
    vocab = tok.convert_ids_to_tokens(list(range(k)))
    return ToyData(tokens, k, vocab, {"tokenizer": tokenizer_fingerprint(tok)})


def build_bpe_tokenizer(docs: Iterable[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` with vocab_size ids trained on docs (App. B)."""

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def _encode_bpe(tok, docs: Iterable[str], chunk: int = 1024) -> Iterator[list[int]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == chunk:
            yield from (e.ids for e in tok.encode_batch(batch))
            batch = []
    yield from (e.ids for e in tok.encode_batch(batch))


def bpe_data(cfg: ToyDataConfig) -> ToyData:
    """App. B's BPE variant: train BPE on the documents, keep stories of >= T+1 tokens."""
    docs = _documents(cfg)
    tok = build_bpe_tokenizer(docs(), cfg.d_vocab)
    k = tok.get_vocab_size()
    tokens = collect_sequences(_encode_bpe(tok, docs()), cfg.seq_len, cfg.n_seqs, k)
    vocab = [tok.id_to_token(i) for i in range(k)]
    return ToyData(tokens, k, vocab, {"tokenizer": {"name": "bpe", "d_vocab": k}})


def load_toy_data(cfg: ToyDataConfig, cache_dir: str | Path | None = None) -> ToyData:
    """Build the sequences (or read them from ``cache_dir`` if built there with the same cfg)."""
    if cache_dir is not None:
        cached = _read_cache(Path(cache_dir), cfg)
        if cached is not None:
            return cached
    data = (word_data if cfg.tokenizer == "word" else bpe_data)(cfg)
    data.meta.update(config=asdict(cfg), n_seqs=len(data.tokens))
    if cache_dir is not None:
        _write_cache(Path(cache_dir), data)
    return data


def _write_cache(path: Path, data: ToyData) -> None:
    tokens = {"tokens": data.tokens.contiguous()}
    atomic_write(path / "tokens.safetensors", lambda tmp: save_file(tokens, str(tmp)))
    write_json(path / "vocab.json", {"d_vocab": data.d_vocab, "vocab": data.vocab,
                                     "meta": data.meta})


def _read_cache(path: Path, cfg: ToyDataConfig) -> ToyData | None:
    if not (path / "tokens.safetensors").exists() or not (path / "vocab.json").exists():
        return None
    meta = json.loads((path / "vocab.json").read_text())
    if meta["meta"].get("config") != json.loads(json.dumps(asdict(cfg), default=str)):
        return None
    tokens = load_file(str(path / "tokens.safetensors"))["tokens"]
    return ToyData(tokens, meta["d_vocab"], meta["vocab"], meta["meta"])
