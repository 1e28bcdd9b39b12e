"""The sweep's flags (:class:`SweepFlags`): their names, types, defaults and help, and nothing
else, so that ``python -m pythia_probe.sweep --help`` imports no torch. The validated
configuration is :class:`~pythia_probe.sweep.config.SweepConfig` (the same fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pythia_probe.analysis.defaults import DEFAULT_CHUNK
from pythia_probe.stats.config import DEFAULT_GROUPS


@dataclass(frozen=True)
class SweepFlags:
    """Score every checkpoint of a model against corpus statistics, one table shard per step.

    With no flags but --steps this is the leading-terms paper's Pythia experiment:
    EleutherAI/pythia-1.4b, the embedding and attention maps (the authors' LN-folded one and the
    raw one), statistics of the first 100,000 OpenWebText documents of >= 512 characters (built
    on first use, then cached), results in runs/<model name>/."""

    steps: str = field(default="all", metadata={"list": True})
    """Steps: 1000-143000, 1000-143000:5000, 0,1,2,4,512, early, log or all."""
    model: str = field(default="EleutherAI/pythia-1.4b", metadata={"list": True})
    """Hub id (any Pythia size or -deduped) or a folder with one step*/ folder per checkpoint;
    several, comma-separated, sweep into one table (a model column)."""
    suite: Literal["pythia", "pythia-deduped"] | None = None
    """Every size of a suite instead of --model: pythia (14m, 31m, 70m, 160m, 410m, 1b, 1.4b,
    2.8b, 6.9b, 12b) or pythia-deduped (70m ... 12b)."""
    out: str | None = None
    """Results folder: shards/, failed/, manifest.json (default: runs/<model name>, runs/<suite>,
    runs/<name>_<name>... for several)."""
    analyses: tuple[str, ...] = ("embedding", "attention_lnfold", "attention")
    """Comma-separated: embedding, attention_lnfold (the authors' LN-folded, centred W_Q/W_K),
    attention (raw weights), unembedding, attention_text."""
    stats: str | None = None
    """A statistics file from `python -m pythia_probe.stats` (default: built with the recipe
    below on first use and cached under $HF_HOME/pythia_probe/stats)."""
    dataset: str = "Skylion007/openwebtext"
    """Statistics recipe: the corpus (a hub dataset id, a local file or folder, 'builtin')."""
    data_dir: str | None = None
    """Statistics recipe, hub dataset: only its parquet files under this folder."""
    recipe: Literal["openwebtext", "fineweb"] | None = None
    """A named corpus for the statistics: openwebtext (Skylion007/openwebtext, Figures 6-7)
    or fineweb (HuggingFaceFW/fineweb, its sample/10BT folder: Figure 8); the document rule
    (--docs, --min-chars, --seq-len) is the same. Instead of --dataset/--data-dir."""
    docs: int = 100_000
    """Statistics recipe: the first N documents with >= --min-chars characters."""
    min_chars: int = 512
    """Statistics recipe: minimum document length in characters."""
    seq_len: int = 128
    """Statistics recipe: T, the first T+1 tokens of each document."""
    top_k: str = "full"
    """Statistics vocabulary: full (the authors' default, on every machine) or K (the K most
    frequent tokens; 5000 was the authors' find_top_tokens setting). Memory never chooses
    the vocabulary, only how the work is chunked."""
    tokenizer: str | None = None
    """Tokenizer of the statistics (default: the one the model ships)."""
    groups: int = DEFAULT_GROUPS
    """Statistics recipe: G document groups (document ordinal mod G) kept beside the totals,
    for the ceiling (two halves) and the jackknife intervals (G left out); 0: none, and the
    results then have value, chance, chance_sd and above_chance (from chance_sd) only."""
    conventions: Literal["paper", "authors"] = "paper"
    """Statistics recipe: paper (this toolkit's definitions, the spec's) or authors (exactly
    what the authors' pythia.py computes: BOS prepended, the last target 0, short documents
    padded and counted, centring by the model's embedding rows, their top-K rule and
    compositions over the kept ids); with --stats, the file's own must be this one."""
    device: str = "auto"
    """auto (cuda when there is one, else cpu), cpu, cuda, cuda:N."""
    dtype: Literal["float32", "float64"] = "float32"
    """Compute dtype of the analyses."""
    heads: str = field(default="all", metadata={"list": True})
    """Per-head rows: all, none, or layers numbered as in the paper and the tables (from 1),
    like 2,13,24."""
    retries: int = 1
    """Tries again after a failing step before recording it in failed/."""
    chunk: int = DEFAULT_CHUNK
    """Vocabulary columns per block of a target matrix."""
    batch_size: int = 4096
    """Tokens per batch of single-token residual streams."""
    cache_dir: str | None = None
    """Checkpoint download cache (default: the tool's own, $HF_HOME/pythia_probe/checkpoints;
    an existing Hugging Face cache may be given: only files the tool downloaded are deleted)."""
    prefetch: int = 1
    """Checkpoints downloaded ahead of the one being scored."""
    max_disk_gb: float | None = None
    """Disk the checkpoint downloads may hold at once, in GB (default: 90% of the free space
    of the cache's filesystem, measured at the start)."""
    text: str | None = None
    """attention_text: a safetensors file with 'tokens' [N, T+1]."""
    text_rows: int = 32
    """attention_text: sequences used."""
    max_rank: int = 0
    """Score several layers per pass over a target while their stacked factor rank stays
    below this (fewer reads, more memory); 0: one layer per pass."""
    dry_run: bool = False
    """Print the plan (steps, downloads, disk, memory, vocabulary, targets) and stop."""
    shard: str | None = None
    """i/N: this launch scores the i-th of N shares of the tasks (0 <= i < N), into the shared
    --out (default: the Slurm array task's place, SLURM_ARRAY_TASK_ID, else all); ranks of
    torchrun/accelerate split each share further."""
    intervals: bool = True
    """ceiling, ceiling_half, ci_low, ci_high and effect on every row where the statistics
    keep document groups (G + 1 scorings per step; --no-intervals: value, chance, chance_sd
    and above_chance from chance_sd alone)."""
    progress: bool = True
    """Show the progress display."""
    plots: bool = True
    """At the end draw the paper's Figures 6 and 7 and a picture of every metric into
    OUT/plots (--no-plots: none; `python -m pythia_probe.plots` draws them later)."""
