"""Whole figures for one (analysis, metric) of one model's table, saved through fileio.

- :func:`layer_figure`: layer x step heat map (Figure 6's shape); when the table has chance and
  ceiling, a second panel shows each cell's share of the way from chance to ceiling.
- :func:`head_figure`: head x step maps for chosen layers side by side (Figure 7).
- :func:`curve_figure`: value against step, one line per layer.
- :func:`layerless_figure`: one panel per layerless metric of an analysis, as curves.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.fileio import atomic_write
from pythia_probe.plots import curves, heatmap, stepaxis
from pythia_probe.plots.describe import color_range, statistics_label, title, what
from pythia_probe.plots.table import OPTIONAL_FLOATS, pivot, short_model, step_status

DPI = 120


def save(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` as PNG through :func:`pythia_probe.fileio.atomic_write` (a temp file
    renamed over the target: a symlink there is replaced, never followed; umask honoured)."""
    return atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=DPI,
                                                           bbox_inches="tight"))


def cells(df: pd.DataFrame, analysis: str, metric: str, *, rows: str = "layer",
          layer: int | None = None, steps: Sequence[int] | None = None) -> dict[str, pd.DataFrame]:
    """value, chance, ceiling, ci_low, ci_high as rows x step tables of the same shape."""
    out = {c: pivot(df, analysis, metric, rows=rows, layer=layer, values=c)
           for c in ("value", *OPTIONAL_FLOATS)}
    if steps is not None:
        out = {c: t.reindex(columns=list(steps)) for c, t in out.items()}
    return out


def _range(t: pd.DataFrame) -> str:
    v = t.to_numpy(float)
    v = v[np.isfinite(v)]
    return f"{v.min():.3f}" if v.min() == v.max() else f"{v.min():.3f}-{v.max():.3f}"


def caption(c: dict[str, pd.DataFrame], dots: int, marked: Sequence[int],
            extra: Sequence[str] = (), on_bar: Sequence[str] = ("chance", "ceiling")) -> str:
    """What the marks mean, with the chance and ceiling ranges of the drawn cells (``on_bar``:
    those drawn on the colour bar)."""
    lines = []
    if c["chance"].notna().to_numpy().any():
        where = ", hatched on the colour bar" if "chance" in on_bar else ""
        lines.append(f"chance (a model unrelated to the statistics): {_range(c['chance'])}"
                     + where)
    if c["ceiling"].notna().to_numpy().any():
        where = ", line on the colour bar" if "ceiling" in on_bar else ""
        lines.append(f"ceiling (the statistics against themselves, two halves of the corpus): "
                     f"{_range(c['ceiling'])}" + where)
    if not lines:
        lines.append("no chance level or ceiling in this table")
    if dots:
        lines.append(f"o: {dots} cells not above chance (interval's lower end, or the value, "
                     "<= chance)")
    if marked:
        lines.append("S: suspect step (weights may be another step's), D: duplicate of an "
                     "earlier step; see revisions.parquet")
    return "\n".join([*lines, *extra])


def _panel(fig, ax, c, status, vmin, vmax, cmap, ylabel, label):
    mesh = heatmap.draw(ax, c["value"], vmin=vmin, vmax=vmax, cmap=cmap, ylabel=ylabel)
    dots = heatmap.mark_not_above_chance(ax, c["value"], c["chance"], c["ci_low"])
    marked = heatmap.mark_steps(ax, list(c["value"].columns), status)
    cbar = heatmap.colorbar(fig, mesh, ax, label, c["value"].to_numpy(float), vmin, vmax)
    on_bar = heatmap.scale_on_colorbar(cbar, c["chance"].to_numpy(float),
                                       c["ceiling"].to_numpy(float))
    return dots, marked, on_bar


