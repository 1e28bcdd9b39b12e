"""``--conventions paper|authors``: this toolkit's definitions, or exactly what the authors'
Pythia scripts compute (spec leading-terms section 7; pythia.py, pythia-per-head.py).

``paper`` (the default) is the spec's section 2 as this toolkit has always computed it.
``authors`` switches on every difference pythia.py makes (:data:`DIFFERENCES`); with a
word-level tokenizer (``word:K``) the authors' toy scripts apply instead, and only the word
ranking changes:

- ``windows``: each document tokenised as TransformerLens' to_tokens does (the tokenizer's BOS
  id first, cut at 2,048 tokens); inputs = its first T tokens zero-padded (id 0) to T, targets =
  the inputs shifted by one with the last target 0; every position counts, the padding too,
  and no document is skipped for being short (``sequences.py``, mode 'authors');
- ``d_vocab``: the matrix side and the centring U = 1/V use the model's embedding rows
  (Pythia: 50,304), not the tokenizer's ids (50,277): ``vocab_size`` of the config.json of the
  tokenizer's hub repository or folder, else the tokenizer's size, unless --d-vocab is given;
- ``top_k``: the K kept ids ranked by find_top_tokens' rule (every token of each tokenised
  document counted, ties in first-seen order; ``doctop.py``); K >= d_vocab keeps every id;
- ``compose``: SigmaB, PhiBT, Gbar, GbarHead and pass 2 over the kept ids only (``kept.py``);
- ``word_ties``: a word:K vocabulary ranks ties in first-seen order (Counter.most_common), not
  by the word's string.

:class:`Rules` holds which are on (``Rules.named``); a run records ``Rules.name`` in
``meta["conventions"]``, its identity and its stats_id (a paper file keeps the id it had).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from pythia_probe.errors import BadInputError

CONVENTIONS = ("paper", "authors")
DIFFERENCES = ("windows", "d_vocab", "top_k", "compose", "word_ties")
"""The authors' differences from the paper's conventions, each a :class:`Rules` switch."""
BPE_ONLY = ("windows", "d_vocab", "top_k", "compose")
"""What pythia.py does to a hub (BPE) tokenizer's statistics; a word:K tokenizer follows the
toy scripts, where only ``word_ties`` differs."""


@dataclass(frozen=True)
class Rules:
    """Which of the authors' differences are on (see the module docstring)."""

    windows: bool = False
    d_vocab: bool = False
    top_k: bool = False
    compose: bool = False
    word_ties: bool = False

    @classmethod
    def named(cls, name: str) -> Rules:
        """``paper`` (none) or ``authors`` (all)."""
        check(name)
        return cls(**{d: name == "authors" for d in DIFFERENCES})

    @property
    def name(self) -> str:
        """'paper', 'authors', or 'paper+<the differences on>' for a partial set."""
        on = [f.name for f in fields(self) if getattr(self, f.name)]
        if not on:
            return "paper"
        return "authors" if len(on) == len(DIFFERENCES) else "paper+" + "+".join(on)

    def for_tokenizer(self, word: bool) -> Rules:
        """The rules that apply to a word-level (``word``) or a BPE/hub tokenizer."""
        keep = ("word_ties",) if word else BPE_ONLY
        return Rules(**{k: v and k in keep for k, v in asdict(self).items()})


def check(name: str) -> str:
    """A valid --conventions value, else one line naming them."""
    if name not in CONVENTIONS:
        raise BadInputError(f"--conventions {name!r}; valid: {', '.join(CONVENTIONS)}")
    return name
