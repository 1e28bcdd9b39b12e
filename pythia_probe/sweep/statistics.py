"""The statistics a sweep scores against: ``--stats``, or the paper's recipe for the model's
tokenizer, at the vocabulary the device can hold, built on first use and cached.

``--top-k auto`` keeps the full vocabulary when both the statistics (the engine --engine auto
picks: dense where its peak fits, else the sparse bound) and one sweep step (streamed theory)
fit the device's memory budget, else the 5,000 most frequent tokens (the authors'
``find_top_tokens`` default). The choice and why are printed and stored in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pythia_probe.errors import BadInputError, MissingFileError
from pythia_probe.resources import GB, memory_budget
from pythia_probe.stats import plan as stats_plan
from pythia_probe.stats import read_meta
from pythia_probe.stats.recipe import Recipe, cache_path
from pythia_probe.stats.result import DERIVED_LIMIT as EAGER_LIMIT
from pythia_probe.stats.result import check_tokenizer
from pythia_probe.sweep.config import SweepConfig, parse_top_k
from pythia_probe.sweep.sources import checkpoint_plan
from pythia_probe.tokenizer import d_vocab as tokenizer_d_vocab

DEFAULT_TOP_K = 5000


@dataclass(frozen=True)
class StatsChoice:
    """Where the statistics are, whether they exist yet, and the vocabulary they hold."""

    path: Path
    recipe: Recipe | None  # None: --stats given
    rows: int  # statistic rows the sweep scores (K, or the tokenizer's d_vocab)
    vocab_reason: str
    meta: dict | None  # the file's metadata once it exists

    @property
    def built(self) -> bool:
        return self.meta is not None

    @property
    def stats_id(self) -> str | None:
        return None if self.meta is None else str(self.meta["stats_id"])

    def file_bytes(self) -> int:
        """The statistics file's size, or its expected size before it is built."""
        if self.path.is_file():
            return self.path.stat().st_size
        full = self.recipe is not None and self.recipe.top_k is None and self.rows > EAGER_LIMIT
        return (4 if full else 7) * 8 * self.rows * self.rows

    def lines(self) -> list[str]:
        if self.recipe is None:
            return [f"statistics: {self.path} (--stats), {self.rows:,} rows"]
        r = self.recipe
        what = (f"{r.dataset}, first {r.docs:,} documents of >= {r.min_chars} characters, "
                f"first {r.seq_len + 1} tokens each")
        state = "cached" if self.built else "to build now (cached for every later run)"
        return [f"vocabulary: {self.vocab_reason}",
                f"statistics: {what}; {state}: {self.path}"]


def choose_vocab(cfg: SweepConfig, V: int, model_cfg,
                 budget: tuple[float | None, str] | None = None) -> tuple[int | None, str]:
    """(top-k or None for the full vocabulary, why) for ``--top-k``."""
    asked = parse_top_k(cfg.top_k)
    if asked is None:
        return None, f"full vocabulary ({V:,} ids), --top-k full given"
    if asked != "auto":
        return int(asked), f"the {asked:,} most frequent tokens, --top-k {asked} given"
    limit, how = budget if budget is not None else memory_budget(cfg.device)
    stats = stats_plan.statistics_need(V, cfg.seq_len, None, cfg.docs, cfg.device)
    step = checkpoint_plan(cfg, model_cfg, V, streamed=True).total
    need = f"statistics {stats / GB:.1f} GB, one sweep step {step / GB:.1f} GB"
    if limit is not None and max(stats, step) <= limit:
        return None, (f"full vocabulary ({V:,} ids): {need}, within the budget "
                      f"{limit / GB:.1f} GB ({how})")
    over = "budget unknown" if limit is None else f"over the budget {limit / GB:.1f} GB"
    return DEFAULT_TOP_K, (f"the {DEFAULT_TOP_K:,} most frequent tokens, --top-k auto: the full "
                           f"vocabulary ({V:,} ids) needs {need}, {over} ({how})")


def choose_statistics(cfg: SweepConfig, tok, fingerprint: dict | None, model_cfg,
                      budget: tuple[float | None, str] | None = None) -> StatsChoice:
    """``--stats`` checked against the model's tokenizer, or the recipe's cached file."""
    if cfg.stats is not None:
        path = Path(cfg.stats)
        meta = read_stats_meta(path, fingerprint)
        return StatsChoice(path, None, int(meta["d_vocab"]), "as in --stats", meta)
    if tok is None:
        raise BadInputError(f"{cfg.model} ships no tokenizer.json: give --tokenizer (to build "
                            "the statistics with it) or --stats")
    V = tokenizer_d_vocab(tok)
    top_k, why = choose_vocab(cfg, V, model_cfg, budget)
    recipe = Recipe(cfg.dataset, cfg.docs, cfg.min_chars, cfg.seq_len, top_k)
    path = cache_path(recipe, fingerprint)
    meta = read_stats_meta(path, fingerprint) if path.is_file() else None
    return StatsChoice(path, recipe, V if top_k is None else min(top_k, V), why, meta)


def read_stats_meta(path: Path, fingerprint: dict | None) -> dict:
    """A statistics file's metadata, refused when built with another tokenizer."""
    if not path.is_file():
        raise MissingFileError(f"--stats {path}: no such statistics file; compute one with "
                               "`python -m pythia_probe.stats compute ...`, or leave --stats "
                               "out to build the paper's recipe")
    meta = read_meta(path)
    if fingerprint is not None:
        check_tokenizer(meta, fingerprint, path)
    return meta