def _share(c: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """(value - chance) / (ceiling - chance) per cell."""
    return (c["value"] - c["chance"]) / (c["ceiling"] - c["chance"])


def layer_figure(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike, *,
                 manifest: dict[str, Any] | None = None, steps: Sequence[int] | None = None,
                 extra: Sequence[str] = ()) -> Path:
    """Save the layer x step heat map of one (analysis, metric) on its fixed colour range."""
    c = cells(df, analysis, metric, steps=steps)
    share = bool(c["chance"].notna().to_numpy().any() and c["ceiling"].notna().to_numpy().any())
    n_rows = len(c["value"])
    height = 1.6 + 0.2 * n_rows
    fig = Figure(figsize=(1.8 + stepaxis.width(c["value"].columns),
                          height * (2 if share else 1) + 0.6), layout="constrained")
    axes = fig.subplots(2 if share else 1, 1, squeeze=False)[:, 0]
    vmin, vmax, cmap = color_range(metric)
    m = what(analysis, metric).measure
    dots, marked, on_bar = _panel(fig, axes[0], c, step_status(df), vmin, vmax, cmap, "layer",
                                  m)
    axes[0].set_title(title(df, analysis, metric, manifest), fontsize=9, pad=9)
    if share:
        mesh = heatmap.draw(axes[1], _share(c), vmin=0, vmax=1, cmap="magma", ylabel="layer")
        heatmap.colorbar(fig, mesh, axes[1], "share", _share(c).to_numpy(float), 0, 1)
        axes[1].set_title("(value - chance) / (ceiling - chance): 0 = chance, 1 = ceiling",
                          fontsize=8)
    fig.supxlabel(caption(c, dots, marked, extra, on_bar), fontsize=6.5, ha="left", x=0.01)
    return save(fig, path)


def head_figure(df: pd.DataFrame, analysis: str, metric: str, layers: Sequence[int],
                path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
                steps: Sequence[int] | None = None, extra: Sequence[str] = ()) -> Path:
    """Save head x step maps for each of ``layers`` side by side, on the paper's per-head range
    (0.2-0.8 for cosines)."""
    panels = [cells(df, analysis, metric, rows="head", layer=layer, steps=steps)
              for layer in layers]
    width = 0.9 + stepaxis.width(panels[0]["value"].columns, per_octave=0.4)
    fig = Figure(figsize=(0.8 + width * len(layers), 3.4), layout="constrained")
    axes = fig.subplots(1, len(layers), squeeze=False)[0]
    vmin, vmax, cmap = color_range(metric, per_head=True)
    status, dots, marked = step_status(df), 0, []
    for ax, layer, c in zip(axes, layers, panels, strict=True):
        mesh = heatmap.draw(ax, c["value"], vmin=vmin, vmax=vmax, cmap=cmap, ylabel="head")
        dots += heatmap.mark_not_above_chance(ax, c["value"], c["chance"], c["ci_low"])
        marked += heatmap.mark_steps(ax, list(c["value"].columns), status)
        ax.set_title(f"layer {layer}", fontsize=9, pad=9)
    values = np.concatenate([c["value"].to_numpy(float).ravel() for c in panels])
    cbar = heatmap.colorbar(fig, mesh, list(axes), what(analysis, metric).measure, values,
                            vmin, vmax)
    merged = {k: pd.concat([c[k] for c in panels]) for k in panels[0]}
    on_bar = heatmap.scale_on_colorbar(cbar, merged["chance"].to_numpy(float),
                                       merged["ceiling"].to_numpy(float))
    fig.suptitle(title(df, analysis, metric, manifest, width=140), fontsize=9)
    fig.supxlabel(caption(merged, dots, marked, extra, on_bar), fontsize=6.5, ha="left",
                  x=0.01)
    return save(fig, path)


def _curves_on(fig, ax, c, metric, status, row_label="layer"):
    sm = curves.draw(ax, c["value"], low=c["ci_low"], high=c["ci_high"], chance=c["chance"],
                     ceiling=c["ceiling"], status=status, row_label=row_label,
                     ylim=curves.ylim_for(metric))
    if sm is not None:
        fig.colorbar(sm, ax=ax, label=row_label, pad=0.02)


def curve_figure(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike, *,
                 manifest: dict[str, Any] | None = None,
                 steps: Sequence[int] | None = None) -> Path:
    """Save value against step, one line per layer."""
    c = cells(df, analysis, metric, steps=steps)
    fig = Figure(figsize=(2.5 + stepaxis.width(c["value"].columns, 0.45), 4),
                 layout="constrained")
    ax = fig.subplots()
    _curves_on(fig, ax, c, metric, step_status(df))
    ax.set_ylabel(what(analysis, metric).measure, fontsize=8)
    ax.set_title(title(df, analysis, metric, manifest, width=85), fontsize=8.5)
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
    """Save one panel per layerless metric of ``analysis`` (value against step)."""
    cols = min(len(metrics), 3)
    rows = -(-len(metrics) // cols)
    fig = Figure(figsize=(5.2 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    status = step_status(df)
    for ax, metric in zip(axes, metrics, strict=False):
        _curves_on(fig, ax, layerless_cells(df, analysis, metric, steps), metric, status)
        ax.set_ylabel(what(analysis, metric).measure, fontsize=8)
        ax.set_title("\n".join(textwrap.wrap(what(analysis, metric).text(math=True), 50)),
                     fontsize=8)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    models = ", ".join(sorted({short_model(m) for m in df["model"]}))
    fig.suptitle(f"{models}: {analysis} ({statistics_label(df, manifest)})", fontsize=9)
    return save(fig, path)
