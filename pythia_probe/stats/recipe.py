"""Statistics made from a recipe, once: cached by the recipe and the tokenizer's fingerprint.

A :class:`Recipe` is everything that decides the numbers (corpus, documents, sequence policy,
vocabulary). The cache key is the content that decides them: every corpus shard's content
(a local file's size and sha256, a hub file's sha256 at the commit the listing pinned, never a
path or a modification time), the tokenizer's canonical fingerprint (never its name or where it
was loaded from) and the recipe; it names one file in the tool's cache
(``$PYTHIA_PROBE_CACHE/stats``, else ``$HF_HOME/pythia_probe/stats``). A changed corpus file
names another file, which the next run builds; the same recipe under two HF_HOME folders names
the same file (and the same stats_id). The first run builds it
(resuming a killed build from the work folder beside it); every later run, and every model with
the same tokenizer (all Pythia sizes share one), reads it without touching the corpus.

The paper's Pythia recipe (:data:`PAPER`): Skylion007/openwebtext, the first 100,000 documents
of >= 512 characters, each document's first T+1 = 129 tokens with the model's own tokenizer.
Where this departs from the authors' code (``conventions="paper"``, the default): no BOS token
is prepended (Pythia was trained without one); documents shorter than T+1 tokens are skipped,
not padded; the last target is the real next token; the centring uses U = 1/d_vocab with
d_vocab the tokenizer's 50,277 ids, not the model's 50,304 rows; a top-K is ranked by the
windows' counts and composed over the full vocabulary. ``conventions="authors"`` does what
pythia.py does instead (``stats/conventions.py``; ``d_vocab``: the model's embedding rows, else
read from the tokenizer's model config.json). The two never share a cache file (the key and the
file name hold the conventions), nor a stats_id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pythia_probe import corpus
from pythia_probe.corpus import content_digest
from pythia_probe.hub.io import tool_cache
from pythia_probe.progress import JobProgress
from pythia_probe.ranks import Ranks
from pythia_probe.stats.conventions import check as check_conventions
from pythia_probe.stats.groups import DEFAULT_GROUPS
from pythia_probe.stats.job import StatsConfig, compute

FORMAT = "pythia_probe.recipe/2"
UNKEYED = (("groups", 0), ("conventions", "paper"), ("d_vocab", None))
"""Recipe fields left out of the key at these values (the keys of files built before they
existed are kept)."""


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
    data_dir: str | None = None  # a hub dataset's folder (its shards are in the key anyway)
    groups: int = DEFAULT_GROUPS
    """G document groups kept (``stats compute --groups``; ``CorpusStats.subset``), read by
    the sweep's ceiling and interval columns; 0: none (and no such columns)."""
    conventions: str = "paper"
    """'paper' or 'authors' (``stats compute --conventions``, ``stats/conventions.py``)."""
    d_vocab: int | None = None
    """The statistics' vocabulary side and centring (``stats compute --d-vocab``; None: the
    tokenizer's ids, or under 'authors' its model config.json's vocab_size): the model's
    embedding rows under the authors' conventions (Pythia: 50,304)."""

    def __post_init__(self) -> None:
        check_conventions(self.conventions)


PAPER = Recipe()
#: Figure 8's corpus with the same document rule: FineWeb's 10B-token sample (sample/10BT)
FINEWEB = Recipe("HuggingFaceFW/fineweb", data_dir="sample/10BT")
RECIPES = {"openwebtext": PAPER, "fineweb": FINEWEB}


def recipe_key(recipe: Recipe, fingerprint: dict, shards: list) -> str:
    """16 hex digits naming ``recipe`` over the content of ``shards`` (each a corpus Shard)
    with the tokenizer of ``fingerprint``."""
    fields = {k: v for k, v in asdict(recipe).items()
              if k not in ("dataset", "data_dir") and (k, v) not in UNKEYED}
    ident = {"format": FORMAT, **fields,
             "tokenizer": {k: fingerprint.get(k) for k in ("sha256", "d_vocab", "scheme")},
             "shards": [content_digest(s.fingerprint()) for s in shards]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def recipe_shards(recipe: Recipe) -> list:
    """The corpus shards of ``recipe`` (a hub dataset is listed and pinned now)."""
    return corpus.corpus_shards(recipe.dataset, text_field=recipe.text_field,
                                split=recipe.split, data_dir=recipe.data_dir)


def cache_path(recipe: Recipe, fingerprint: dict, root: str | Path | None = None,
               shards: list | None = None) -> Path:
    """The statistics file of ``recipe`` in the tool's cache (or ``root``), named by the
    content key (``shards``: the recipe's shards when already listed)."""
    vocab = "full" if recipe.top_k is None else f"top{recipe.top_k}"
    vocab += f"-G{recipe.groups}" if recipe.groups else ""
    vocab += f"-{recipe.conventions}" if recipe.conventions != "paper" else ""
    key = recipe_key(recipe, fingerprint, recipe_shards(recipe) if shards is None else shards)
    name = f"{Path(recipe.dataset).name}-T{recipe.seq_len}-{vocab}-{key}.safetensors"
    return Path(root or tool_cache("stats")) / name


def stats_config(recipe: Recipe, tokenizer: str, out: Path, device: str,
                 progress: bool = True) -> StatsConfig:
    """The ``stats compute`` configuration of ``recipe`` (the first T+1 tokens of a document)."""
    return StatsConfig(dataset=recipe.dataset, out=str(out), tokenizer=tokenizer,
                       seq_len=recipe.seq_len, docs=recipe.docs, min_chars=recipe.min_chars,
                       mode="first", top_k=recipe.top_k, device=device,
                       text_field=recipe.text_field, split=recipe.split, progress=progress,
                       groups=recipe.groups, conventions=recipe.conventions,
                       d_vocab=recipe.d_vocab)


def ensure(recipe: Recipe, tok, fingerprint: dict, device: str, ranks: Ranks | None = None,
           progress: JobProgress | bool = True, root: str | Path | None = None) -> Path:
    """The statistics file of ``recipe``: read from the cache, or built now (rank 0 returns
    it after every rank finished). ``progress``: the job's display to report into, True for
    a display of its own, False for none (--no-progress)."""
    shards = recipe_shards(recipe)  # listed once: the key and the counts see the same shards
    path = cache_path(recipe, fingerprint, root, shards)
    if path.is_file():
        return path
    cfg = stats_config(recipe, tok.name_or_path or "model tokenizer", path, device)
    compute(replace(cfg, progress=progress is True), ranks, tok=tok,
            progress=None if isinstance(progress, bool) else progress, shards=shards)
    if ranks is not None:
        ranks.barrier()  # rank 0 has written the file
    return path
