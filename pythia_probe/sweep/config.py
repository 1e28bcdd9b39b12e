"""The sweep's configuration: the command's flags (:class:`SweepConfig`, parsed and validated
once at the entry point) and the small frozen parts each component takes (:meth:`split`).

- :class:`SourceConfig`: where the weights come from (model, cache, prefetch, disk limit);
  read by ``sweep.source``.
- :class:`StatisticsConfig`: which statistics (``--stats`` or the recipe, the vocabulary);
  ``sweep.statistics``.
- :class:`ScoringConfig`: what is scored and how (analyses, dtype, device, per-head layers,
  block sizes); ``sweep.scoring``.
- :class:`PlanConfig`: which steps, retries, dry run; ``planner.sweep``, ``sweep.runner``.
- :class:`OutputConfig`: the results folder and the progress display; ``sweep.runner``.

Ranks are not configuration: the entry point builds :class:`~pythia_probe.ranks.Ranks` and
passes it beside the parts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from pythia_probe.analysis import get_analyses
from pythia_probe.analysis.cosine import DEFAULT_CHUNK
from pythia_probe.errors import BadInputError, StepError
from pythia_probe.hub import parse_steps
from pythia_probe.ranks import check_device
from pythia_probe.stats.conventions import check as check_conventions
from pythia_probe.stats.groups import DEFAULT_GROUPS, check_groups
from pythia_probe.stats.kept import parse_top_k
from pythia_probe.stats.recipe import RECIPES

DTYPES = {"float32": torch.float32, "float64": torch.float64}
RUNS = "runs"  # default results root: git-ignored, never beside committed results/
MAX_STEP = 10_000_000  # larger than any training run's step count


#: the Pythia suite by name (pythia-and-data: 10 sizes, -deduped from 70m): explicit hub ids
SUITES = {
    "pythia": ("EleutherAI/pythia-14m", "EleutherAI/pythia-31m", "EleutherAI/pythia-70m",
               "EleutherAI/pythia-160m", "EleutherAI/pythia-410m", "EleutherAI/pythia-1b",
               "EleutherAI/pythia-1.4b", "EleutherAI/pythia-2.8b", "EleutherAI/pythia-6.9b",
               "EleutherAI/pythia-12b"),
    "pythia-deduped": ("EleutherAI/pythia-70m-deduped", "EleutherAI/pythia-160m-deduped",
                       "EleutherAI/pythia-410m-deduped", "EleutherAI/pythia-1b-deduped",
                       "EleutherAI/pythia-1.4b-deduped", "EleutherAI/pythia-2.8b-deduped",
                       "EleutherAI/pythia-6.9b-deduped", "EleutherAI/pythia-12b-deduped"),
}


@dataclass(frozen=True)
class SourceConfig:
    """Where the weights come from: the models (one or several), the cache, the downloads."""

    models: tuple[str, ...]
    suite: str | None = None
    cache_dir: str | None = None
    prefetch: int = 1
    max_disk_gb: float | None = None

    @property
    def model(self) -> str:
        """The models as typed: one id, or the comma-separated list."""
        return ",".join(self.models)

    @staticmethod
    def name_of(model: str) -> str:
        """A model's name in the tables: the hub id, or a local folder's own name."""
        return Path(model).name if Path(model).exists() else model

    @property
    def name(self) -> str:
        return ",".join(self.name_of(m) for m in self.models)


@dataclass(frozen=True)
class StatisticsConfig:
    """Which statistics: ``stats`` (a file), else the recipe, built on first use and cached."""

    stats: str | None = None
    dataset: str = "Skylion007/openwebtext"
    data_dir: str | None = None
    recipe: str | None = None  # the preset the dataset came from (recorded), if any
    docs: int = 100_000
    min_chars: int = 512
    seq_len: int = 128
    top_k: str = "full"
    tokenizer: str | None = None
    groups: int = DEFAULT_GROUPS
    conventions: str = "paper"

    def used(self) -> dict:
        """What the run records: the file alone when given, else the recipe's fields."""
        if self.stats is not None:
            return {"stats": self.stats, "tokenizer": self.tokenizer,
                    "conventions": self.conventions}
        return asdict(self)


@dataclass(frozen=True)
class ScoringConfig:
    """What is scored and how: the analyses, their dtype and device, per-head layers, blocks."""

    analyses: tuple[str, ...]
    device: str = "cpu"
    dtype: str = "float32"
    heads: str = "all"
    chunk: int = DEFAULT_CHUNK
    batch_size: int = 4096
    max_rank: int = 0
    text: str | None = None
    text_rows: int = 32
    intervals: bool = True  # ceiling and ci columns where the statistics have groups

    @property
    def per_head(self) -> bool | list[int]:
        """True (every layer), False (none) or the layers numbered from 1."""
        if self.heads in ("all", "none"):
            return self.heads == "all"
        return [int(p) for p in self.heads.split(",")]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def used(self) -> dict:
        return {**asdict(self), "analyses": list(self.analyses)}


