"""Per-layer analyses scored one layer at a time, so a step never holds every layer's residual
streams (3 x 24 x 50,277 x 2,048 float32 = 30 GB for full-vocabulary pythia-1.4b).

A per-layer analysis declares a :class:`LayerSpec`: the target it compares with and its cells
of one :class:`Layer` (row dict without the value, and the factors of its model matrix). The
driver :func:`score_layers` takes layers as they come (from the sweep's layer-major forward
pass, or :func:`layers_of` for a :class:`~pythia_probe.analysis.base.StepTensors` holding
them all), and every cell of every analysis of a layer shares that layer's bases: one pass per
(target, layer) over the target, the residual stream after layer l serving as layer l + 1's
``pre`` (see :class:`~pythia_probe.analysis.basis.Basis`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor

from pythia_probe.analysis.base import Analysis, Cost, Needs, Options, Shape, StepTensors
from pythia_probe.analysis.basis import Basis, fill_target_grams
from pythia_probe.analysis.cosine import ModelCovariance, scores

KINDS = ("pre", "attn", "post")


@dataclass
class Layer:
    """One layer's single-token residual streams (as bases) and attention weights; ``number``
    from 1, as the tables number layers."""

    number: int
    bases: dict[str, Basis]
    W_Q: Tensor | None = None
    W_K: Tensor | None = None
    ln1_w: Tensor | None = None


class Cell(NamedTuple):
    row: dict
    factors: ModelCovariance


class LayerSpec(NamedTuple):
    """What a per-layer analysis compares: ``target`` for its cells, or for a metric of
    ``metric_targets`` that one (attention's ``cos_mean_authors`` against QbarT); its cells of
    one layer and the kinds of residual stream they read."""

    target: str
    cells: Callable[[Layer, Options], list[Cell]]
    kinds: tuple[str, ...] = KINDS
    metric_targets: Mapping[str, str] = {}

    def target_of(self, metric: str) -> str:
        """The target a cell of ``metric`` is scored against."""
        return self.metric_targets.get(metric, self.target)

    @property
    def targets(self) -> tuple[str, ...]:
        """Every target the analysis's cells are scored against (its needs)."""
        return tuple(dict.fromkeys((self.target, *self.metric_targets.values())))


def layer_analysis(name: str, needs: Needs, spec: LayerSpec,
                   cost: Callable[[Shape], Cost]) -> Analysis:
    """An :class:`Analysis` scored per layer; ``run`` scores a StepTensors holding every layer."""
    return Analysis(name, needs, partial(_run_alone, name=name, spec=spec), cost, layered=spec)


def _run_alone(x: StepTensors, th: Mapping[str, object], opts: Options, *, name: str,
               spec: LayerSpec) -> list[dict]:
    target = next(th[t] for t in spec.targets if t in th)
    layers = layers_of(x, target.d_vocab, target.dtype, opts.chunk)
    return score_layers(layers, [(name, spec)], th, opts)[name]


def layers_of(x: StepTensors, V: int, dtype: torch.dtype, chunk: int) -> Iterator[Layer]:
    """The layers of ``x`` (first V token rows), a layer's ``pre`` sharing the previous
    layer's ``post`` basis when the two streams are equal."""
    n_layers = max(len(v) for v in x.residuals.values())
    last: tuple[Tensor, Basis] | None = None
    for i in range(n_layers):
        bases = {}
        for k in KINDS:
            if i < len(x.residuals.get(k, [])):
                E = x.residuals[k][i][:V]
                same = k == "pre" and last is not None and torch.equal(last[0], E)
                bases[k] = last[1] if same else Basis(E, dtype, chunk)
        if "post" in bases:
            last = (x.residuals["post"][i][:V], bases["post"])
        yield Layer(i + 1, bases, _at(x.W_Q, i), _at(x.W_K, i), _at(x.ln1_w, i))


def _at(seq: Sequence[Tensor], i: int) -> Tensor | None:
    return seq[i] if i < len(seq) else None


@dataclass
class _Pending:
    cells: list[tuple[str, LayerSpec, list[Cell]]] = field(default_factory=list)

    def width(self, targets: Mapping[str, object]) -> int:
        bases = {}
        for _, spec, cells in self.cells:
            for c in cells:
                t = spec.target_of(c.row["metric"])
                if t in targets:
                    bases[(id(c.factors.basis), t)] = (c.factors.basis, t)
        return sum(b.width for b, t in bases.values() if not b.has(targets[t]))


def score_layers(layers: Iterable[Layer], analyses: Sequence[tuple[str, LayerSpec]],
                 targets: Mapping[str, object], opts: Options) -> dict[str, list[dict]]:
    """Rows of every per-layer analysis ((name, spec) pairs) over ``layers``, consumed lazily.

    Consecutive layers share one pass per target while the stacked width of their bases stays
    <= ``opts.max_rank`` (0: one layer per pass), so only those layers are held at once.
    """
    return score_layers_sets(layers, analyses, [targets], opts)[0]


def score_layers_sets(layers: Iterable[Layer], analyses: Sequence[tuple[str, LayerSpec]],
                      target_sets: Sequence[Mapping[str, object]], opts: Options
                      ) -> list[dict[str, list[dict]]]:
    """:func:`score_layers` against each of ``target_sets`` (the run's targets and the
    interval replicates' leave-one-group-out targets), from ONE pass over ``layers``: the
    forward pass and every basis's moments are shared, each set adds its own pass over its
    targets. One rows dict per set, in order."""
    if not target_sets:
        raise ValueError("score_layers_sets needs at least one target set")
    rows = [{name: [] for name, _ in analyses} for _ in target_sets]
    pending = _Pending()
    for layer in layers:
        new = [(name, spec, spec.cells(layer, opts)) for name, spec in analyses]
        grown = _Pending(pending.cells + new)
        if pending.cells and grown.width(target_sets[0]) > opts.max_rank:
            _flush_sets(pending, target_sets, opts, rows)
            grown = _Pending(new)
        pending = grown
    _flush_sets(pending, target_sets, opts, rows)
    return rows


def _flush_sets(pending: _Pending, target_sets: Sequence[Mapping[str, object]], opts: Options,
                rows: list[dict[str, list[dict]]]) -> None:
    for targets, out in zip(target_sets, rows, strict=True):
        _flush(pending, targets, opts, out)  # grams stay on the bases: layer l's post is l+1's pre


def _flush(pending: _Pending, targets: Mapping[str, object], opts: Options,
           rows: dict[str, list[dict]]) -> None:
    """Score the pending cells, each against its target (a cell whose target the run does not
    hold, e.g. QbarHeadT of statistics built before it existed, is left out: the plan says so).
    One pass per (target, basis) over the target."""
    by_target: dict[str, list[tuple[str, Cell]]] = {}
    for name, spec, cells in pending.cells:
        for c in cells:
            t = spec.target_of(c.row["metric"])
            if t in targets:
                by_target.setdefault(t, []).append((name, c))
    for t, named in by_target.items():
        fill_target_grams([c.factors.basis for _, c in named], targets[t], opts.chunk)
    scored: dict[int, dict] = {}
    for t, named in by_target.items():
        target = targets[t]
        got = scores([c.factors for _, c in named], target, opts.chunk)
        for (name, c), s in zip(named, got, strict=True):
            scored[id(c)] = {"analysis": name, **c.row, "value": s.value, "chance": s.chance,
                             "chance_sd": s.chance_sd, "n": target.d_vocab}
    for name, _, cells in pending.cells:  # in the cells' own order
        rows[name] += [scored[id(c)] for c in cells if id(c) in scored]
