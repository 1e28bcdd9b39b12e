"""Settings of a toy training run: the flags (TrainConfig), the names older manifests used, and
the step arithmetic of the schedule (Schedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import Tensor

from pythia_probe.cli import flag
from pythia_probe.errors import BadInputError
from pythia_probe.ranks import check_device
from pythia_probe.toy.data import TOKENIZERS, ToyDataConfig

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class TrainConfig:
    """Toy training run. batch_size 0 = full batch; micro_batch 0 = no gradient accumulation;
    log_every 0 = once per epoch; checkpoint_every must be a multiple of log_every. The defaults
    fit the built-in corpus (benchmarks/bench_defaults.py times them); --preset paper is Table
    1's scale."""

    dataset: str = "builtin"
    """Corpus: 'builtin', a local .txt/.jsonl/.parquet file, or a hub dataset id."""
    tokenizer: str = "word:3000"
    """'word:K' (the paper's word rule, top-K words; stories with other words dropped) or
    'bpe:K' (a byte-level BPE with K ids trained on the data)."""
    layers: int = 3
    """Number of layers L."""
    seq_len: int = 64
    """T, predicted positions per sequence (stories keep T+1 tokens)."""
    n_seqs: int = 1024
    """Number of training sequences N."""
    docs: int | None = None
    """Read at most this many documents."""
    stories: int = 20000
    """Stories generated for --dataset builtin."""
    lr: float = 0.005
    """SGD learning rate."""
    epochs: int = 4
    """Epochs."""
    batch_size: int = 128
    """SGD batch (0 = full batch)."""
    micro_batch: int = 0
    """Gradient-accumulation chunk (0 = the whole batch)."""
    log_every: int = 0
    """Steps between result rows (0 = once per epoch)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0 = once per epoch; a multiple of log_every)."""
    seed: int = 0
    """Shuffling seed."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter dtype."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    out: str = "runs/toy"
    """Run folder (rows/, checkpoints/, manifest.json); the default is outside the committed
    results."""
    resume: bool = True
    """Continue from the newest checkpoint in --out (--no-resume: start from zero)."""
    preset: Literal["paper"] | None = None
    """paper: Table 1's run (TinyStories from the hub, word:3000, T 200, N 65536, batch 2048,
    micro-batch 512, 100 epochs, lr 0.005, --out runs/toy_paper); flags given beside it win."""

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


#: --preset NAME -> the flags it stands for (typed flags after them override)
PRESETS = {"paper": ("--dataset", "roneneldan/TinyStories", "--layers", "3", "--tokenizer",
                     "word:3000", "--seq-len", "200", "--n-seqs", "65536", "--batch-size", "2048",
                     "--micro-batch", "512", "--epochs", "100", "--lr", "0.005",
                     "--out", "runs/toy_paper")}


def with_preset(argv: list[str]) -> list[str]:
    """``argv`` with the flags of its ``--preset NAME`` put first, so typed flags override them
    (an unknown NAME is left for the parser to refuse with the valid names)."""
    for i, token in enumerate(argv):
        name = (token.split("=", 1)[1] if token.startswith("--preset=") else
                argv[i + 1] if token == "--preset" and i + 1 < len(argv) else None)
        if name in PRESETS:
            return [*PRESETS[name], *argv]
    return argv


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

