"""The sweep's frozen configuration and its file layout."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pythia_probe.analysis import get_analyses
from pythia_probe.analysis.cosine import DEFAULT_CHUNK
from pythia_probe.errors import BadInputError, check_device
from pythia_probe.results import ResultsError, read_shard

DTYPES = {"float32": torch.float32, "float64": torch.float64}
SHARDS, FAILED = "shards", "failed"
THEORY_MODES = ("streamed", "memory", "auto")


@dataclass(frozen=True)
class SweepConfig:
    """One sweep. ``heads``: "all", "none" or comma-separated layer indices for per-head rows."""

    model: str
    steps: str
    stats: str
    out: str
    analyses: tuple[str, ...] = ("embedding", "attention")
    device: str = "cpu"
    dtype: str = "float32"
    heads: str = "all"
    retries: int = 1
    chunk: int = DEFAULT_CHUNK
    batch_size: int = 4096
    tokenizer: str | None = None
    cache_dir: str | None = None
    prefetch: int = 1
    text: str | None = None  # safetensors with "tokens" [N, T+1], for attention_text
    text_rows: int = 32
    theory: str = "auto"  # streamed (C_T cached on disk, read in blocks), memory, auto (fits?)
    theory_cache: str | None = None  # default: <stats stem>.theory/ next to the statistics
    max_rank: int = 0  # layers per pass over the theory: stacked factor rank bound, 0 = one layer
    dry_run: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self):
        get_analyses(list(self.analyses))  # raises naming the valid analyses
        if self.dtype not in DTYPES:
            raise BadInputError(f"--dtype {self.dtype!r} not supported; valid: {', '.join(DTYPES)}")
        if self.heads not in ("all", "none") and not all(
                p.strip().isdigit() for p in self.heads.split(",")):
            raise BadInputError(f"--heads {self.heads!r}: use all, none or layers like 1,12,23")
        if min(self.retries, self.prefetch, self.max_rank) < 0 or min(self.chunk,
                                                                      self.batch_size) < 1:
            raise BadInputError("--retries, --prefetch and --max-rank must be >= 0, --chunk and "
                                "--batch-size >= 1")
        text = [a.name for a in get_analyses(list(self.analyses)) if a.needs.text]
        if text and not self.text:
            raise BadInputError(f"analysis {text[0]} needs --text (a safetensors file with "
                                "'tokens' [N, T+1], e.g. the demo's tokens.safetensors)")
        if self.theory not in THEORY_MODES:
            raise BadInputError(f"--theory {self.theory!r}; valid: {', '.join(THEORY_MODES)}")
        check_device(self.device)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    @property
    def per_head(self) -> bool | list[int]:
        if self.heads in ("all", "none"):
            return self.heads == "all"
        return [int(p) for p in self.heads.split(",")]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def identity(self) -> dict:
        """The fields that must match for a rerun to resume into the same folder."""
        return {k: getattr(self, k) for k in ("model", "analyses", "dtype", "heads", "text")}


def split_steps(steps: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The steps process ``rank`` of ``world_size`` handles (round-robin, disjoint, complete)."""
    return list(steps[rank::world_size])


def shard_path(out: str | os.PathLike, step: int) -> Path:
    return Path(out) / SHARDS / f"step{step}.parquet"


def shard_done(cfg: SweepConfig, step: int, stats_id: str | None = None) -> bool:
    """A step counts as done only if its shard reads back valid, for this step (and stats_id),
    with rows of every asked analysis; an empty, truncated or partial shard is recomputed."""
    path = shard_path(cfg.out, step)
    if not path.is_file():
        return False
    try:
        df = read_shard(path)
    except ResultsError:
        return False
    if df.empty or not (df["step"] == step).all():
        return False
    if stats_id is not None and not (df["stats_id"] == stats_id).all():
        return False
    return set(cfg.analyses) <= set(df["analysis"])

