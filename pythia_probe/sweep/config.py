"""The sweep's frozen configuration and its file layout."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    """Score every checkpoint of a model against corpus statistics, one table shard per step.

    With no flags but --steps this is the leading-terms paper's Pythia experiment:
    EleutherAI/pythia-1.4b, the embedding and attention maps (the authors' LN-folded one and the
    raw one), statistics of the first 100,000 OpenWebText documents of >= 512 characters (built
    on first use, then cached), results in results/<model name>/."""

    steps: str = "all"
    """Steps: 1000-143000, 1000-143000:5000, 0,1,2,4,512, early, log or all."""
    model: str = "EleutherAI/pythia-1.4b"
    """Hub id (any Pythia size or -deduped) or a folder with one step*/ folder per checkpoint."""
    out: str | None = None
    """Results folder: shards/, failed/, manifest.json (default: results/<model name>)."""
    analyses: tuple[str, ...] = ("embedding", "attention_lnfold", "attention")
    """Comma-separated: embedding, attention_lnfold (the authors' LN-folded, centred W_Q/W_K),
    attention (raw weights), unembedding, attention_text."""
    stats: str | None = None
    """A statistics file from `python -m pythia_probe.stats` (default: built with the recipe
    below on first use and cached under $HF_HOME/pythia_probe/stats)."""
    dataset: str = "Skylion007/openwebtext"
    """Statistics recipe: the corpus (a hub dataset id, a local file or folder, 'builtin')."""
    docs: int = 100_000
    """Statistics recipe: the first N documents with >= --min-chars characters."""
    min_chars: int = 512
    """Statistics recipe: minimum document length in characters."""
    seq_len: int = 128
    """Statistics recipe: T, the first T+1 tokens of each document."""
    top_k: str = "auto"
    """Statistics vocabulary: full, K (the K most frequent tokens), or auto (full where the
    plan fits the device, else 5000, the authors' find_top_tokens default)."""
    tokenizer: str | None = None
    """Tokenizer of the statistics (default: the one the model ships)."""
    device: str = "auto"
    """auto (cuda when there is one, else cpu), cpu, cuda, cuda:N."""
    dtype: Literal["float32", "float64"] = "float32"
    """Compute dtype of the analyses."""
    heads: str = "all"
    """Per-head rows: all, none, or layers like 1,12,23."""
    retries: int = 1
    """Tries again after a failing step before recording it in failed/."""
    chunk: int = DEFAULT_CHUNK
    """Vocabulary columns per block of the theory."""
    batch_size: int = 4096
    """Tokens per batch of single-token residual streams."""
    cache_dir: str | None = None
    """Checkpoint download cache (default: the tool's own, $HF_HOME/pythia_probe/checkpoints;
    an existing Hugging Face cache may be given: only files the tool downloaded are deleted)."""
    prefetch: int = 1
    """Checkpoints downloaded ahead of the one being scored."""
    text: str | None = None
    """attention_text: a safetensors file with 'tokens' [N, T+1]."""
    text_rows: int = 32
    """attention_text: sequences used."""
    theory: Literal["auto", "memory", "streamed"] = "auto"
    """memory: statistics resident; streamed: the prepared theory cached on disk and read in
    blocks (no V x V in memory); auto: memory when its planned peak fits the device."""
    theory_cache: str | None = None
    """Prepared-theory cache folder (default: <stats stem>.theory/ beside the statistics)."""
    max_rank: int = 0
    """Score several layers per pass over the theory while their stacked factor rank stays
    below this (fewer reads, more memory); 0: one layer per pass."""
    dry_run: bool = False
    """Print the plan (steps, downloads, disk, memory, vocabulary, theory) and stop."""
    progress: bool = True
    """Show the progress display."""
    rank: int = field(default=0, metadata={"cli": False})
    world_size: int = field(default=1, metadata={"cli": False})

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
        parse_top_k(self.top_k)
        if min(self.docs, self.seq_len) < 1 or self.min_chars < 0:
            raise BadInputError("--docs and --seq-len must be >= 1, --min-chars >= 0")
        if self.device == "auto":  # resolved once, so every part and the manifest see one
            object.__setattr__(self, "device", "cuda" if torch.cuda.is_available() else "cpu")
        check_device(self.device)
        if self.out is None:
            object.__setattr__(self, "out", str(Path("results") / Path(
                self.model.rstrip("/")).name))
        if not 0 <= self.rank < self.world_size:
            raise BadInputError(f"rank {self.rank} outside world size {self.world_size}")

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


def parse_top_k(text: str) -> str | int | None:
    """--top-k: "auto", None for "full", or the integer K >= 1."""
    if text in ("auto", "full"):
        return None if text == "full" else text
    if not text.isdigit() or int(text) < 1:
        raise BadInputError(f"--top-k {text!r}: valid: auto, full, or an integer K >= 1")
    return int(text)


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

