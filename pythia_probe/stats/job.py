"""Statistics of a corpus as a library call: :class:`StatsConfig` (the command's flags, checked
in :mod:`.settings`) and :func:`compute`, which reads the corpus, tokenizes, runs both passes
with the chosen engine and saves the statistics file (``python -m pythia_probe.stats compute``)."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

from pythia_probe import corpus, tokenizer
from pythia_probe.errors import BadInputError
from pythia_probe.planner import statistics as engine_plan
from pythia_probe.progress import JobProgress
from pythia_probe.ranks import Ranks
from pythia_probe.stats import driver as run
from pythia_probe.stats import kept
from pythia_probe.stats.conventions import Rules
from pythia_probe.stats.native import fastcount
from pythia_probe.stats.result import CorpusStats
from pythia_probe.stats.settings import StatsConfig, sequence_policy, statistics_vocab, top_rule

log = logging.getLogger(__name__)
TEXT_SUFFIXES = (".txt", ".jsonl")
"""Uncompressed text files: their size bounds the tokens they hold (parquet is compressed)."""


def compute(cfg: StatsConfig, ranks: Ranks | None = None, tok=None,
            progress: JobProgress | None = None, shards: list | None = None,
            rules: Rules | None = None) -> CorpusStats | None:
    """Run both passes for ``cfg``; save and return the stats on rank 0 (None on other ranks).

    ``tok``: the tokenizer already loaded (else from ``cfg.tokenizer``); ``progress``: the
    job's display the passes report into (else bars of their own); ``shards``: the corpus
    shards already listed (else listed from ``cfg.dataset``); ``rules``: which of the
    authors' differences to apply (default: those of ``cfg.conventions``; a partial set
    measures each one alone, analyses/conventions_effect.py)."""
    rules = rules if rules is not None else Rules.named(cfg.conventions)
    work = Path(cfg.work_dir or cfg.out + ".work")
    line = engine_plan.check_batches(cfg.seq_len, cfg.batch_size, cfg.docs, cfg.mode, work,
                                     engine_plan.memory_budget(cfg.device),
                                     torch_kernels=not fastcount.runs_on(cfg.device))
    if shards is None:
        shards = corpus.corpus_shards(cfg.dataset, text_field=cfg.text_field, split=cfg.split,
                                      doc_split=cfg.doc_split, **_builtin_opts(cfg))
    bytes_ = _text_bytes(shards)
    if bytes_ == 0:  # as `corpus inspect` says it
        raise BadInputError(f"empty corpus: {cfg.dataset!r} is 0 bytes (a .txt corpus needs "
                            "non-blank text between <|endoftext|> lines)")
    tok = tok if tok is not None else _tokenizer(cfg, shards, rules)
    log.info(line)  # once the corpus was read (the word rule) or sized: a bad one is its line alone
    name = rules.name  # recorded as asked; what applies depends on the tokenizer's kind
    rules = rules.for_tokenizer(tokenizer.is_word_tokenizer(tok))
    if not rules.windows:
        extra = (cfg.bos is not None) + (cfg.eos is not None)
        engine_plan.check_window_length(cfg.seq_len, bytes_, extra * (1 if cfg.mode == "first" else
                                                               (bytes_ or 0)))
    unk = cfg.oov == "unk" and tokenizer.is_word_tokenizer(tok)
    V = statistics_vocab(cfg, tok, tokenizer.d_vocab(tok) + unk, rules)  # --oov unk: [UNK] = k
    fp = tokenizer.tokenizer_fingerprint(tok)
    policy = sequence_policy(cfg, tok, rules)
    extra_ident = {} if name == "paper" else {"conventions": name}
    if cfg.d_vocab is not None or rules.d_vocab:
        extra_ident["d_vocab"] = V
    ident = run.spec_identity(dataset=cfg.dataset, tokenizer=_canonical(fp), policy=policy,
                              min_chars=cfg.min_chars, docs=cfg.docs, split=cfg.split,
                              text_field=cfg.text_field, doc_split=cfg.doc_split,
                              shards=[s.fingerprint() for s in shards], groups=cfg.groups,
                              **extra_ident)
    spec = run.RunSpec(V, policy, lambda docs: tokenizer.encode_documents(tok, docs), ident,
                       work, cfg.min_chars, cfg.docs, cfg.batch_size, cfg.checkpoint_every,
                       cfg.device, cfg.top_k,
                       None if cfg.budget_gb is None else int(cfg.budget_gb * 2**30),
                       progress if progress is not None else cfg.progress, engine=cfg.engine,
                       groups=cfg.groups, compose=kept.KEPT if rules.compose and
                       cfg.top_k is not None else kept.FULL, **top_rule(cfg, tok, rules))
    meta = {"tokenizer": fp, "dataset": cfg.dataset, "config": _jsonable(cfg),
            "conventions": name}
    if cfg.tokenizer.startswith("word:"):
        meta["tokenizer_file"] = Path(cfg.out).name + ".tokenizer.json"
    stats = run.compute_stats(shards, spec, meta, ranks)
    if stats is not None:
        stats.save(cfg.out)
        if cfg.tokenizer.startswith("word:"):
            tokenizer.save_tokenizer(tok, cfg.out + ".tokenizer.json")
        if not cfg.keep_work:
            run.remove_work(work)
    return stats


def _text_bytes(shards: list) -> int | None:
    """Total bytes of a corpus of local .txt / .jsonl files (None: any other kind of shard)."""
    total = 0
    for s in shards:
        if Path(s.name).suffix.lower() not in TEXT_SUFFIXES or not Path(s.name).is_file():
            return None
        total += Path(s.name).stat().st_size
    return total


def _canonical(fp: dict) -> dict:
    """A tokenizer fingerprint without its name (where it was loaded from)."""
    return {k: v for k, v in fp.items() if k != "name"}


def _builtin_opts(cfg: StatsConfig) -> dict:
    if cfg.dataset != "builtin":
        return {}
    return {"n_stories": cfg.stories, "stories_per_shard": cfg.stories_per_shard}


def _tokenizer(cfg: StatsConfig, shards: list, rules: Rules):
    """Load a tokenizer, or build the paper's word-level one from the counted documents (ties
    in first-seen order under the authors' ``word_ties``)."""
    if not cfg.tokenizer.startswith("word:"):
        return tokenizer.load_tokenizer(cfg.tokenizer)
    return tokenizer.build_word_tokenizer(_docs(shards, cfg), int(cfg.tokenizer[5:]),
                                          "first_seen" if rules.word_ties else "string")


def _docs(shards: list, cfg: StatsConfig):
    kept = 0
    for s in shards:
        for doc in s.documents():
            if len(doc) >= cfg.min_chars:
                if cfg.docs is not None and kept >= cfg.docs:
                    return
                kept += 1
                yield doc


def _jsonable(cfg: StatsConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}
