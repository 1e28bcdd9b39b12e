"""The leading-terms paper's Figures 6 and 7 as the paper draws them (section 5.2).

- Figure 6: layer x step heat maps of the residual stream after each layer and with the
  attention output only (no MLP) against Phibar^T Bbar^T, and of the attention map against Qbar
  (``attention_lnfold``, the map the authors' figures come from, where the table has it, else
  ``attention``), each on the fixed range 0-1.
- Figure 7: head x step maps of the attention map per head for the paper's layers 2, 13 and 24
  (clipped to the layers the model has), on 0.2-0.8.

Steps are the figures' steps (0 behind an axis break, 1, 2, 4, ..., 512) where the table has
them; the caption counts the later steps left to the full-range figures.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.plots import figures, heatmap, stepaxis
from pythia_probe.plots.describe import color_range, statistics_label, what
from pythia_probe.plots.table import figure_steps, head_layers, short_model, step_status

#: the paper's per-head layers (Figure 7), 1-based
PAPER_HEAD_LAYERS = (2, 13, 24)
FIGURE6 = (("embedding", "cos_post"), ("embedding", "cos_attn"))
ATTENTION = ("attention_lnfold", "attention")


def _have(df: pd.DataFrame, analysis: str, metric: str, heads: bool = False) -> bool:
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric) & df["layer"].notna()]
    return bool((sel["head"].notna() if heads else sel["head"].isna()).any())


def figure6_panels(df: pd.DataFrame) -> list[tuple[str, str]]:
    """The (analysis, metric) panels of Figure 6 this table can draw."""
    panels = [p for p in FIGURE6 if _have(df, *p)]
    attn = next((a for a in ATTENTION if _have(df, a, "cos_mean")), None)
    return panels + ([(attn, "cos_mean")] if attn else [])


def _later(df: pd.DataFrame, steps: Sequence[int]) -> list[str]:
    rest = sorted(set(int(s) for s in df["step"].dropna()) - set(steps))
    if not rest:
        return []
    return [f"steps shown: the paper's ({', '.join(map(str, steps))}); {len(rest)} other steps "
            f"of this table ({rest[0]}..{rest[-1]}) are in the full-range figures"]


def figure6(df: pd.DataFrame, path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
            paper_steps: bool = True) -> Path | None:
    """Save Figure 6 for one model's table (None when it has none of the panels)."""
    panels = figure6_panels(df)
    if not panels:
        return None
    steps = figure_steps(df["step"].dropna(), paper_steps)
    n_layers = int(df["layer"].max())
    fig = Figure(figsize=((1.2 + stepaxis.width(steps, 0.3)) * len(panels) + 0.8,
                          1.9 + 0.17 * n_layers), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    status, dots, marked, drawn = step_status(df), 0, [], []
    for ax, (analysis, metric) in zip(axes, panels, strict=True):
        c = figures.cells(df, analysis, metric, steps=steps)
        vmin, vmax, cmap = color_range(metric)
        mesh = heatmap.draw(ax, c["value"], vmin=vmin, vmax=vmax, cmap=cmap)
        dots += heatmap.mark_not_above_chance(ax, c["value"], c["chance"], c["ci_low"])
        marked += heatmap.mark_steps(ax, steps, status)
        ax.set_title(what(analysis, metric).text(math=True).replace(" vs ", "\nvs "),
                     fontsize=8.5, pad=9)
        drawn.append(c)
    values = np.concatenate([c["value"].to_numpy(float).ravel() for c in drawn])
    cbar = heatmap.colorbar(fig, mesh, list(axes), "cosine", values, vmin, vmax)
    merged = {k: pd.concat([c[k] for c in drawn]) for k in drawn[0]}
    on_bar = heatmap.scale_on_colorbar(cbar, merged["chance"].to_numpy(float),
                                       merged["ceiling"].to_numpy(float))
    fig.suptitle(f"{', '.join(sorted({short_model(m) for m in df['model']}))} against the "
                 f"statistics ({statistics_label(df, manifest)})", fontsize=9.5)
    fig.supxlabel(figures.caption(merged, dots, marked, _later(df, steps), on_bar), fontsize=6.5,
                  ha="left", x=0.01)
    return figures.save(fig, path)


def figure7(df: pd.DataFrame, path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
            layers: Sequence[int] = PAPER_HEAD_LAYERS, paper_steps: bool = True) -> Path | None:
    """Save Figure 7 (per-head maps) for one model's table (None without per-head rows)."""
    analysis = next((a for a in ATTENTION if _have(df, a, "cos_head", heads=True)), None)
    if analysis is None:
        return None
    sel = df[(df["analysis"] == analysis) & (df["metric"] == "cos_head") & df["head"].notna()]
    chosen = head_layers(layers, sel["layer"].dropna())
    steps = figure_steps(df["step"].dropna(), paper_steps)
    return figures.head_figure(df, analysis, "cos_head", chosen, path, manifest=manifest,
                               steps=steps, extra=_later(df, steps))


def paper_figures(df: pd.DataFrame, out_dir: str | os.PathLike, *,
                  manifest: dict[str, Any] | None = None,
                  head_layers: Sequence[int] = PAPER_HEAD_LAYERS, prefix: str = "") -> list[Path]:
    """Figures 6 and 7 of one model's table into ``out_dir`` (``figure6.png``,
    ``figure7.png``); the figures the table cannot draw are skipped."""
    out = Path(out_dir)
    done = [figure6(df, out / f"{prefix}figure6.png", manifest=manifest),
            figure7(df, out / f"{prefix}figure7.png", manifest=manifest, layers=head_layers)]
    return [p for p in done if p is not None]
