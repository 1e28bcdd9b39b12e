"""The statistics a sweep scores against: ``--stats``, or the paper's recipe for the model's
tokenizer, built on first use and cached. Takes the
:class:`~pythia_probe.sweep.config.StatisticsConfig` part; what the statistics file holds and
how big it is are the planner's and the stats package's answers (``planner.statistics``,
``read_meta``), never computed here.

The vocabulary is the full vocabulary (the authors' default) unless ``--top-k K`` is given, on
every machine: no default depends on memory or device. Memory decides only how the work is
chunked, or refuses it up front with the numbers
(:func:`~pythia_probe.planner.statistics.check_statistics_fit`). The choice
and why are printed and stored in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pythia_probe.errors import BadInputError, MismatchError, MissingFileError
from pythia_probe.planner.budget import memory_budget
from pythia_probe.planner.statistics import check_statistics_fit
from pythia_probe.stats import CorpusStats, read_meta
from pythia_probe.stats import result as stats_result
from pythia_probe.stats.kept import parse_top_k
from pythia_probe.stats.recipe import Recipe, cache_path
from pythia_probe.stats.result import check_tokenizer, part_counts
from pythia_probe.sweep.config import StatisticsConfig
from pythia_probe.tokenizer import d_vocab as tokenizer_d_vocab

FACTORED_FORMAT = "pythia_probe.stats/2"
"""The statistics format whose sparse parts the factored targets read (``parts()``)."""


@dataclass(frozen=True)
class StatsChoice:
    """Where the statistics are, whether they exist yet, and the vocabulary they hold."""

    path: Path
    recipe: Recipe | None  # None: --stats given
    rows: int  # statistic rows the sweep scores (K, or the tokenizer's d_vocab)
    vocab_reason: str
    meta: dict | None  # the file's metadata once it exists
    max_id: int  # the largest token id a row stands for (the tokenizer's last id before a build)

    @property
    def built(self) -> bool:
        return self.meta is not None

    @property
    def stats_id(self) -> str | None:
        return None if self.meta is None else str(self.meta["stats_id"])

    @property
    def factored(self) -> bool:
        """Full-vocabulary factored statistics (or, not built yet, statistics that will be)."""
        return is_factored(self.meta, None if self.recipe is None else self.recipe.top_k)

    @property
    def groups(self) -> int:
        """G, the document groups the statistics keep (their header, or the recipe's)."""
        if self.meta is not None:
            return int((self.meta.get("groups") or {}).get("G", 0))
        return int(getattr(self.recipe, "groups", 0) or 0)

    def parts_nnz(self) -> dict[str, int]:
        """The non-zeros of the sparse parts C, W and Qbar: a built file's counts from its
        header; before the build an upper bound (every pair of positions the recipe reads
        distinct), not to refuse a run on (:attr:`built` says which)."""
        if self.built:
            return part_counts(self.path)
        r = self.recipe
        positions = r.docs * r.seq_len
        pairs = r.docs * r.seq_len * (r.seq_len + 1) // 2
        V2 = self.rows ** 2
        return {"C": min(V2, positions), "W": min(V2, pairs), "Qbar": min(V2, pairs),
                "QbarHead": min(V2, pairs)}

    def lines(self) -> list[str]:
        if self.recipe is None:
            return [f"statistics: {self.path} (--stats), {self.rows:,} rows"]
        r = self.recipe
        where = r.dataset if r.data_dir is None else f"{r.dataset} ({r.data_dir}/)"
        what = (f"{where}, first {r.docs:,} documents of >= {r.min_chars} characters, "
                f"first {r.seq_len + 1} tokens each" if r.conventions == "paper" else
                f"{where}, first {r.docs:,} documents of >= {r.min_chars} characters, the "
                f"authors' conventions (BOS, first {r.seq_len} tokens padded, last target 0)")
        state = "cached" if self.built else "to build now (cached for every later run)"
        return [f"vocabulary: {self.vocab_reason}",
                f"statistics: {what}; {state}: {self.path}"]

    def record(self) -> dict:
        """What the run records about its statistics: the file, its identity and where it came
        from (the recipe built here, or the provenance the file itself holds)."""
        meta = self.meta or {}
        source = ({"recipe": self.recipe.__dict__} if self.recipe is not None else
                  {"from_file": {k: meta[k] for k in ("corpus", "policy", "counts", "ledger",
                                                      "tokenizer") if k in meta}})
        what = {k: meta[k] for k in ("T", "counts", "conventions") if k in meta}  # for titles
        return {"file": str(self.path), "stats_id": self.stats_id, "rows": self.rows, **what,
                **source}


def choose_vocab(st: StatisticsConfig, V: int) -> tuple[int | None, str]:
    """(top-k or None for the full vocabulary, why) for ``--top-k``: the user's choice alone,
    never the machine's (memory decides only how the work is chunked, or refuses it)."""
    asked = parse_top_k(st.top_k)
    if asked is None:
        said = "the default" if st.top_k == "full" else f"--top-k {st.top_k}"
        return None, f"full vocabulary ({V:,} ids), {said}"
    return int(asked), f"the {asked:,} most frequent tokens, --top-k {asked} given"


def is_factored(meta: dict | None, top_k: int | None) -> bool:
    """Whether the statistics are (or, not built yet, will be) full-vocabulary factored ones,
    scored through their sparse parts."""
    if meta is None:
        return top_k is None and stats_result.FORMAT == FACTORED_FORMAT
    return meta.get("format") == FACTORED_FORMAT and not meta.get("vocab", {}).get(
        "restricted", False)


def choose_statistics(st: StatisticsConfig, model: str, tok, fingerprint: dict | None,
                      device: str, budget: tuple[float | None, str] | None = None,
                      model_rows: int | None = None) -> StatsChoice:
    """``--stats`` checked against the model's tokenizer (and ``--conventions``), or the
    recipe's cached file (refused up front when it is still to build and cannot fit).
    ``model_rows``: the model's embedding rows, the vocabulary of the authors' conventions."""
    if st.stats is not None:
        path = Path(st.stats)
        meta = read_stats_meta(path, fingerprint)
        check_file_conventions(meta, st.conventions, path)
        ids = meta.get("vocab", {}).get("ids")
        return StatsChoice(path, None, int(meta["d_vocab"]), "as in --stats", meta,
                           max(ids) if ids else int(meta["d_vocab"]) - 1)
    if tok is None:
        raise BadInputError(f"{model} ships no tokenizer.json: give --tokenizer (to build "
                            "the statistics with it) or --stats")
    authors = st.conventions == "authors" and model_rows is not None
    V = model_rows if authors else tokenizer_d_vocab(tok)
    top_k, why = choose_vocab(st, V)
    if authors:
        why += f", the model's {V:,} embedding rows (--conventions authors)"
    recipe = Recipe(st.dataset, st.docs, st.min_chars, st.seq_len, top_k,
                    data_dir=st.data_dir, groups=st.groups, conventions=st.conventions,
                    d_vocab=V if authors else None)
    path = cache_path(recipe, fingerprint)
    meta = read_stats_meta(path, fingerprint) if path.is_file() else None
    if meta is None:  # refused up front when it cannot fit
        check_statistics_fit(st, V, top_k, device,
                             budget if budget is not None else memory_budget(device))
    return StatsChoice(path, recipe, V if top_k is None else min(top_k, V), why, meta, V - 1)


def choose_for_models(st: StatisticsConfig, runs, device: str,
                      budget: tuple[float | None, str] | None = None) -> None:
    """Each model's statistics (``run.stats``): one choice per tokenizer, by its canonical
    fingerprint, so models sharing one (every Pythia size) share one file, built once and
    scored at the same rows (the vocabulary never depends on the machine)."""
    groups: dict[str, list] = {}
    for r in runs:
        key = f"none:{r.model}" if r.fingerprint is None else str(r.fingerprint.get("sha256"))
        if st.conventions == "authors":  # their V is the model's rows (6.9b, 12b pad further)
            key += f":{r.config.d_vocab}"
        groups.setdefault(key, []).append(r)
    for members in groups.values():
        first = members[0]
        choice = choose_statistics(st, first.model, first.tokenizer, first.fingerprint, device,
                                   budget, first.config.d_vocab)
        for r in members:
            check_fits_model(choice, r.config.d_vocab, r.model)
            r.stats = choice


def check_file_conventions(meta: dict, asked: str, path: Path) -> None:
    """``--stats`` built under other conventions than ``--conventions`` asks (a file from
    before conventions were recorded is 'paper') is refused in one line."""
    have = meta.get("conventions", "paper")
    if asked != "paper" and have != asked:
        raise MismatchError(f"--stats {path} was built with --conventions {have}, not {asked}; "
                            "give statistics built with `python -m pythia_probe.stats compute "
                            f"--conventions {asked} ...`, or leave --stats out to build them")


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


def check_fits_model(choice: StatsChoice, d_vocab_model: int, model: str) -> None:
    """Refuse, once and before any step, statistics indexing token ids the model has no
    embedding row for (a tokenizer of another model, or statistics of another vocabulary)."""
    if choice.max_id >= d_vocab_model:
        raise MismatchError(f"statistics {choice.path} index token {choice.max_id} but {model} "
                            f"has only {d_vocab_model:,} embedding rows (ids 0.."
                            f"{d_vocab_model - 1}): statistics of another tokenizer or model; "
                            "use statistics of this model's tokenizer")


class LazyStats:
    """A statistics file's metadata (token ids, d_vocab, T, stats_id, restricted) read from its
    header; the tensors are loaded by :meth:`load` on first use only, then kept."""

    def __init__(self, path: str | Path, meta: dict) -> None:
        missing = [k for k in ("d_vocab", "T", "stats_id") if k not in meta]
        if missing:
            raise BadInputError(f"--stats {path}: metadata lacks {missing}; recompute it with "
                                "`python -m pythia_probe.stats compute ...`")
        self.path, self.meta, self._stats = Path(path), meta, None
        vocab = meta.get("vocab", {})
        self.d_vocab, self.T = int(meta["d_vocab"]), int(meta["T"])
        self.restricted = bool(vocab.get("restricted", False))
        ids = vocab.get("ids")
        self.token_ids = torch.arange(self.d_vocab) if ids is None else torch.tensor(ids)
        self.stats_id = str(meta["stats_id"])

    def holds(self, statistic: str) -> bool:
        """Whether the file holds ``statistic`` (from its header: QbarHead is missing from
        files built before it existed; every other statistic is always there)."""
        if statistic != "QbarHead":
            return True
        if self._stats is not None:
            return self._stats.has(statistic)
        return statistic in part_counts(self.path)

    def parts_nnz(self) -> dict[str, int]:
        """The non-zeros of the sparse parts, counted in the file's header."""
        return part_counts(self.path)

    def load(self) -> CorpusStats:
        """The CorpusStats (every tensor read from disk, once)."""
        if self._stats is None:
            if not self.path.is_file():
                raise MissingFileError(f"--stats {self.path}: no such statistics file")
            self._stats = CorpusStats.load(self.path)
        return self._stats
