"""Several models in one figure (issue 20): sizes x layers x steps as small multiples on one
colour scale, layers on a relative depth axis (layer / n_layers) so sizes line up, models
ordered by size; each layer's peak (o) and exit (x; > when censored) from
:mod:`pythia_probe.summary` drawn on its row, and the same as a text table per model.

The cells are the effect (0 = chance, 1 = ceiling, :mod:`.scale`) where every model's rows
have one, so models whose chance levels differ read on one scale; else the raw value in the
authors' colours and range.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pythia_probe.fileio import write_text
from pythia_probe.plots import figures, heatmap, stepaxis
from pythia_probe.plots.describe import color_range, statistics_label, what
from pythia_probe.plots.scale import EFFECT_CMAP, EFFECT_RANGE, Second, label_effect_bar
from pythia_probe.plots.table import pivot, safe_name, short_model, step_status
from pythia_probe.summary.table import (
    EFFECT,
    effect_column,
    paper_layers,
    step_label,
    summary_table,
)

log = logging.getLogger(__name__)

_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmb])(?![a-z])", re.IGNORECASE)
_UNIT = {"k": 1e3, "m": 1e6, "b": 1e9}


def model_size(model: str) -> float | None:
    """Parameters from a model name: ``pythia-1.4b-deduped`` -> 1.4e9, ``pythia-70m`` -> 7e7;
    None when the name holds no size."""
    found = _SIZE.findall(short_model(model))
    if not found:
        return None
    number, unit = found[-1]
    return float(number) * _UNIT[unit.lower()]


def order_models(models: Sequence[str], sizes: Mapping[str, float] | None = None) -> list[str]:
    """``models`` smallest first: by ``sizes`` where given, else by the size in the name;
    models of unknown size go last (by name), with a warning."""
    sizes = dict(sizes or {})
    known = {m: sizes.get(m, sizes.get(short_model(m), model_size(m))) for m in set(models)}
    unknown = sorted(m for m, s in known.items() if s is None)
    if unknown:
        log.warning("no size in the name of %s (give sizes=): drawn after the others",
                    ", ".join(unknown))
    return sorted(known, key=lambda m: (known[m] is None, known[m] or 0.0, m))


def depth_edges(n_layers: int) -> np.ndarray:
    """Row edges on the relative depth axis: layer l spans ((l - 1) / n, l / n]."""
    return np.arange(n_layers + 1) / n_layers


def compare_table(df: pd.DataFrame, analysis: str, metric: str, *,
                  summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per model and layer: n_layers, depth = layer / n_layers, peak and exit steps (with
    their intervals and ``censored``), from the summary of ``df``."""
    df = paper_layers(df)
    summary = summary_table(df) if summary is None else summary
    sel = summary[(summary["analysis"] == analysis) & (summary["metric"] == metric)
                  & summary["layer"].notna() & summary["head"].isna()].copy()
    n = df[df["layer"].notna()].groupby("model")["layer"].max()
    sel["n_layers"] = sel["model"].map(n).astype("Int64")
    sel["depth"] = sel["layer"].astype(float) / sel["n_layers"].astype(float)
    cols = ["model", "n_layers", "layer", "depth", "scale", "peak_step", "peak_step_low",
            "peak_step_high", "peak_value", "peak_effect", "exit_step", "exit_step_low",
            "exit_step_high", "censored"]
    return sel[cols].sort_values(["model", "layer"]).reset_index(drop=True)


def format_compare(table: pd.DataFrame, order: Sequence[str] | None = None) -> str:
    """One text block per model: layer, depth, peak step, exit step."""
    blocks = []
    for model in order or sorted(table["model"].unique()):
        g = table[table["model"] == model]
        if g.empty:
            continue
        rows = pd.DataFrame({
            "layer": g["layer"].astype(int), "depth": [f"{d:.2f}" for d in g["depth"]],
            "peak step": [step_label(int(s)) for s in g["peak_step"]],
            "peak": [f"{v:.3f}" for v in g["peak_value"]],
            "peak effect": ["-" if pd.isna(v) else f"{v:.3f}" for v in g["peak_effect"]],
            "exit step": [_exit_text(r) for r in g.itertuples()]})
        blocks.append(f"{model} ({int(g['n_layers'].iloc[0])} layers)\n"
                      f"{rows.to_string(index=False)}")
    return "\n\n".join(blocks)


def _exit_text(r) -> str:
    if pd.isna(r.censored):
        return "peak not above chance"
    return "censored" if r.censored else step_label(int(r.exit_step))


def _mark(ax, rows: pd.DataFrame, steps: Sequence[int], edges: np.ndarray) -> None:
    x = dict(zip(steps, stepaxis.positions(steps), strict=True))
    right = stepaxis.edges(steps)[-1]
    for r in rows.itertuples():
        y = (edges[int(r.layer) - 1] + edges[int(r.layer)]) / 2
        style = {"mfc": "white", "mec": "black", "mew": 0.6, "ms": 4.5, "zorder": 6,
                 "clip_on": False}
        if int(r.peak_step) in x:
            ax.plot([x[int(r.peak_step)]], [y], marker="o", **style)
        if not pd.isna(r.censored) and bool(r.censored):
            ax.plot([right], [y], marker=">", **style)
        elif not pd.isna(r.exit_step) and int(r.exit_step) in x:
            ax.plot([x[int(r.exit_step)]], [y], marker="X", **style)


