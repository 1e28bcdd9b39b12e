"""Whole figures for one (analysis, metric) of one model's table, saved through fileio.

Every heat map draws the raw value as the authors' scripts draw it (:func:`.describe.color_range`)
and, beside it, the effect (0 = chance, 1 = ceiling; value - chance for rows without a
ceiling, :mod:`.scale`) on a diverging map centred on chance.

- :func:`layer_figure`: layer x step heat map (Figure 6's shape), raw | effect side by side.
- :func:`head_figure`: head x step maps for chosen layers side by side (Figure 7), the effect
  beneath.
- :func:`curve_figure`: value against step, one line per layer; the effect beside.
- :func:`layerless_figure`: one panel per layerless metric of an analysis, as curves.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.fileio import atomic_write
from pythia_probe.plots import curves, heatmap, scale, stepaxis
from pythia_probe.plots.describe import color_range, range_words, statistics_label, title, what
from pythia_probe.plots.table import OPTIONAL_FLOATS, pivots, select, short_model, step_status
from pythia_probe.summary.table import ABOVE_RULES, above_chance_rule

DPI = 120


def save(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` as PNG through :func:`pythia_probe.fileio.atomic_write` (a temp file
    renamed over the target: a symlink there is replaced, never followed; umask honoured)."""
    return atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=DPI,
                                                           bbox_inches="tight"))


def cells(df: pd.DataFrame, analysis: str, metric: str, *, rows: str = "layer",
          layer: int | None = None, steps: Sequence[int] | None = None) -> dict[str, pd.DataFrame]:
    """value, chance, chance_sd, ceiling, ci_low, ci_high, effect and above_chance (1.0/0.0,
    NaN: not judged) as rows x step tables of the same shape."""
    out = pivots(df, analysis, metric, ("value", *OPTIONAL_FLOATS), rows=rows, layer=layer)
    if steps is not None:
        out = {c: t.reindex(columns=list(steps)) for c, t in out.items()}
    return out


def _range(t: pd.DataFrame) -> str:
    v = t.to_numpy(float)
    v = v[np.isfinite(v)]
    return f"{v.min():.3f}" if v.min() == v.max() else f"{v.min():.3f}-{v.max():.3f}"


def _any(t: pd.DataFrame) -> bool:
    return bool(np.isfinite(t.to_numpy(float)).any())


@dataclass
class Drawn:
    """What a heat map drew: marks counted, steps marked, scale drawn on the colour bar, the
    second panel's scale, the above-chance rule, the raw colours in words."""

    dots: int = 0
    marked: list[int] = field(default_factory=list)
    on_bar: list[str] = field(default_factory=list)
    second: scale.Second | None = None
    rule: str = "value"
    colours: str = ""


def caption(c: dict[str, pd.DataFrame], drawn: Drawn, extra: Sequence[str] = ()) -> str:
    """What the colours and marks mean, with the chance, null SD and ceiling ranges of the
    drawn cells."""
    lines = [drawn.colours] if drawn.colours else []
    if _any(c["chance"]):
        where = ", hatched on the colour bar" if "chance" in drawn.on_bar else ""
        lines.append(f"chance (a model unrelated to the statistics): {_range(c['chance'])}"
                     + where)
    if _any(c["chance_sd"]):
        lines.append(f"the null's SD (chance_sd): {_range(c['chance_sd'])}")
    if _any(c["ceiling"]):
        where = ", line on the colour bar" if "ceiling" in drawn.on_bar else ""
        how = (f"split-half r {_range(c['ceiling_half'])} corrected to the full corpus, "
               "sqrt(2r/(1+r))" if _any(c["ceiling_half"]) else
               "two halves of the corpus, not corrected to the full corpus")
        lines.append(f"ceiling (the statistics against themselves: {how}): "
                     f"{_range(c['ceiling'])}" + where)
    if not _any(c["chance"]) and not _any(c["ceiling"]):
        lines.append("no chance level or ceiling in this table")
    if drawn.second is not None:
        lines.append(f"{drawn.second.label} panels: {drawn.second.words}, colours BrBG, white "
                     "= chance")
    if drawn.dots:
        lines.append(f"o: {drawn.dots} cells not above chance ({ABOVE_RULES[drawn.rule]})")
    if drawn.marked:
        lines.append("S: suspect step (weights may be another step's), D: duplicate of an "
                     "earlier step; see revisions.parquet")
    return "\n".join([*lines, *extra])


