"""What a sweep scores: every analysis on one checkpoint's tensors, against targets prepared
once per run. Takes the :class:`~pythia_probe.sweep.config.ScoringConfig` part.

:class:`Scorer` holds what every step shares (the analyses and what they need together, the
prepared targets, the statistics' token ids and identity, raw statistics and text) and turns
one checkpoint's weights into rows. Every value is checked against its analysis's range
(:func:`check_range`) before it can be written.

Adding a column of scale beside each value (chance level, ceiling, interval) is scoring the
same weights against other targets (permuted, half-corpus or leave-one-shard-out statistics):
:meth:`Scorer.rows` with another target set gives the same cells, joined on
(analysis, layer, head, metric).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from safetensors.torch import load_file
from torch import Tensor

from pythia_probe.analysis import Analysis, Needs, Options, StepTensors
from pythia_probe.analysis.attention_text import model_attention
from pythia_probe.arch import NeoXWeights, single_token_residuals
from pythia_probe.errors import BadInputError, OutOfRangeError
from pythia_probe.sweep.config import ScoringConfig
from pythia_probe.sweep.statistics import LazyStats

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

    def step_tensors(self, weights: NeoXWeights) -> StepTensors:
        """Residual streams of each statistic token fed alone, and the weights, in stats row
        order (residual streams, layer weights and W_U only when an analysis needs them)."""
        sc, needs, token_ids = self.scoring, self.needs, self.token_ids
        dt, dev = sc.torch_dtype, sc.device
        res = {}
        if needs.residuals:
            r = single_token_residuals(weights, token_ids, sc.batch_size, dt)
            res = {k: list(v.to(dev)) for k, v in r.items()}
        n_layers = weights.cfg.n_layers if {"attn", "ln"} <= set(needs.weights) else 0
        layers = [weights.layer(i) for i in range(n_layers)]
        W_U = weights.W_U[:, token_ids].to(dev, dt) if needs.unembedding else None
        return StepTensors(res, [L.W_Q.to(dev, dt) for L in layers],
                           [L.W_K.to(dev, dt) for L in layers],
                           weights.W_E[token_ids].to(dev, dt), W_U,
                           ln1_w=[L.ln1_w.to(dev, dt) for L in layers])

    def rows(self, config: Mapping, weights: NeoXWeights,
             targets: Mapping[str, object] | None = None) -> list[dict]:
        """Every analysis's rows for one checkpoint (``config``: its config.json), against
        ``targets`` (default: the run's), range-checked."""
        targets = self.targets if targets is None else targets
        x = self.step_tensors(weights)
        if self.needs.text:
            x.text_tokens = self.text
            x.text_attn = model_attention(config, weights.sd, self.text, self.scoring.device)
        sc = self.scoring
        opts = Options(chunk=sc.chunk, per_head=sc.per_head, max_rank=sc.max_rank, raw=self.raw)
        rows = []
        for a in self.analyses:
            got = a.run(x, {n: targets[n] for n in a.needs.targets}, opts)
            check_range(got, a, TOLERANCE[sc.dtype])
            rows += got
        return rows


def check_range(rows: list[dict], analysis: Analysis, tol: float) -> None:
    """Refuse a value (or a chance level) outside ``analysis.bounds`` by more than ``tol``, or
    not a number, naming the cell; nothing of the step is written then."""
    lo, hi = analysis.bounds
    for r in rows:
        for key in ("value", "chance"):
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
                 targets: Mapping[str, object]) -> Scorer:
    """The run's Scorer: raw statistics and text read once (only when an analysis needs them)."""
    raw = {n: stats.load()[n] for n in needs.raw}
    text = load_text(sc, stats) if needs.text else None
    return Scorer(analyses, needs, targets, stats.token_ids, stats.stats_id, raw, text, sc)

