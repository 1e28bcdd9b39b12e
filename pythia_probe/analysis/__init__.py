"""Analyses of one checkpoint against corpus statistics, looked up by name.

Each analysis is a pure function of a :class:`StepTensors` (the single-token residual streams
and weights of one checkpoint) and prepared theory matrices, returning tidy-table row dicts
(analysis, layer, head, metric, value, n); the sweep adds model, step, stats_id, dtype, run_id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from pythia_probe.analysis.attention import attention_rows
from pythia_probe.analysis.cosine import Theory
from pythia_probe.analysis.embedding import embedding_rows, unembedding_rows
from pythia_probe.errors import BadInputError


@dataclass
class StepTensors:
    """What one checkpoint contributes; rows of every [V, *] tensor are token ids.

    residuals: kind ("pre", "attn", "post") -> per-layer [V, d_model] single-token streams.
    W_Q, W_K: per-layer [n_heads, d_model, d_head]. W_E [V, d_model], W_U [d_model, V].
    ln1_w: per-layer attention LayerNorm weights [d_model] (``attention_lnfold``).
    text_tokens / text_attn: only for ``attention_text``.
    """

    residuals: dict[str, list[Tensor]]
    W_Q: list[Tensor] = field(default_factory=list)
    W_K: list[Tensor] = field(default_factory=list)
    W_E: Tensor | None = None
    W_U: Tensor | None = None
    ln1_w: list[Tensor] = field(default_factory=list)
    text_tokens: Tensor | None = None  # [B, T] token ids of real text (attention_text)
    text_attn: list[Tensor] | None = None  # per layer [B, n_heads, T, T] attention probabilities


@dataclass(frozen=True)
class Analysis:
    """A named analysis: which theory matrices it needs and the function that scores a step.

    ``raw``: statistics it reads unprepared (passed as ``raw=`` to ``run``).
    """

    name: str
    theories: tuple[str, ...]
    run: Callable[..., list[dict]]
    raw: tuple[str, ...] = ()


def _embedding(x: StepTensors, th: Mapping[str, Theory], **opts) -> list[dict]:
    return embedding_rows(x.residuals, th["PhiBT"], chunk=opts.get("chunk", 4096),
                          max_rank=opts.get("max_rank", 0))


def _attention(x: StepTensors, th: Mapping[str, Theory], **opts) -> list[dict]:
    return attention_rows(x.residuals["pre"], x.W_Q, x.W_K, th["Qbar"],
                          per_head=opts.get("per_head", True), chunk=opts.get("chunk", 4096),
                          max_rank=opts.get("max_rank", 0))


def _attention_lnfold(x: StepTensors, th: Mapping[str, Theory], **opts) -> list[dict]:
    if len(x.ln1_w) != len(x.W_Q):
        raise ValueError("attention_lnfold needs every layer's ln1 weights (StepTensors.ln1_w)")
    return attention_rows(x.residuals["pre"], x.W_Q, x.W_K, th["Qbar"],
                          per_head=opts.get("per_head", True), chunk=opts.get("chunk", 4096),
                          max_rank=opts.get("max_rank", 0), ln1_w=x.ln1_w)


def _unembedding(x: StepTensors, th: Mapping[str, Theory], **opts) -> list[dict]:
    return unembedding_rows(x.W_E, x.W_U, th, chunk=opts.get("chunk", 4096))


def _attention_text(x: StepTensors, th: Mapping[str, Theory], **opts) -> list[dict]:
    from pythia_probe.analysis.attention_text import eq13_rows

    if x.text_attn is None or x.text_tokens is None:
        raise BadInputError("attention_text needs real text: give the sweep --text TOKENS_FILE")
    raw = opts["raw"]
    return eq13_rows(x.text_attn, x.text_tokens, raw["Qbar"], raw["Delta"],
                     per_head=opts.get("per_head", True) is not False)


REGISTRY: dict[str, Analysis] = {
    "embedding": Analysis("embedding", ("PhiBT",), _embedding),
    "attention": Analysis("attention", ("Qbar",), _attention),
    "unembedding": Analysis("unembedding", ("Bbar", "BbarT", "PhiBT"), _unembedding),
    "attention_text": Analysis("attention_text", (), _attention_text, raw=("Qbar", "Delta")),
    "attention_lnfold": Analysis("attention_lnfold", ("Qbar",), _attention_lnfold),
}


def get_analyses(names: Sequence[str]) -> list[Analysis]:
    """Look analyses up by name; unknown names raise a ValueError listing the valid ones."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise BadInputError(f"unknown analysis name(s) {unknown or names}; valid: "
                            f"{', '.join(REGISTRY)}")
    return [REGISTRY[n] for n in names]


def theory_matrix(stats, name: str) -> Tensor:
    """The [V, V] theory matrix ``name`` (rows = the token a row describes) from a CorpusStats."""
    if name == "BbarT":
        return stats.Bbar.T
    if name in ("PhiBT", "Qbar", "Bbar"):
        return getattr(stats, name)
    raise BadInputError(f"unknown theory matrix {name!r}; valid: PhiBT, Qbar, Bbar, BbarT")


__all__ = ["REGISTRY", "Analysis", "StepTensors", "get_analyses", "theory_matrix"]
