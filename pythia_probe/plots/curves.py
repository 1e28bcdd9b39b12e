"""Value against step on the shared log step axis: one line per layer (coloured by depth), or
one line for a layerless metric (unembedding, the toy's output cosine, the loss).

The interval over documents (``ci_low``..``ci_high``) is a band around each line; chance is a
grey band over the rows' chance values (up to above_chance's threshold, chance + 1.96
chance_sd, where the table has chance_sd) and the ceiling a dotted line (their median); suspect
and duplicate steps are shaded columns. Step 0 stands alone left of the axis break: no line is
drawn across the break.

:func:`draw_second` draws the same lines on the effect scale (0 = chance, 1 = ceiling) or as
value - chance: chance is the line at 0 with the null's band around it (+-1.96 chance_sd on
that scale), the ceiling the line at 1, and the axis always shows both.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from pythia_probe.plots import stepaxis
from pythia_probe.plots.heatmap import STATUS_STYLE

MAX_LEGEND = 8


def _split(x: np.ndarray, steps: list[int]):
    """Indices of step 0 and of the positive steps (drawn on either side of the break)."""
    zero = [i for i, s in enumerate(steps) if s == 0]
    return zero, [i for i, s in enumerate(steps) if s > 0]


def _line(ax, x, y, bounds, steps, style):
    """One row's line; ``bounds`` (lo, hi) its interval band or None; ``style`` (colour,
    legend label)."""
    colour, label = style
    zero, pos = _split(x, steps)
    ax.plot(x[pos], y[pos], color=colour, marker=".", ms=3, lw=1.2, label=label)
    if zero:
        ax.plot(x[zero], y[zero], color=colour, marker="o", ms=3, ls="none")
    if bounds is not None and np.isfinite(bounds[0]).any():
        lo, hi = bounds
        ax.fill_between(x[pos], lo[pos], hi[pos], color=colour, alpha=0.18, lw=0)
        if zero:
            ax.vlines(x[zero], lo[zero], hi[zero], color=colour, lw=1)


def shade_steps(ax, steps: list[int], status: Mapping[int, str]) -> list[int]:
    """Shade the columns of suspect and duplicate steps; returns the steps shaded."""
    e = stepaxis.edges(steps)
    seen, marked = set(), []
    for i, step in enumerate(steps):
        kind = status.get(step)
        if kind not in STATUS_STYLE:
            continue
        _, colour, _ = STATUS_STYLE[kind]
        ax.axvspan(e[i], e[i + 1], color=colour, alpha=0.18, lw=0,
                   label=None if kind in seen else f"{kind} step")
        seen.add(kind)
        marked.append(step)
    return marked


def _scale(ax, x, steps, chance: pd.DataFrame | None, ceiling: pd.DataFrame | None,
           band: pd.DataFrame | None = None) -> None:
    zero, pos = _split(x, steps)
    if chance is not None and chance.notna().to_numpy().any():
        lo, hi = chance.min().to_numpy(float), chance.max().to_numpy(float)
        label = "chance"
        if band is not None and band.notna().to_numpy().any():
            hi = np.fmax(hi, (chance + band).max().to_numpy(float))
            label = "chance (to the above-chance threshold, +1.96 SD of the null)"
        ax.fill_between(x[pos], lo[pos], np.maximum(hi[pos], lo[pos] + 0.004), color="0.4",
                        alpha=0.35, lw=0, hatch="xx", label=label)
    if ceiling is not None and ceiling.notna().to_numpy().any():
        mid = ceiling.median().to_numpy(float)
        ax.plot(x[pos], mid[pos], color="black", ls=":", lw=1.3, label="ceiling")


def draw(ax, c: Mapping[str, pd.DataFrame], *, status: Mapping[int, str] | None = None,
         row_label: str = "layer", ylim: tuple[float, float] | None = None):
    """Draw one line per row of ``c["value"]`` (rows x steps), with the optional tables of
    ``c`` (same shape): ``ci_low``/``ci_high`` (the band around each line), ``chance``,
    ``ceiling`` and ``band`` (above_chance's threshold above chance per cell, 1.96
    chance_sd). Returns a ScalarMappable when the rows are too many for a legend (the caller
    draws it as a colour bar), else None."""
    values = c["value"]
    steps = [int(s) for s in values.columns]
    x = stepaxis.positions(steps)
    shade_steps(ax, steps, status or {})
    _scale(ax, x, steps, c.get("chance"), c.get("ceiling"), c.get("band"))
    n = len(values)
    cmap = colormaps["viridis"]
    low, high = c.get("ci_low"), c.get("ci_high")
    for i, (row, y) in enumerate(values.iterrows()):
        colour = "tab:blue" if n == 1 else cmap(i / max(n - 1, 1))
        bounds = None if low is None else (low.loc[row].to_numpy(float),
                                           high.loc[row].to_numpy(float))
        label = None if n == 1 or n > MAX_LEGEND else f"{row_label} {row}"
        _line(ax, x, y.to_numpy(float), bounds, steps, (colour, label))
    stepaxis.setup(ax, steps)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.25, lw=0.5)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2, loc="best")
    if n > MAX_LEGEND:
        rows = [int(r) for r in values.index]
        return ScalarMappable(Normalize(min(rows), max(rows)), cmap)
    return None


def ylim_for(metric: str) -> tuple[float, float] | None:
    """Fixed limits for cosines (0-1) and correlations (-1..1), else the data's."""
    if metric.startswith("cos_"):
        return (0.0, 1.02)
    if metric.startswith("corr_"):
        return (-1.02, 1.02)
    return None


