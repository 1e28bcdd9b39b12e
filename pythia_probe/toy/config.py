"""Settings of a toy training run: the flags validated (TrainConfig; their names, defaults and
help: toy/flags.py), the names older manifests used, and the step arithmetic of the schedule
(Schedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from pythia_probe.cli import flag
from pythia_probe.errors import BadInputError
from pythia_probe.ranks import check_device
from pythia_probe.toy.data import TOKENIZERS, ToyDataConfig
from pythia_probe.toy.flags import PRESETS, TrainFlags, with_preset  # noqa: F401 - public names

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class TrainConfig(TrainFlags):
    __doc__ = TrainFlags.__doc__  # the flags and their help: toy/flags.py

    def __post_init__(self) -> None:
        kind, size = parse_tokenizer(self.tokenizer)
        if kind not in TOKENIZERS:
            raise BadInputError(f"--tokenizer {self.tokenizer!r}: valid: word:K or bpe:K")
        if self.dtype not in DTYPES:
            raise BadInputError(f"--dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("batch_size", "micro_batch", "log_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise BadInputError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("layers", "seq_len", "n_seqs", "epochs", "stories"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        if size < 1:
            raise BadInputError(f"--tokenizer {self.tokenizer!r}: K must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise BadInputError(f"--lr must be a positive finite number, got {self.lr}")
        if self.batch_size > self.n_seqs:
            raise BadInputError(f"--batch-size {self.batch_size} exceeds --n-seqs {self.n_seqs}")
        if self.device != "auto":
            check_device(self.device)

    def data_config(self) -> ToyDataConfig:
        kind, size = parse_tokenizer(self.tokenizer)
        return ToyDataConfig(source=self.dataset, tokenizer=kind, d_vocab=size,
                             seq_len=self.seq_len, n_seqs=self.n_seqs, max_docs=self.docs,
                             corpus_opts=({"n_stories": self.stories}
                                          if self.dataset == "builtin" else {}))


def parse_tokenizer(spec: str) -> tuple[str, int]:
    """'word:3000' -> ("word", 3000); refused (one line) unless KIND:INTEGER."""
    kind, _, size = spec.partition(":")
    if not size.isdigit():
        raise BadInputError(f"--tokenizer {spec!r}: valid: word:K or bpe:K (K an integer)")
    return kind, int(size)


#: field names of runs saved before the flag vocabulary was unified -> today's
LEGACY_FIELDS = {"data": "dataset", "builtin_stories": "stories", "max_docs": "docs"}


def saved_config(saved: dict) -> dict:
    """A run manifest's config in today's field names (older runs wrote data, vocab, ...)."""
    cfg = {LEGACY_FIELDS.get(k, k): v for k, v in saved.items()}
    if "vocab" in cfg and ":" not in str(cfg.get("tokenizer", "")):
        cfg["tokenizer"] = f"{cfg.get('tokenizer', 'word')}:{cfg.pop('vocab')}"
    names = {f.name for f in fields(TrainConfig)}
    return {k: v for k, v in cfg.items() if k in names}


@dataclass(frozen=True)
class Schedule:
    """Step arithmetic of a run: N sequences, batch B, epochs; shuffled per epoch by seed."""

    n_seqs: int
    batch: int
    epochs: int
    seed: int
    log_every: int
    checkpoint_every: int

    @property
    def steps_per_epoch(self) -> int:
        return self.n_seqs // self.batch

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def permutation(self, epoch: int) -> Tensor:
        """Order of epoch ``epoch``; the identity for full-batch runs."""
        if self.batch == self.n_seqs:
            return torch.arange(self.n_seqs)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n_seqs, generator=g)

    def batch_indices(self, step: int) -> Tensor:
        """Sequence indices of the batch used for update number step + 1."""
        epoch, b = divmod(step, self.steps_per_epoch)
        return self.permutation(epoch)[b * self.batch:(b + 1) * self.batch]


def make_schedule(cfg: TrainConfig, n_seqs: int) -> Schedule:
    batch = cfg.batch_size or n_seqs
    spe = n_seqs // batch
    log_every = cfg.log_every or spe
    ckpt = cfg.checkpoint_every or max(spe, log_every)
    if ckpt % log_every:
        raise BadInputError(f"checkpoint_every {ckpt} must be a multiple of log_every {log_every}")
    return Schedule(n_seqs, batch, cfg.epochs, cfg.seed, log_every, ckpt)

