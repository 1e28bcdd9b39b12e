"""What a sweep scores: every analysis on one checkpoint's tensors, against targets prepared
once per run. Takes the :class:`~pythia_probe.sweep.config.ScoringConfig` part.

:class:`Scorer` holds what every step shares (the analyses and what they need together, the
prepared targets, the statistics' token ids and identity, raw statistics and text) and turns
one checkpoint's weights into rows. Every value is checked against its analysis's range
(:func:`check_range`) before it can be written.

Columns of scale beside each value: ``chance`` and ``chance_sd`` (closed form, with the
value), ``ceiling``/``ceiling_half`` and ``ci_low``/``ci_high`` (:meth:`Scorer.rows_with_scale`:
the same weights scored against the leave-one-group-out target sets, joined on (analysis, layer,
head, metric); :mod:`pythia_probe.analysis.intervals`), then ``effect`` and ``above_chance`` on
every row with a chance level (without intervals: above_chance from chance_sd alone, effect
NaN).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from pythia_probe.analysis import Analysis, Needs, Options, StepTensors, combined_needs
from pythia_probe.analysis.attention_text import model_attention
from pythia_probe.analysis.basis import Basis
from pythia_probe.analysis.intervals import add_intervals, judge
from pythia_probe.analysis.layers import Layer, score_layers_sets
from pythia_probe.analysis.targets import statistic_of
from pythia_probe.arch import NeoXWeights, iter_single_token_layers
from pythia_probe.errors import BadInputError, OutOfRangeError
from pythia_probe.ranks import Ranks
from pythia_probe.sweep.config import ScoringConfig
from pythia_probe.sweep.held import RAW, prepare_scale, prepare_targets
from pythia_probe.sweep.statistics import LazyStats

log = logging.getLogger(__name__)

#: rounding a value may carry beyond its analysis's bounds, by compute dtype
TOLERANCE = {"float32": 1e-4, "float64": 1e-8}


@dataclass(frozen=True)
class Scorer:
    """What every step of one sweep shares, built once (:func:`build_scorer`)."""

    analyses: list[Analysis]
    needs: Needs
    targets: Mapping[str, object]
    token_ids: Tensor
    stats_id: str
    raw: Mapping[str, Tensor]
    text: Tensor | None
    scoring: ScoringConfig
    scale: Any = None
    """A :class:`~pythia_probe.sweep.held.Scale` (the left-out target sets and the
    ceilings): every step's rows then carry ceiling, ci_low and ci_high."""

    def step_tensors(self, weights: NeoXWeights) -> StepTensors:
        """The weights the analyses not scored per layer read, in stats row order (W_E; W_U
        only when an analysis needs it)."""
        dt, dev = self.scoring.torch_dtype, self.scoring.device
        W_U = weights.W_U[:, self.token_ids].to(dev, dt) if self.needs.unembedding else None
        return StepTensors({}, W_E=weights.W_E[self.token_ids].to(dev, dt), W_U=W_U)

    def layers(self, weights: NeoXWeights, kinds: set[str]) -> Iterator[Layer]:
        """Each statistic token fed alone, one layer at a time (only one layer's streams held):
        the ``kinds`` of residual streams as bases, the layer's attention weights; a layer's
        ``pre`` is the previous layer's ``post`` basis."""
        sc, dt, dev = self.scoring, self.scoring.torch_dtype, self.scoring.device
        last = None
        streams = iter_single_token_layers(weights, self.token_ids, sc.batch_size, dt)
        for i, res in enumerate(streams):
            bases = {k: (last if k == "pre" and last is not None else
                         Basis(res[k].to(dev), dt, sc.chunk)) for k in sorted(kinds)}
            last = bases.get("post")
            L = weights.layer(i)
            yield Layer(i + 1, bases, L.W_Q.to(dev, dt), L.W_K.to(dev, dt), L.ln1_w.to(dev, dt))

    def rows(self, config: Mapping, weights: NeoXWeights,
             targets: Mapping[str, object] | None = None) -> list[dict]:
        """Every analysis's rows for one checkpoint (``config``: its config.json), against
        ``targets`` (default: the run's, with the scale columns when the run has them),
        range-checked: per-layer analyses share one layer-major pass
        (:func:`~pythia_probe.analysis.layers.score_layers`)."""
        if targets is None and self.scale is not None:
            return self.rows_with_scale(config, weights, self.scale.left_out,
                                        self.scale.ceilings)
        rows = self.rows_sets(config, weights, [self.targets if targets is None else targets])[0]
        return [judge(r) for r in rows]

    def rows_sets(self, config: Mapping, weights: NeoXWeights,
                  target_sets: Sequence[Mapping[str, object]]) -> list[list[dict]]:
        """:meth:`rows` against each of ``target_sets``, from ONE forward pass: the layers'
        residual streams and their moments are computed once and scored against every set
        (:func:`~pythia_probe.analysis.layers.score_layers_sets`)."""
        sc = self.scoring
        opts = Options(chunk=sc.chunk, per_head=sc.per_head, max_rank=sc.max_rank, raw=self.raw)
        layered = [(a.name, a.layered) for a in self.analyses if a.layered is not None]
        kinds = {k for _, spec in layered for k in spec.kinds}
        by_layer = score_layers_sets(self.layers(weights, kinds), layered, target_sets, opts) \
            if layered else [{} for _ in target_sets]
        x = self.step_tensors(weights)
        if self.needs.text:
            x.text_tokens = self.text
            x.text_attn = model_attention(config, weights.sd, self.text, self.scoring.device)
        out = []
        for targets, layer_rows in zip(target_sets, by_layer, strict=True):
            rows, own = [], replace(opts, raw=targets.get(RAW, self.raw))  # the set's statistics
            for a in self.analyses:
                got = layer_rows[a.name] if a.layered is not None else a.run(
                    x, {n: targets[n] for n in a.needs.targets}, own)
                check_range(got, a, TOLERANCE[sc.dtype])
                rows += got
            out.append(rows)
        return out

    def rows_with_scale(self, config: Mapping, weights: NeoXWeights,
                        left_out: Sequence[Mapping[str, object]],
                        ceilings: Mapping[str, float] | None = None) -> list[dict]:
        """:meth:`rows` with ``ci_low``/``ci_high`` (the jackknife over the G
        leave-one-group-out target sets ``left_out``) and ``ceiling`` (per target, computed
        once per statistics: :func:`~pythia_probe.analysis.intervals.ceiling`); each interval
        is checked to hold its value and cut at the analysis's range, each ceiling checked
        against it (``ceilings``: the split-half cosines, corrected here by Spearman-Brown), and
        ``effect``/``above_chance`` with the jackknife's se (:func:`~pythia_probe.analysis.
        intervals.add_intervals`). One forward pass, G + 1 passes over the targets; where
        ``left_out`` holds functions (the sets do not fit at once: the plan's ``Held.together``),
        each set is prepared when its turn comes and scored with a forward pass of its own."""
        if all(isinstance(t, Mapping) for t in left_out):
            rows, *replicates = self.rows_sets(config, weights, [self.targets, *left_out])
        else:
            rows = self.rows_sets(config, weights, [self.targets])[0]
            replicates = [self.rows_sets(config, weights, [t()])[0] for t in left_out]
        out = add_intervals(rows, replicates, ceilings, self.target_of)
        bounds = {a.name: a.bounds for a in self.analyses}
        for r in out:  # an interval past the analysis's range is cut at it
            lo, hi = bounds[r["analysis"]]
            r["ci_low"], r["ci_high"] = max(r["ci_low"], lo), min(r["ci_high"], hi)
        for a in self.analyses:
            check_range([r for r in out if r["analysis"] == a.name], a,
                        TOLERANCE[self.scoring.dtype], ("ceiling", "ceiling_half"))
        for r in out:
            if not r["ci_low"] <= r["value"] <= r["ci_high"]:
                raise OutOfRangeError(f"{r['analysis']} layer {r.get('layer')}: interval "
                                      f"[{r['ci_low']}, {r['ci_high']}] misses its value "
                                      f"{r['value']}: a bug; not written")
        return out


    def target_of(self, analysis: str, metric: str) -> str | None:
        """The target a cell of a per-layer analysis is scored against (None: not per layer)."""
        spec = next((a.layered for a in self.analyses if a.name == analysis), None)
        return None if spec is None else spec.target_of(metric)