def second_ylim(values: pd.DataFrame, low: pd.DataFrame | None, high: pd.DataFrame | None,
                effect: bool) -> tuple[float, float]:
    """Limits that always show chance (0) and, for the effect, the ceiling (1), widened to the
    data and its intervals."""
    v = [t.to_numpy(float).ravel() for t in (values, low, high) if t is not None]
    v = np.concatenate(v)
    v = v[np.isfinite(v)]
    lo, hi = (-0.1, 1.1) if effect else (0.0, 0.0)
    if v.size:
        pad = 0.05 * max(float(v.max() - v.min()), 1e-3)
        lo, hi = min(lo, float(v.min()) - pad), max(hi, float(v.max()) + pad)
    return lo, hi


def draw_second(ax, c: Mapping[str, pd.DataFrame], *, effect: bool = True,
                status: Mapping[int, str] | None = None, row_label: str = "layer"):
    """Lines of the effect (``effect``) or of value - chance per row (``c["value"]``, with
    ``ci_low``/``ci_high`` on the same scale where present), chance at 0 (a line, and
    +-``c["band"]`` around it: the null's 1.96 SD on this scale, its widest over the rows)
    and, for the effect, the ceiling at 1; returns as :func:`draw`."""
    values, low, high, band = c["value"], c.get("ci_low"), c.get("ci_high"), c.get("band")
    steps = [int(s) for s in values.columns]
    x = stepaxis.positions(steps)
    zero, pos = _split(x, steps)
    if band is not None and band.notna().to_numpy().any():
        b = band.max().to_numpy(float)
        ax.fill_between(x[pos], -b[pos], b[pos], color="0.4", alpha=0.3, lw=0, hatch="xx",
                        label="chance +- 1.96 SD of the null")
    ax.axhline(0.0, color="0.2", lw=1.0, label="chance")
    if effect:
        ax.axhline(1.0, color="black", ls=":", lw=1.3, label="ceiling")
    lines = {"value": values} | ({} if low is None else {"ci_low": low, "ci_high": high})
    return draw(ax, lines, status=status, row_label=row_label,
                ylim=second_ylim(values, low, high, effect))