def merge(panels: list[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    return {k: pd.concat([c[k] for c in panels]) for k in panels[0]}


def _values(panels, key="value") -> np.ndarray:
    return np.concatenate([c[key].to_numpy(float).ravel() for c in panels])


def heat(axes, panels: list[dict[str, pd.DataFrame]], df: pd.DataFrame, metric: str, *,
         second: scale.Second | None, per_head: bool = False, measure: str = "cosine") -> Drawn:
    """Draw ``panels`` (cell tables, rows layers, or heads with ``per_head``) on ``axes`` =
    (raw axes, second axes): the value in the authors' colours and range, one colour bar for
    them, and, with ``second``, the effect (or value - chance) on the second axes; dots on
    cells not above chance and S/D on flagged steps on both."""
    raw_axes, second_axes = axes
    fig, ylabel = raw_axes[0].figure, "head" if per_head else "layer"
    status = step_status(df)
    vmin, vmax, cmap = color_range(metric, per_head, _values(panels))
    drawn = Drawn(second=second, rule=above_chance_rule(df),
                  colours=range_words(metric, per_head))
    for ax, c in zip(raw_axes, panels, strict=True):
        mesh = heatmap.draw(ax, c["value"], (vmin, vmax, cmap), ylabel=ylabel)
        drawn.dots += heatmap.mark_not_above_chance(ax, c["value"], c["above_chance"])
        drawn.marked += heatmap.mark_steps(ax, list(c["value"].columns), status)
    cbar = heatmap.colorbar(fig, mesh, list(raw_axes), measure, _values(panels), vmin, vmax)
    merged = merge(panels)
    drawn.on_bar = heatmap.scale_on_colorbar(cbar, merged["chance"].to_numpy(float),
                                             merged["ceiling"].to_numpy(float))
    if second is None:
        return drawn
    shown = [scale.second_values(c, second) for c in panels]
    for ax, c, v in zip(second_axes, panels, shown, strict=True):
        mesh = heatmap.draw(ax, v, (second.vmin, second.vmax, second.cmap), ylabel=ylabel)
        heatmap.mark_not_above_chance(ax, v, c["above_chance"])
        heatmap.mark_steps(ax, list(v.columns), status)
    values = np.concatenate([v.to_numpy(float).ravel() for v in shown])
    bar = heatmap.colorbar(fig, mesh, list(second_axes), second.label, values, second.vmin,
                           second.vmax)
    scale.label_effect_bar(bar, second)
    return drawn


def layer_figure(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike, *,
                 manifest: dict[str, Any] | None = None, steps: Sequence[int] | None = None,
                 extra: Sequence[str] = ()) -> Path:
    """Save the layer x step heat map of one (analysis, metric): the raw value in the authors'
    colours and range, and beside it the effect where the table has one (value - chance where
    it has a chance only)."""
    c = cells(df, analysis, metric, steps=steps)
    second = scale.second_scale([c])
    fig = Figure(figsize=((1.8 + stepaxis.width(c["value"].columns)) * (2 if second else 1),
                          2.4 + 0.2 * len(c["value"])), layout="constrained")
    axes = fig.subplots(1, 2 if second else 1, squeeze=False)[0]
    drawn = heat((axes[:1], axes[1:]), [c], select(df, analysis, metric), metric,
                 second=second, measure=what(analysis, metric).measure)
    axes[0].set_title(what(analysis, metric).measure + ", as the authors draw it", fontsize=8)
    if second:
        axes[1].set_title(second.words, fontsize=8)
    fig.suptitle(title(df, analysis, metric, manifest, width=60 if not second else 120),
                 fontsize=9)
    fig.supxlabel(caption(c, drawn, extra), fontsize=6.5, ha="left", x=0.01)
    return save(fig, path)


class Texts(NamedTuple):
    """A figure's words: ``heading`` its title (None: what is compared with what and the
    statistics of ``manifest``), ``extra`` lines added to its caption."""

    manifest: dict[str, Any] | None = None
    heading: str | None = None
    extra: Sequence[str] = ()


def head_figure(df: pd.DataFrame, analysis: str, metric: str, layers: Sequence[int],
                path: str | os.PathLike, *, steps: Sequence[int] | None = None,
                texts: Texts | None = None) -> Path:
    """Save head x step maps for each of ``layers`` side by side, the raw value as the authors'
    per-head figure draws it (RdBu_r on the cells' range, :func:`.describe.color_range`) and
    the effect beneath where the table has one."""
    manifest, heading, extra = texts or Texts()
    panels = [cells(df, analysis, metric, rows="head", layer=layer, steps=steps)
              for layer in layers]
    second = scale.second_scale(panels)
    width = 0.9 + stepaxis.width(panels[0]["value"].columns, per_octave=0.4)
    height = 1.2 + 0.12 * len(panels[0]["value"])
    fig = Figure(figsize=(0.8 + width * len(layers), 1.4 + height * (2 if second else 1)),
                 layout="constrained")
    axes = fig.subplots(2 if second else 1, len(layers), squeeze=False)
    drawn = heat((axes[0], axes[1] if second else []), panels, select(df, analysis, metric),
                 metric, second=second, per_head=True, measure=what(analysis, metric).measure)
    for i, layer in enumerate(layers):
        axes[0, i].set_title(f"layer {layer}", fontsize=9, pad=9)
        if second:
            axes[1, i].set_title(f"layer {layer}: {second.label}", fontsize=8, pad=9)
    fig.suptitle(heading or title(df, analysis, metric, manifest, width=140), fontsize=9)
    fig.supxlabel(caption(merge(panels), drawn, extra), fontsize=6.5, ha="left", x=0.01)
    return save(fig, path)


def _curves_on(fig, ax, c, metric, status, row_label="layer"):
    sm = curves.draw(ax, {**c, "band": scale.null_band(c)}, status=status,
                     row_label=row_label, ylim=curves.ylim_for(metric))
    if sm is not None:
        fig.colorbar(sm, ax=ax, label=row_label, pad=0.02)


def _second_on(fig, ax, c, second: scale.Second, status, row_label="layer"):
    low, high = scale.second_bounds(c, second)
    lines = {"value": scale.second_values(c, second), "band": scale.null_band(c, second)}
    if low is not None:
        lines |= {"ci_low": low, "ci_high": high}
    sm = curves.draw_second(ax, lines, effect=second.kind == scale.EFFECT, status=status,
                            row_label=row_label)
    if sm is not None:
        fig.colorbar(sm, ax=ax, label=row_label, pad=0.02)
    ax.set_ylabel(second.label, fontsize=8)


def curve_figure(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike, *,
                 manifest: dict[str, Any] | None = None,
                 steps: Sequence[int] | None = None) -> Path:
    """Save value against step, one line per layer, and beside it the effect (or value -
    chance) with chance at 0 and the ceiling at 1."""
    c = cells(df, analysis, metric, steps=steps)
    second = scale.second_scale([c])
    w = 2.5 + stepaxis.width(c["value"].columns, 0.45)
    fig = Figure(figsize=(w * (2 if second else 1), 4.3), layout="constrained")
    axes = fig.subplots(1, 2 if second else 1, squeeze=False)[0]
    status = step_status(df)
    _curves_on(fig, axes[0], c, metric, status)
    axes[0].set_ylabel(what(analysis, metric).measure, fontsize=8)
    if second:
        _second_on(fig, axes[1], c, second, status)
        axes[1].set_title(second.words, fontsize=8)
    fig.suptitle(title(df, analysis, metric, manifest, width=85 if not second else 150),
                 fontsize=8.5)
    return save(fig, path)


def layerless_cells(df: pd.DataFrame, analysis: str, metric: str,
                    steps: Sequence[int] | None = None) -> dict[str, pd.DataFrame]:
    """One-row tables (value, chance, ...) x step for a metric without a layer."""
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric) & df["layer"].isna()
             & df["head"].isna()].assign(layer=0)
    return cells(sel, analysis, metric, steps=steps)


