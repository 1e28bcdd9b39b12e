"""The scale every figure draws beside the raw value: effect = (value - chance) / (ceiling -
chance), 0 = chance, 1 = the ceiling (:func:`pythia_probe.summary.effect_column`), and, for
rows without a ceiling (unembedding, runs with ``--no-intervals``), value - chance.

Both are drawn on a diverging map centred on chance, so a cell at chance is white whatever its
raw value: the effect on a fixed -1..1 (ceiling at the top, below chance in brown), value -
chance on a range symmetric about 0. Its colour map (BrBG) is unlike the raw panels' (RdYlBu_r,
RdBu_r), so the two scales cannot be read for each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pythia_probe.analysis.intervals import Z_ABOVE
from pythia_probe.summary.table import ABOVE, EFFECT

EFFECT_CMAP = "BrBG"
EFFECT_RANGE = (-1.0, 1.0)
#: where the colour bar of the effect names its two anchors
EFFECT_TICKS = {-1.0: "-1", -0.5: "-0.5", 0.0: "0 chance", 0.5: "0.5", 1.0: "1 ceiling"}
#: above_chance's threshold (analysis/intervals.py): chance_sd times this is where the null's
#: band ends, the distance from chance a value needs (without intervals) to be flagged
Z95 = Z_ABOVE


@dataclass(frozen=True)
class Second:
    """What the second panel of a figure draws: ``kind`` EFFECT or ABOVE, its colour range."""

    kind: str
    vmin: float
    vmax: float
    cmap: str = EFFECT_CMAP

    @property
    def label(self) -> str:
        return "effect" if self.kind == EFFECT else "value - chance"

    @property
    def words(self) -> str:
        if self.kind == EFFECT:
            return "effect = (value - chance) / (ceiling - chance): 0 = chance, 1 = ceiling"
        return "value - chance (no ceiling in the table): 0 = chance"


def second_scale(panels: list[dict[str, pd.DataFrame]]) -> Second | None:
    """The second panel's scale for cell tables (``value``, ``chance``, ``effect``, ...) drawn
    together: the effect when every panel has one, else value - chance when every panel has a
    chance, else None (nothing to draw beside the raw value)."""
    def some(c, key):
        return bool(np.isfinite(c[key].to_numpy(float)).any())

    if panels and all(some(c, "effect") for c in panels):
        return Second(EFFECT, *EFFECT_RANGE)
    if panels and all(some(c, "chance") for c in panels):
        v = np.concatenate([above(c).to_numpy(float).ravel() for c in panels])
        top = float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 1.0
        return Second(ABOVE, -(top or 1.0), top or 1.0)
    return None


def above(c: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return c["value"] - c["chance"]


def second_values(c: dict[str, pd.DataFrame], second: Second) -> pd.DataFrame:
    """The cells of the second panel: effect, or value - chance."""
    return c["effect"] if second.kind == EFFECT else above(c)


def second_bounds(c: dict[str, pd.DataFrame], second: Second):
    """(low, high) of the interval over documents on the second panel's scale (None, None
    without one), mapped as the value is."""
    if not c["ci_low"].notna().to_numpy().any():
        return None, None
    if second.kind == EFFECT:
        span = (c["ceiling"] - c["chance"]).where(lambda x: x > 0)
        return (c["ci_low"] - c["chance"]) / span, (c["ci_high"] - c["chance"]) / span
    return c["ci_low"] - c["chance"], c["ci_high"] - c["chance"]


def null_band(c: dict[str, pd.DataFrame], second: Second | None = None) -> pd.DataFrame:
    """Z95 x chance_sd per cell (above_chance's threshold above chance), on the
    raw scale or on ``second``'s; NaN without chance_sd."""
    band = Z95 * c["chance_sd"]
    if second is not None and second.kind == EFFECT:
        band = band / (c["ceiling"] - c["chance"]).where(lambda x: x > 0)
    return band


def label_effect_bar(cbar, second: Second) -> None:
    """Ticks of the effect's colour bar: -1, -0.5, "0 chance", 0.5, "1 ceiling"."""
    if second.kind == EFFECT:
        cbar.set_ticks(list(EFFECT_TICKS), labels=list(EFFECT_TICKS.values()), fontsize=7)
    else:
        cbar.ax.axhline(0.0, color="black", lw=0.8)
