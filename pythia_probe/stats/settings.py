"""What the flags of a statistics job decide: :class:`StatsConfig` (the flags of
:class:`~pythia_probe.stats.config.StatsFlags`, checked) and, with the tokenizer, the sequence
policy, the top-K rule and the statistics' d_vocab (:func:`pythia_probe.stats.job.compute`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pythia_probe import corpus, tokenizer
from pythia_probe.errors import BadInputError
from pythia_probe.planner import statistics as engine_plan
from pythia_probe.ranks import check_device
from pythia_probe.stats import conventions, kept
from pythia_probe.stats.config import StatsFlags
from pythia_probe.stats.conventions import Rules
from pythia_probe.stats.groups import check_groups
from pythia_probe.stats.sequences import AUTHORS, MODES, SequencePolicy

log = logging.getLogger(__name__)


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


def sequence_policy(cfg: StatsConfig, tok, rules: Rules) -> SequencePolicy:
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


def top_rule(cfg: StatsConfig, tok, rules: Rules) -> dict:
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


def _token_id(tok, token: str) -> int:
    """The id of ``token``; Pythia's unknown token is <|endoftext|> itself, so check the vocab."""
    i = tok.get_vocab().get(token)
    if i is None:
        raise BadInputError(f"--bos/--eos {token!r} is not a token of the tokenizer "
                            f"(e.g. {tok.eos_token or tok.unk_token!r})")
    return int(i)