def layerless_figure(df: pd.DataFrame, analysis: str, metrics: Sequence[str],
                     path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
                     steps: Sequence[int] | None = None) -> Path:
    """Save one panel per layerless metric of ``analysis`` (value against step), and beneath
    each the effect (or value - chance) where the rows have it."""
    panels = [layerless_cells(df, analysis, m, steps) for m in metrics]
    seconds = [scale.second_scale([c]) for c in panels]
    cols = min(len(metrics), 3)
    blocks = -(-len(metrics) // cols)
    per = 2 if any(seconds) else 1
    fig = Figure(figsize=(5.2 * cols, 3.4 * blocks * per), layout="constrained")
    axes = fig.subplots(blocks * per, cols, squeeze=False)
    status = step_status(df)
    for i, (metric, c, second) in enumerate(zip(metrics, panels, seconds, strict=True)):
        ax = axes[(i // cols) * per, i % cols]
        _curves_on(fig, ax, c, metric, status)
        ax.set_ylabel(what(analysis, metric).measure, fontsize=8)
        ax.set_title("\n".join(textwrap.wrap(what(analysis, metric).text(math=True), 50)),
                     fontsize=8)
        if per == 2:
            below = axes[(i // cols) * per + 1, i % cols]
            if second is None:
                below.set_visible(False)
            else:
                _second_on(fig, below, c, second, status)
                below.set_title(second.words, fontsize=7)
    for k in range(len(metrics), blocks * cols):
        for r in range(per):
            axes[(k // cols) * per + r, k % cols].set_visible(False)
    models = ", ".join(sorted({short_model(m) for m in df["model"]}))
    fig.suptitle(f"{models}: {analysis}\n{statistics_label(df, manifest)}", fontsize=9)
    return save(fig, path)