class Colours(NamedTuple):
    """The colour scale of the small multiples: range, map, the column drawn, its name."""

    vmin: float
    vmax: float
    cmap: str
    column: str
    label: str


def _panel(ax, part: pd.DataFrame, steps, marks: pd.DataFrame, scale: Colours, bottom: bool):
    """One model's panel: ``part`` its rows of one (analysis, metric), ``marks`` its peak and
    exit rows."""
    model, analysis, metric = part[["model", "analysis", "metric"]].iloc[0]
    values = pivot(part, analysis, metric, values=scale.column).reindex(columns=steps)
    n_layers = int(values.index.max())
    values = values.reindex(range(1, n_layers + 1))
    edges = depth_edges(n_layers)
    mesh = heatmap.draw(ax, values, scale[:3], ylabel="layer / n_layers", y_edges=edges,
                        label_steps=bottom)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0], ["0", ".25", ".5", ".75", "1"], fontsize=7)
    heatmap.mark_steps(ax, steps, step_status(part))
    _mark(ax, marks, steps, edges)
    ax.set_title(f"{short_model(model)} ({n_layers} layers)", fontsize=8.5, pad=8)
    return mesh, values


def _scale(sel: pd.DataFrame, metric: str) -> Colours:
    """The effect where every row has one, else the raw value in the authors' colours and
    range (the data's for other metrics)."""
    if effect_column(sel).notna().all():
        return Colours(*EFFECT_RANGE, EFFECT_CMAP, "effect", "effect (0 = chance, 1 = ceiling)")
    vmin, vmax, cmap = color_range(metric)
    if vmin is None:
        vmin, vmax = float(sel["value"].min()), float(sel["value"].max())
    return Colours(vmin, vmax, cmap, "value", what(sel["analysis"].iloc[0], metric).measure)


def compare_figure(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike, *,
                   manifest: dict[str, Any] | None = None,
                   sizes: Mapping[str, float] | None = None,
                   summary: pd.DataFrame | None = None) -> Path:
    """Save the small multiples of one (analysis, metric) across the models of ``df``."""
    df = paper_layers(df)
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric) & df["layer"].notna()
             & df["head"].isna()]
    models = order_models(list(sel["model"].unique()), sizes)
    steps = sorted(int(s) for s in sel["step"].unique())
    marks = compare_table(df, analysis, metric, summary=summary)
    ncols = 1 if len(models) <= 4 else 2
    nrows = -(-len(models) // ncols)
    fig = Figure(figsize=(ncols * (1.4 + stepaxis.width(steps, 0.4)) + 0.8, 0.9 + 1.7 * nrows),
                 layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    scale = _scale(sel, metric)
    drawn = [_panel(ax, sel[sel["model"] == m], steps, marks[marks["model"] == m], scale,
                    bottom=i + ncols >= len(models))
             for i, (ax, m) in enumerate(zip(axes, models, strict=False))]
    for ax in axes[len(models):]:
        ax.set_visible(False)
    values = np.concatenate([v.to_numpy(float).ravel() for _, v in drawn])
    bar = heatmap.colorbar(fig, drawn[-1][0], list(axes[:len(models)]), scale.label, values,
                           scale.vmin, scale.vmax)
    effect = scale.column == "effect"
    if effect:
        label_effect_bar(bar, Second(EFFECT, *EFFECT_RANGE))
    fig.suptitle(f"{what(analysis, metric).text(math=True)}, smallest model first"
                 f"{', as effect' if effect else ''}\n"
                 f"{statistics_label(df, manifest)}", fontsize=9)
    fig.legend(handles=[Line2D([], [], marker=m, ls="none", mfc="white", mec="black", label=t)
                        for m, t in (("o", "peak"), ("X", "exit: below half the peak (effect, "
                                                     "else value - chance)"),
                                     (">", "no exit (censored)"))],
               loc="outside lower center", ncol=3, fontsize=7, frameon=False)
    return figures.save(fig, path)


def compare_run(df: pd.DataFrame, out_dir: str | os.PathLike, *,
                manifest: dict[str, Any] | None = None,
                sizes: Mapping[str, float] | None = None) -> list[Path]:
    """For every per-layer (analysis, metric) that two or more models of ``df`` have:
    ``compare_<analysis>_<metric>.png`` and the per-model table of peak and exit steps as
    ``compare_<analysis>_<metric>.txt``. Nothing for a one-model table."""
    df = paper_layers(df)
    rows = df[df["layer"].notna() & df["head"].isna()]
    summary = summary_table(df)
    paths = []
    for (analysis, metric), sel in rows.groupby(["analysis", "metric"], sort=True):
        if sel["model"].nunique() < 2:
            continue
        name = safe_name(f"compare_{analysis}_{metric}")
        out = Path(out_dir)
        paths.append(compare_figure(df, analysis, metric, out / f"{name}.png",
                                    manifest=manifest, sizes=sizes, summary=summary))
        order = order_models(list(sel["model"].unique()), sizes)
        text = format_compare(compare_table(df, analysis, metric, summary=summary), order)
        paths.append(write_text(out / f"{name}.txt", f"{analysis} {metric}: peak and exit "
                                f"step per layer\n\n{text}\n"))
    return paths
