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

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pythia_probe.analysis import get_analyses
from pythia_probe.analysis.defaults import DEFAULT_CHUNK
from pythia_probe.errors import BadInputError, StepError
from pythia_probe.hub import parse_steps
from pythia_probe.ranks import check_device
from pythia_probe.stats.config import DEFAULT_GROUPS
from pythia_probe.stats.conventions import check as check_conventions
from pythia_probe.stats.groups import check_groups
from pythia_probe.stats.kept import parse_top_k
from pythia_probe.stats.recipe import RECIPES
from pythia_probe.sweep.flags import SweepFlags

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
class SweepConfig(SweepFlags):
    __doc__ = SweepFlags.__doc__  # the flags and their help: sweep/flags.py

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