@dataclass(frozen=True)
class PlanConfig:
    """Which steps, how often a failing step is retried, whether to stop after the plan, and
    which share of the tasks this launch takes (``--shard i/N``)."""

    steps: str = "all"
    retries: int = 1
    dry_run: bool = False
    shard: str | None = None

    @property
    def share(self) -> tuple[int, int] | None:
        """``--shard i/N`` as (i, N), or None."""
        return None if self.shard is None else parse_shard(self.shard)


@dataclass(frozen=True)
class OutputConfig:
    """The results folder, the progress display and the figures drawn at the end."""

    out: str
    progress: bool = True
    plots: bool = True
    plots_dir: str | None = None  # not a flag: where the figures go (default OUT/plots)

    @property
    def figures(self) -> Path:
        return Path(self.plots_dir) if self.plots_dir else Path(self.out) / "plots"


@dataclass(frozen=True)
class SweepParts:
    """The parts of one sweep's configuration, each read only by the component it names."""

    source: SourceConfig
    statistics: StatisticsConfig
    scoring: ScoringConfig
    plan: PlanConfig
    output: OutputConfig

    def identity(self) -> dict:
        """What must match for a rerun to resume into the same folder."""
        s = self.scoring
        return {"model": self.source.model, "analyses": list(s.analyses), "dtype": s.dtype,
                "heads": s.heads, "text": s.text, "intervals": s.intervals}

    def record(self) -> dict:
        """The run's configuration as used, part by part (the manifest's ``config``)."""
        return {"source": asdict(self.source), "statistics": self.statistics.used(),
                "scoring": self.scoring.used(), "plan": asdict(self.plan),
                "output": asdict(self.output), **self.identity()}


@dataclass(frozen=True)
class SweepConfig:
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

    def __post_init__(self):
        get_analyses(list(self.analyses))  # raises naming the valid analyses
        check_groups(self.groups)
        if self.dtype not in DTYPES:
            raise BadInputError(f"--dtype {self.dtype!r} not supported; valid: {', '.join(DTYPES)}")
        if self.heads not in ("all", "none") and not all(
                p.strip().isdigit() and int(p) >= 1 for p in self.heads.split(",")):
            raise BadInputError(f"--heads {self.heads!r}: use all, none or layers numbered "
                                "from 1 like 2,13,24")
        if min(self.retries, self.prefetch, self.max_rank) < 0 or min(self.chunk,
                                                                      self.batch_size) < 1:
            raise BadInputError("--retries, --prefetch and --max-rank must be >= 0, --chunk and "
                                "--batch-size >= 1")
        if self.max_disk_gb is not None and not self.max_disk_gb > 0:
            raise BadInputError(f"--max-disk-gb {self.max_disk_gb}: must be > 0")
        text = [a.name for a in get_analyses(list(self.analyses)) if a.needs.text]
        if text and not self.text:
            raise BadInputError(f"analysis {text[0]} needs --text (a safetensors file with "
                                "'tokens' [N, T+1], e.g. the demo's tokens.safetensors)")
        parse_top_k(self.top_k)
        check_conventions(self.conventions)
        if min(self.docs, self.seq_len) < 1 or self.min_chars < 0:
            raise BadInputError("--docs and --seq-len must be >= 1, --min-chars >= 0")
        check_steps_syntax(self.steps)
        object.__setattr__(self, "model", ",".join(model_list(self.model, self.suite)))
        if self.shard is not None:
            parse_shard(self.shard)
        if self.recipe is not None:
            check_recipe(self.recipe, self.dataset, self.data_dir)
        if self.device == "auto":  # resolved once, so every part and the manifest see one
            object.__setattr__(self, "device", "cuda" if torch.cuda.is_available() else "cpu")
        check_device(self.device)
        if self.out is None:
            name = self.suite or "_".join(Path(m.rstrip("/")).name for m in self.models)
            object.__setattr__(self, "out", str(Path(RUNS) / name))
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise BadInputError(f"--out {self.out} is a file: give a results folder (new, or "
                                "one of an earlier run to resume)")

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.model.split(","))

    def split(self, device: str | None = None) -> SweepParts:
        """The parts; ``device``: this rank's own device (the entry point's Ranks)."""
        return SweepParts(
            SourceConfig(self.models, self.suite, self.cache_dir, self.prefetch,
                         self.max_disk_gb),
            self._statistics(),
            ScoringConfig(tuple(self.analyses), device or self.device, self.dtype, self.heads,
                          self.chunk, self.batch_size, self.max_rank, self.text, self.text_rows,
                          self.intervals),
            PlanConfig(self.steps, self.retries, self.dry_run, self.shard),
            OutputConfig(str(self.out), self.progress, self.plots))

    def _statistics(self) -> StatisticsConfig:
        dataset, data_dir = self.dataset, self.data_dir
        if self.recipe is not None:
            dataset, data_dir = RECIPES[self.recipe].dataset, RECIPES[self.recipe].data_dir
        return StatisticsConfig(self.stats, dataset, data_dir, self.recipe, self.docs,
                                self.min_chars, self.seq_len, self.top_k, self.tokenizer,
                                self.groups, self.conventions)


