"""The leading-terms paper's Figures 6 and 7 as the authors' scripts draw them (section 5.2),
with the effect beneath.

- Figure 6 (plot-cosine-similarity.py: panels attention | no MLP | embedding, RdYlBu_r on
  0-1): layer x step heat maps of the attention map, of residual + attention output (no MLP)
  and of the residual stream after each layer, the last two against Phibar^T Bbar^T. The
  attention panel is drawn from the authors' target where the table has it (``cos_mean_authors``
  of ``attention_lnfold``, TransformerLens' LN-folded map: what pythia.py scores), else from the
  theory's orientation (``cos_mean``, against Qbar) with the panel title saying so; ``attention``
  (the raw map) only where the table has no ``attention_lnfold``.
- Figure 7 (plot-per-head-similarity.py: RdBu_r on the range of the cells drawn): head x step
  maps per head for the paper's layers 2, 13 and 24 (clipped to the layers the model has),
  against the authors' per-head target (``cos_head_authors``) where the table has it, else
  ``cos_head``.

Beneath each raw row, the effect (0 = chance, 1 = ceiling) of the same cells on a fixed scale
(:mod:`.scale`): the raw colours alone do not say how far a cell is above chance. Steps are the
figures' steps (0 behind an axis break, 1, 2, 4, ..., 512) where the table has them; the
caption counts the later steps left to the full-range figures.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.plots import figures, scale, stepaxis
from pythia_probe.plots.describe import statistics_label, title, what
from pythia_probe.plots.table import figure_steps, head_layers, short_model

#: the paper's per-head layers (Figure 7), 1-based
PAPER_HEAD_LAYERS = (2, 13, 24)
#: Figure 6's embedding panels in the authors' order (after the attention panel)
FIGURE6 = (("embedding", "cos_attn"), ("embedding", "cos_post"))
ATTENTION = ("attention_lnfold", "attention")


def _have(df: pd.DataFrame, analysis: str, metric: str, heads: bool = False) -> bool:
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric) & df["layer"].notna()]
    return bool((sel["head"].notna() if heads else sel["head"].isna()).any())


def attention_panel(df: pd.DataFrame, kind: str = "cos_mean") -> tuple[str, str] | None:
    """(analysis, metric) of the attention map to draw: LN-folded before raw, the authors'
    target (``<kind>_authors``) before the theory's orientation (``kind``)."""
    heads = kind == "cos_head"
    return next(((a, m) for a in ATTENTION for m in (f"{kind}_authors", kind)
                 if _have(df, a, m, heads)), None)


def _target_note(metric: str) -> str:
    """What a panel drawn without the authors' target says."""
    if metric.endswith("_authors"):
        return ""
    return f"(this table has no {metric}_authors: not the authors' target)"


def figure6_panels(df: pd.DataFrame) -> list[tuple[str, str]]:
    """The (analysis, metric) panels of Figure 6 this table can draw, in the authors' order."""
    attn = attention_panel(df)
    return ([attn] if attn else []) + [p for p in FIGURE6 if _have(df, *p)]


def _later(df: pd.DataFrame, steps: Sequence[int]) -> list[str]:
    rest = sorted(set(int(s) for s in df["step"].dropna()) - set(steps))
    if not rest:
        return []
    which = (f"1 other step of this table ({rest[0]}) is" if len(rest) == 1 else
             f"{len(rest)} other steps of this table ({rest[0]}..{rest[-1]}) are")
    return [f"steps shown: the paper's ({', '.join(map(str, steps))}); {which} in the "
            "full-range figures"]


def _panel_title(analysis: str, metric: str) -> str:
    text = what(analysis, metric).text(math=True).replace(" vs ", "\nvs ", 1)
    note = _target_note(metric) if analysis in ATTENTION else ""
    return text + (f"\n{note}" if note else "")


def figure6(df: pd.DataFrame, path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
            paper_steps: bool = True) -> Path | None:
    """Save Figure 6 for one model's table (None when it has none of the panels)."""
    panels = figure6_panels(df)
    if not panels:
        return None
    steps = figure_steps(df["step"].dropna(), paper_steps)
    n_layers = int(df["layer"].max())
    cells = [figures.cells(df, a, m, steps=steps) for a, m in panels]
    second = scale.second_scale(cells)
    rows = 2 if second else 1
    fig = Figure(figsize=((1.2 + stepaxis.width(steps, 0.3)) * len(panels) + 0.8,
                          1.2 + (1.3 + 0.17 * n_layers) * rows), layout="constrained")
    axes = fig.subplots(rows, len(panels), squeeze=False)
    sel = df[pd.Series(list(zip(df["analysis"], df["metric"], strict=True)),
                       index=df.index).isin(panels)]
    drawn = figures.heat((axes[0], axes[1] if second else []), cells, sel, "cos_mean",
                         second=second)
    for i, (analysis, metric) in enumerate(panels):
        axes[0, i].set_title(_panel_title(analysis, metric), fontsize=8, pad=9)
        if second:
            axes[1, i].set_title(f"the same cells: {second.label}", fontsize=8, pad=9)
    beneath = f", and beneath: {second.words}" if second else ""
    fig.suptitle(f"{', '.join(sorted({short_model(m) for m in df['model']}))}: Figure 6 of the "
                 f"leading-terms paper, as the authors' plot-cosine-similarity.py draws it"
                 f"{beneath}\n{statistics_label(df, manifest)}", fontsize=9)
    fig.supxlabel(figures.caption(figures.merge(cells), drawn, _later(df, steps)),
                  fontsize=6.5, ha="left", x=0.01)
    return figures.save(fig, path)


def figure7(df: pd.DataFrame, path: str | os.PathLike, *, manifest: dict[str, Any] | None = None,
            layers: Sequence[int] = PAPER_HEAD_LAYERS, paper_steps: bool = True) -> Path | None:
    """Save Figure 7 (per-head maps) for one model's table (None without per-head rows)."""
    found = attention_panel(df, "cos_head")
    if found is None:
        return None
    analysis, metric = found
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric) & df["head"].notna()]
    chosen = head_layers(layers, sel["layer"].dropna())
    steps = figure_steps(df["step"].dropna(), paper_steps)
    note = _target_note(metric)
    heading = (f"Figure 7 of the leading-terms paper, as the authors' "
               f"plot-per-head-similarity.py draws it{' ' + note if note else ''}\n"
               + title(df, analysis, metric, manifest, width=140))
    return figures.head_figure(df, analysis, metric, chosen, path, steps=steps,
                               texts=figures.Texts(manifest, heading, _later(df, steps)))


def paper_figures(df: pd.DataFrame, out_dir: str | os.PathLike, *,
                  manifest: dict[str, Any] | None = None,
                  head_layers: Sequence[int] = PAPER_HEAD_LAYERS, prefix: str = "") -> list[Path]:
    """Figures 6 and 7 of one model's table into ``out_dir`` (``figure6.png``,
    ``figure7.png``); the figures the table cannot draw are skipped."""
    out = Path(out_dir)
    done = [figure6(df, out / f"{prefix}figure6.png", manifest=manifest),
            figure7(df, out / f"{prefix}figure7.png", manifest=manifest, layers=head_layers)]
    return [p for p in done if p is not None]
