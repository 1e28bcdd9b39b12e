"""One heat-map panel: rows (layers, heads or relative depth) x steps on the shared log step
axis, with what a reader needs to trust a cell:

- a fixed colour range (the paper's), with arrows on the colour bar where values fall outside;
- chance and ceiling on the colour bar (a hatched band over the chance values, a line over the
  ceiling values of the cells drawn), and a dot on every cell not above chance: not flagged by
  the table's ``above_chance`` test (older tables: its interval's lower end, or its value when
  there is no interval, at or below its chance). The dots mark the cells NOT above chance (not
  the flagged ones): in a trained model most cells are above chance, so the dots stay few and
  sit where the colour must not be read as agreement (step 0, the random weights);
- suspect steps hatched red and labelled ``S`` above the panel, duplicate steps hatched grey and
  labelled ``D`` (from ``revision_status``);
- missing cells grey.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from pythia_probe.plots import stepaxis

MISSING = "0.82"
STATUS_STYLE = {"suspect": ("S", "tab:red", "////"), "duplicate": ("D", "0.35", "....")}


def row_edges(n: int) -> np.ndarray:
    return np.arange(n + 1) - 0.5


def draw(ax, values: pd.DataFrame, colours: tuple = (None, None, "viridis"), *,
         ylabel: str = "layer", y_edges: np.ndarray | None = None, label_steps: bool = True):
    """Draw ``values`` (rows x steps) with pcolormesh at the log step positions in
    ``colours`` (vmin, vmax, cmap); returns the mesh (for a colour bar). Rows are evenly
    spaced unless ``y_edges`` are given."""
    vmin, vmax, cmap = colours
    steps = [int(s) for s in values.columns]
    data = np.ma.masked_invalid(values.to_numpy(dtype=float))
    ys = row_edges(len(values)) if y_edges is None else np.asarray(y_edges, dtype=float)
    ax.set_facecolor(MISSING)
    mesh = ax.pcolormesh(stepaxis.edges(steps), ys, data, cmap=cmap, vmin=vmin, vmax=vmax,
                         shading="flat")
    stepaxis.setup(ax, steps, label_axis=label_steps)
    ax.set_ylim(ys[0], ys[-1])
    if y_edges is None:
        every = max(1, -(-len(values) // 26))
        idx = list(range(0, len(values), every))
        ax.set_yticks(idx, [str(values.index[i]) for i in idx], fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    return mesh


def cell_centres(values: pd.DataFrame, y_edges: np.ndarray | None = None):
    x = stepaxis.positions([int(s) for s in values.columns])
    ys = row_edges(len(values)) if y_edges is None else np.asarray(y_edges, dtype=float)
    return x, (ys[1:] + ys[:-1]) / 2


def mark_not_above_chance(ax, values: pd.DataFrame, above: pd.DataFrame,
                          y_edges: np.ndarray | None = None) -> int:
    """A white dot on each cell not above chance (``above`` 0.0; NaN: not judged, no dot);
    returns how many were marked."""
    bad = (above.reindex_like(values) == 0.0).to_numpy()
    if not bad.any():
        return 0
    x, y = cell_centres(values, y_edges)
    rows, cols = np.nonzero(bad)
    ax.scatter(x[cols], y[rows], s=2.5, c="white", edgecolors="black", linewidths=0.2,
               zorder=5)
    return int(bad.sum())


def mark_steps(ax, steps: Sequence[int], status: Mapping[int, str]) -> list[int]:
    """Hatch the columns of flagged steps and label them above the panel; returns the steps
    marked."""
    steps = sorted(int(s) for s in steps)
    e = stepaxis.edges(steps)
    marked = []
    for i, step in enumerate(steps):
        if step not in status or status[step] not in STATUS_STYLE:
            continue
        letter, colour, hatch = STATUS_STYLE[status[step]]
        ax.axvspan(e[i], e[i + 1], facecolor="none", edgecolor=colour, hatch=hatch, lw=0,
                   zorder=4)
        ax.text((e[i] + e[i + 1]) / 2, 1.005, letter, transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=6, color=colour, fontweight="bold")
        marked.append(step)
    return marked


def scale_on_colorbar(cbar, chance: np.ndarray, ceiling: np.ndarray) -> list[str]:
    """The range of the drawn cells' chance values (hatched band) and ceiling values (a band
    with a line at their median) on the colour bar, where they fall inside its range; returns
    what was drawn."""
    ax, norm = cbar.ax, cbar.mappable.norm
    lo, hi = norm.vmin, norm.vmax
    chance, ceiling = chance[np.isfinite(chance)], ceiling[np.isfinite(ceiling)]
    drawn = []
    if chance.size and lo <= np.median(chance) <= hi:
        ax.axhspan(chance.min(), max(chance.max(), chance.min() + 0.004 * (hi - lo)),
                   facecolor="white", edgecolor="black", hatch="xxx", alpha=0.9, lw=0.5)
        ax.text(-0.3, float(np.median(chance)), "chance", fontsize=6, ha="right",
                va="center", transform=ax.get_yaxis_transform())
        drawn.append("chance")
    if ceiling.size and lo <= np.median(ceiling) <= hi:
        ax.axhspan(ceiling.min(), ceiling.max(), facecolor="white", alpha=0.5, lw=0)
        ax.axhline(float(np.median(ceiling)), color="black", lw=1.2)
        ax.text(-0.3, float(np.median(ceiling)), "ceiling", fontsize=6, ha="right",
                va="center", transform=ax.get_yaxis_transform())
        drawn.append("ceiling")
    return drawn


def colorbar(fig, mesh, axes, label: str, values: np.ndarray, vmin, vmax):
    """A colour bar for ``axes``, with arrows where ``values`` leave [vmin, vmax]."""
    v = values[np.isfinite(values)]
    low = vmin is not None and v.size and v.min() < vmin
    high = vmax is not None and v.size and v.max() > vmax
    extend = {(True, True): "both", (True, False): "min", (False, True): "max"}.get(
        (bool(low), bool(high)), "neither")
    return fig.colorbar(mesh, ax=axes, label=label, extend=extend, shrink=0.95, pad=0.02)