def check_range(rows: list[dict], analysis: Analysis, tol: float,
                keys: tuple[str, ...] = ("value", "chance", "chance_sd")) -> None:
    """Refuse a value (or a chance level or its standard deviation) outside ``analysis.bounds``
    by more than ``tol``, or not a number, naming the cell; nothing of the step is written
    then."""
    lo, hi = analysis.bounds
    for r in rows:
        for key in keys:
            v = r.get(key)
            if key != "value" and v is None:
                continue
            if not (isinstance(v, (int, float)) and lo - tol <= v <= hi + tol) or math.isnan(v):
                cell = ", ".join(f"{k} {r.get(k)}" for k in ("analysis", "layer", "head",
                                                             "metric") if r.get(k) is not None)
                raise OutOfRangeError(f"{cell}: {key} {v!r} outside [{lo:g}, {hi:g}] "
                                      f"(tolerance {tol:g}): corrupt statistics or target "
                                      "cache, or a bug; not written")


def load_text(sc: ScoringConfig, stats: LazyStats) -> Tensor:
    """First ``text_rows`` windows of ``--text``, inputs only, at most the statistics' T long."""
    if stats.restricted:
        raise BadInputError("attention_text needs full-vocabulary statistics (these are top-k)")
    tokens = load_file(sc.text)["tokens"]
    if tokens.ndim != 2 or int(tokens.max()) >= stats.d_vocab:
        raise BadInputError(f"--text {sc.text}: need 'tokens' [N, T+1] with ids < "
                            f"{stats.d_vocab}, got shape {tuple(tokens.shape)}")
    return tokens[:sc.text_rows, :min(tokens.shape[1] - 1, stats.T)]


