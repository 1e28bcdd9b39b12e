"""What an analysis is: a pure function of one checkpoint's tensors and the prepared target
matrices, and a declaration of what it needs, so the sweep, the memory plan and the dry run read
it instead of matching names.

Rows an analysis returns: ``analysis, layer, head, metric, value, n``, with ``layer`` numbered
as the papers number layers (1 = the first transformer block, None for rows of no layer) and
``head`` from 0. A row's cell is (analysis, layer, head, metric); scoring the same checkpoint
against other targets (statistics with token identities permuted, one half of the corpus, a
leave-one-shard-out build) gives the same cells, which is how a cell's chance level, ceiling
and interval can be added beside its value.

An analysis module defines one :class:`Analysis` (or more) and the registry lists it by name
(:mod:`pythia_probe.analysis.registry`): adding an analysis touches those two files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from pythia_probe.analysis.factored import FactoredTarget
from pythia_probe.planner.step import Shape


@dataclass
class StepTensors:
    """What one checkpoint contributes; rows of every [V, *] tensor are token ids.

    residuals: kind ("pre", "attn", "post") -> per-layer [V, d_model] single-token streams.
    W_Q, W_K: per-layer [n_heads, d_model, d_head]. W_E [V, d_model], W_U [d_model, V].
    ln1_w: per-layer attention LayerNorm weights [d_model] (``attention_lnfold``).
    text_tokens / text_attn: only for analyses that need text.
    """

    residuals: dict[str, list[Tensor]]
    W_Q: list[Tensor] = field(default_factory=list)
    W_K: list[Tensor] = field(default_factory=list)
    W_E: Tensor | None = None
    W_U: Tensor | None = None
    ln1_w: list[Tensor] = field(default_factory=list)
    text_tokens: Tensor | None = None  # [B, T] token ids of real text
    text_attn: list[Tensor] | None = None  # per layer [B, n_heads, T, T] attention probabilities


@dataclass(frozen=True)
class Options:
    """How to score: vocabulary columns per block, per-head rows (True: every layer, False:
    none, or a list of layers numbered from 1 as in the tables), layers stacked per pass over a
    target (0: one), and the raw statistics asked for by ``Needs.raw``."""

    chunk: int = 4096
    per_head: bool | list[int] = True
    max_rank: int = 0
    raw: Mapping[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Needs:
    """What an analysis reads. ``weights``: parts of :func:`pythia_probe.arch.name_filter`
    (fetched from each checkpoint); ``residuals``: the single-token residual streams of every
    layer; ``unembedding``: W_U; ``text``: attention probabilities on real text (``--text``);
    ``targets``: prepared target matrices (:mod:`pythia_probe.analysis.targets`); ``raw``:
    statistics used unprepared."""

    weights: tuple[str, ...] = ("embed",)
    residuals: bool = False
    unembedding: bool = False
    text: bool = False
    targets: tuple[str, ...] = ()
    raw: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cost:
    """What an analysis adds to a step beyond the per-layer passes every per-layer analysis
    shares (:mod:`pythia_probe.planner.step`): ``bases`` model matrices of its own projected
    on each of its targets (and their Grams), and ``macs``, its own dense multiply-adds (the
    r x r algebra of its factors)."""

    bases: int = 0
    macs: float = 0.0


@dataclass(frozen=True)
class Analysis:
    """A named analysis: what it needs, what it costs, the function that scores a step, and
    the range every value it returns must lie in (cosines and correlations: [-1, 1]; a value
    or chance level outside, beyond rounding, is refused before it is written)."""

    name: str
    needs: Needs
    run: Callable[[StepTensors, Mapping[str, FactoredTarget], Options], list[dict]]
    cost: Callable[[Shape], Cost]
    bounds: tuple[float, float] = (-1.0, 1.0)
    layered: Any = None
    """A :class:`~pythia_probe.analysis.layers.LayerSpec` when the analysis is scored per layer
    (the sweep then streams layers through it instead of calling ``run``)."""

    @property
    def targets(self) -> tuple[str, ...]:
        return self.needs.targets


def combined_needs(analyses: list[Analysis]) -> Needs:
    """What a set of analyses needs together (weights, targets and raw statistics in order)."""
    def union(parts):
        return tuple(dict.fromkeys(p for part in parts for p in part))
    return Needs(weights=union(a.needs.weights for a in analyses),
                 residuals=any(a.needs.residuals for a in analyses),
                 unembedding=any(a.needs.unembedding for a in analyses),
                 text=any(a.needs.text for a in analyses),
                 targets=union(a.needs.targets for a in analyses),
                 raw=union(a.needs.raw for a in analyses))
