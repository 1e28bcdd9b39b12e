"""The flags of ``python -m pythia_probe.toy.train`` (:class:`TrainFlags`) and its presets:
names, types, defaults and help, and nothing else, so that ``--help`` imports no torch. The
validated configuration is :class:`~pythia_probe.toy.config.TrainConfig` (the same fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TrainFlags:
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