def build_scorer(sc: ScoringConfig, analyses: list[Analysis], needs: Needs, stats: LazyStats,
                 targets: Mapping[str, object], scale: Any = None) -> Scorer:
    """The run's Scorer: raw statistics and text read once (only when an analysis needs them);
    ``scale``: the ceiling and interval columns' targets (:func:`~pythia_probe.sweep.held.
    prepare_scale`), None for none."""
    raw = {n: stats.load()[n] for n in needs.raw}
    text = load_text(sc, stats) if needs.text else None
    return Scorer(analyses, needs, targets, stats.token_ids, stats.stats_id, raw, text, sc,
                  scale)


def prepare_scorer(parts, analyses: list, lazy: LazyStats, ranks: Ranks,
                   together: bool = True) -> Scorer:
    """Targets prepared once (their norms cached by stats_id) and shared by every step;
    rank 0 builds a missing cache, the others then reuse it (``together``: the plan's
    :class:`~pythia_probe.planner.sweep.Held`)."""
    needs = combined_needs(analyses)
    names, progress = held_targets(needs, lazy), parts.output.progress and ranks.is_main
    for turn in (True, False):  # rank 0 first (it builds missing caches), then the others
        if ranks.is_main == turn:
            targets = prepare_targets(lazy, names, parts.scoring, progress and turn)
            scale = prepare_scale(lazy, names, parts.scoring, together, progress and turn,
                                  needs.raw)
        if turn:
            ranks.barrier()
    return build_scorer(parts.scoring, analyses, needs, lazy, targets, scale)


def held_targets(needs, lazy: LazyStats) -> list[str]:
    """The needed targets the statistics can give; a missing one (QbarHeadT of statistics
    built before QbarHead existed) is left out with one warning naming the rows it costs."""
    names = [n for n in needs.targets if lazy.holds(statistic_of(n))]
    for n in (m for m in needs.targets if m not in names):
        log.warning("statistics %s hold no %s (built before it existed): no %s rows; rebuild "
                    "them for those", lazy.stats_id, statistic_of(n),
                    "cos_head_authors" if n == "QbarHeadT" else n)
    return names
