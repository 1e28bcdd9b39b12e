"""Statistics made from a recipe, once: cached by the recipe and the tokenizer's fingerprint.

A :class:`Recipe` is everything that decides the numbers (corpus, documents, sequence policy,
vocabulary); with the fingerprint of the tokenizer it names one file in the tool's cache
(``$PYTHIA_PROBE_CACHE/stats``, else ``$HF_HOME/pythia_probe/stats``). The first run builds it
(resuming a killed build from the work folder beside it); every later run, and every model with
the same tokenizer (all Pythia sizes share one), reads it without touching the corpus.

The paper's Pythia recipe (:data:`PAPER`): Skylion007/openwebtext, the first 100,000 documents
of >= 512 characters, each document's first T+1 = 129 tokens with the model's own tokenizer.
Where this departs from the authors' code: no BOS token is prepended (Pythia was trained
without one); documents shorter than T+1 tokens are skipped, not padded; the centring uses
U = 1/d_vocab with d_vocab the tokenizer's 50,277 ids, not the model's 50,304 rows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pythia_probe.hubio import tool_cache
from pythia_probe.progress import JobProgress
from pythia_probe.ranks import Ranks
from pythia_probe.stats.job import StatsConfig, compute

FORMAT = "pythia_probe.recipe/1"


@dataclass(frozen=True)
class Recipe:
    """What decides the statistics (besides the tokenizer)."""

    dataset: str = "Skylion007/openwebtext"
    docs: int | None = 100_000
    min_chars: int = 512
    seq_len: int = 128
    top_k: int | None = None
    split: str = "train"
    text_field: str = "text"


PAPER = Recipe()


def recipe_key(recipe: Recipe, fingerprint: dict) -> str:
    """16 hex digits naming ``recipe`` with the tokenizer of ``fingerprint``."""
    ident = {"format": FORMAT, **asdict(recipe), "tokenizer": fingerprint["sha256"],
             "d_vocab": fingerprint["d_vocab"]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(recipe: Recipe, fingerprint: dict, root: str | Path | None = None) -> Path:
    """The statistics file of ``recipe`` in the tool's cache (or ``root``)."""
    vocab = "full" if recipe.top_k is None else f"top{recipe.top_k}"
    key = recipe_key(recipe, fingerprint)
    name = f"{Path(recipe.dataset).name}-T{recipe.seq_len}-{vocab}-{key}.safetensors"
    return Path(root or tool_cache("stats")) / name


def stats_config(recipe: Recipe, tokenizer: str, out: Path, device: str,
                 progress: bool = True) -> StatsConfig:
    """The ``stats compute`` configuration of ``recipe`` (the first T+1 tokens of a document)."""
    return StatsConfig(dataset=recipe.dataset, out=str(out), tokenizer=tokenizer,
                       seq_len=recipe.seq_len, docs=recipe.docs, min_chars=recipe.min_chars,
                       mode="first", top_k=recipe.top_k, device=device,
                       text_field=recipe.text_field, split=recipe.split, progress=progress)


def ensure(recipe: Recipe, tok, fingerprint: dict, device: str, ranks: Ranks | None = None,
           progress: JobProgress | None = None, root: str | Path | None = None,
           show: bool = True) -> Path:
    """The statistics file of ``recipe``: read from the cache, or built now (rank 0 returns
    it after every rank finished). ``show=False``: no display of its own (--no-progress)."""
    path = cache_path(recipe, fingerprint, root)
    if path.is_file():
        return path
    cfg = stats_config(recipe, tok.name_or_path or "model tokenizer", path, device)
    compute(replace(cfg, progress=show and progress is None), ranks, tok=tok,
            progress=progress)
    if ranks is not None:
        ranks.barrier()  # rank 0 has written the file
    return path
