"""Statistics of a corpus as a library call: :class:`StatsConfig` (the command's flags) and
:func:`compute`, which reads the corpus, tokenizes, runs both passes with the chosen engine and
saves the statistics file (the command: ``python -m pythia_probe.stats compute``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path

from pythia_probe import corpus, tokenizer
from pythia_probe.errors import BadInputError
from pythia_probe.planner import statistics as engine_plan
from pythia_probe.progress import JobProgress
from pythia_probe.ranks import Ranks, check_device
from pythia_probe.stats import conventions, kept
from pythia_probe.stats import driver as run
from pythia_probe.stats.config import StatsFlags
from pythia_probe.stats.conventions import Rules
from pythia_probe.stats.groups import check_groups
from pythia_probe.stats.native import fastcount
from pythia_probe.stats.result import CorpusStats
from pythia_probe.stats.sequences import AUTHORS, MODES, SequencePolicy

log = logging.getLogger(__name__)
TEXT_SUFFIXES = (".txt", ".jsonl")
"""Uncompressed text files: their size bounds the tokens they hold (parquet is compressed)."""


@dataclass(frozen=True)
class StatsConfig(StatsFlags):
    __doc__ = StatsFlags.__doc__  # the flags and their help: stats/config.py

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise BadInputError(f"--seq-len must be >= 1, got {self.seq_len}")
        if self.docs is not None and self.docs < 1:
            raise BadInputError(f"--docs must be >= 1, got {self.docs}")
        if self.min_chars < 0 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise BadInputError("--min-chars >= 0, --batch-size >= 1, --checkpoint-every >= 1")
        if self.mode not in MODES:
            raise BadInputError(f"--mode must be one of {MODES}, got {self.mode!r}")
        if self.oov not in ("skip", "unk"):
            raise BadInputError(f"--oov must be skip or unk, got {self.oov!r}")
        if self.doc_split not in corpus.DOC_SPLITS:
            raise BadInputError(f"--doc-split {self.doc_split!r}; valid: "
                                f"{', '.join(corpus.DOC_SPLITS)}")
        object.__setattr__(self, "top_k", kept.parse_top_k(self.top_k))
        conventions.check(self.conventions)
        if self.d_vocab is not None and (not isinstance(self.d_vocab, int) or self.d_vocab < 1):
            raise BadInputError(f"--d-vocab must be an integer >= 1 (the model's embedding "
                                f"rows, e.g. 50304 for Pythia), got {self.d_vocab!r}")
        check_groups(self.groups)
        if self.budget_gb is not None and not self.budget_gb > 0:
            raise BadInputError(f"--budget-gb must be > 0 (GiB for matmul tiles), got "
                                f"{self.budget_gb}")
        if self.tokenizer.startswith("word:") and not self.tokenizer[5:].isdigit():
            raise BadInputError(f"--tokenizer word:K needs an integer K, got {self.tokenizer!r}")
        check_device(self.device)
        if self.engine not in engine_plan.ENGINES:
            raise BadInputError(f"--engine {self.engine!r}; valid: "
                                f"{', '.join(engine_plan.ENGINES)}")
        if not self.out.endswith(".safetensors"):
            raise BadInputError(f"--out must end in .safetensors, got {self.out!r}")


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
    policy = _policy(cfg, tok, rules)
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
                       cfg.top_k is not None else kept.FULL, **_top_rule(cfg, tok, rules))
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


def statistics_vocab(cfg: StatsConfig, tok, V_tok: int, rules: Rules) -> int:
    """The statistics' d_vocab: --d-vocab, else (the authors' d_vocab rule) the vocab_size of
    the tokenizer's model config.json when there is one, else the tokenizer's ids; logged with
    where it came from. Never below the tokenizer's ids."""
    V, why = V_tok, "the tokenizer's ids"
    if cfg.d_vocab is not None:
        V, why = cfg.d_vocab, "--d-vocab"
    elif rules.d_vocab:
        found, where = tokenizer.model_vocab_size(cfg.tokenizer)
        if found is not None:
            V, why = found, f"vocab_size of {where} (the model's embedding rows)"
        else:
            why = f"the tokenizer's ids ({cfg.tokenizer} has no model config.json)"
    if V < V_tok:
        raise BadInputError(f"d_vocab {V:,} ({why}) is below the tokenizer's {V_tok:,} ids; "
                            f"valid: >= {V_tok:,} (the model's embedding rows, e.g. 50,304 for "
                            "Pythia)")
    log.info("d_vocab %s: %s", f"{V:,}", why)
    return V


def _policy(cfg: StatsConfig, tok, rules: Rules) -> SequencePolicy:
    """The sequence policy: the command's flags, or pythia.py's windows (BOS = the
    tokenizer's bos_token_id, first T tokens zero-padded, last target 0)."""
    if not rules.windows:
        bos = None if cfg.bos is None else _token_id(tok, cfg.bos)
        eos = None if cfg.eos is None else _token_id(tok, cfg.eos)
        return SequencePolicy(cfg.seq_len, cfg.mode, "keep" if cfg.keep_short else "skip",
                              cfg.oov, bos, eos)
    if cfg.mode != "first" or cfg.bos is not None or cfg.eos is not None:
        raise BadInputError("--conventions authors makes pythia.py's windows (BOS first, each "
                            "document's first T tokens, zero-padded); valid with it: --mode "
                            "first and no --bos/--eos, or --conventions paper")
    return SequencePolicy(cfg.seq_len, AUTHORS, "skip", cfg.oov, _bos_id(cfg, tok), None)


def _top_rule(cfg: StatsConfig, tok, rules: Rules) -> dict:
    """How a top-K is ranked: the windows' counts, or the authors' document counts (which
    start each document with to_tokens' BOS)."""
    if not rules.top_k or cfg.top_k is None:
        return {}
    return {"top_rule": "documents", "doc_bos": _bos_id(cfg, tok)}


def _bos_id(cfg: StatsConfig, tok) -> int:
    """The tokenizer's BOS id, which to_tokens prepends; none: one line."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        name = tok.name_or_path or cfg.tokenizer
        raise BadInputError(f"--conventions authors prepends the tokenizer's BOS token as "
                            f"TransformerLens' to_tokens does, but {name!r} has none; valid: a "
                            "tokenizer with a bos_token (Pythia's folder or hub id: "
                            "<|endoftext|>, id 0), or --conventions paper")
    return int(bos)


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


def _token_id(tok, token: str) -> int:
    """The id of ``token``; Pythia's unknown token is <|endoftext|> itself, so check the vocab."""
    i = tok.get_vocab().get(token)
    if i is None:
        raise BadInputError(f"--bos/--eos {token!r} is not a token of the tokenizer "
                            f"(e.g. {tok.eos_token or tok.unk_token!r})")
    return int(i)


def _jsonable(cfg: StatsConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