def check_recipe(name: str, dataset: str, data_dir: str | None) -> None:
    """A named recipe sets the corpus: refuse it beside a --dataset or --data-dir of another."""
    if name not in RECIPES:
        raise BadInputError(f"--recipe {name!r}; valid: {', '.join(RECIPES)}")
    preset = RECIPES[name]
    default = SweepConfig.__dataclass_fields__["dataset"].default
    if dataset not in (default, preset.dataset) or data_dir not in (None, preset.data_dir):
        reads = " ".join(x for x in (preset.dataset, preset.data_dir) if x)
        raise BadInputError(f"--recipe {name} reads {reads}; give either --recipe or "
                            "--dataset/--data-dir, not both")


def model_list(model: str, suite: str | None) -> list[str]:
    """The models of --model (comma-separated) or --suite; both given is refused."""
    if suite is not None:
        if suite not in SUITES:
            raise BadInputError(f"--suite {suite!r}; valid: {', '.join(SUITES)}")
        if model != SweepConfig.__dataclass_fields__["model"].default:
            raise BadInputError(f"--suite {suite} names its models; give either --suite or "
                                "--model, not both")
        return list(SUITES[suite])
    models = [_spelling(m.strip()) for m in model.split(",")]
    if not all(models) or len(set(models)) < len(models):
        raise BadInputError(f"--model {model!r}: give hub ids or folders, comma-separated, "
                            "each once")
    check_distinct(models)
    return models


def _spelling(model: str) -> str:
    """A folder without its trailing separators (``A/`` is ``A``); a hub id as typed."""
    return model.rstrip("/\\") or model if Path(model).expanduser().is_dir() else model


def check_distinct(models: list[str]) -> None:
    """Models are keyed by identity: a folder by its real path, a hub id by itself. The same
    folder under two spellings, or two folders whose names (the table's model column) agree,
    are refused in one line naming both."""
    by_id: dict[str, str] = {}
    by_name: dict[str, str] = {}
    for m in models:
        path = Path(m).expanduser()
        ident = str(path.resolve()) if path.exists() else m
        if ident in by_id:
            raise BadInputError(f"--model: {by_id[ident]} and {m} are the same folder ({ident}); "
                                "give each model once")
        name = SourceConfig.name_of(m)
        if name in by_name:
            raise BadInputError(
                f"--model: {by_name[name]} and {m} are two models named {name!r} (a folder's "
                "name is its model column in the table); give one another name (a symlink, "
                "e.g. `ln -s PATH NEWNAME`) or sweep them into separate --out folders")
        by_id[ident], by_name[name] = m, m


def parse_shard(text: str) -> tuple[int, int]:
    """--shard "i/N" -> (i, N) with 0 <= i < N."""
    i, _, n = str(text).partition("/")
    if not (i.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(i) < int(n):
        raise BadInputError(f"--shard {text!r}: give INDEX/COUNT with 0 <= INDEX < COUNT, "
                            "e.g. 0/4 ... 3/4")
    return int(i), int(n)


def check_steps_syntax(spec: str) -> None:
    """Refuse a malformed --steps before anything is asked of the hub: the spec is parsed
    against every step up to the largest number it names (which steps the model really has is
    checked once they are listed)."""
    numbers = [int(n) for n in "".join(c if c.isdigit() else " " for c in str(spec)).split()]
    if max(numbers, default=0) > MAX_STEP:
        raise StepError(f"--steps {spec!r}: step {max(numbers)} is beyond any checkpoint "
                        f"schedule (at most {MAX_STEP:,})")
    parse_steps(spec, range(max(numbers, default=0) + 1))
