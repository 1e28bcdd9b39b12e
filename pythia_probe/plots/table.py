"""What the figures read from a tidy results table (pythia_probe.results), and nothing else.

- Optional columns (``chance``, ``chance_sd``, ``ceiling``, ``ceiling_half``, ``ci_low``,
  ``ci_high``, ``effect``, ``above_chance``, ``revision_status``) may be absent (older tables)
  or null:
  :func:`~pythia_probe.summary.column` gives an all-null column then (the summary reads the
  table the same way); ``effect`` and ``above_chance`` are computed where the table lacks them
  (:func:`~pythia_probe.summary.effect_column`, :func:`~pythia_probe.summary.above_chance_column`).
- ``layer`` is numbered as the paper numbers layers, from 1 (layer l = the l-th transformer
  block); :func:`~pythia_probe.summary.paper_layers` shifts tables written 0-based.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from pythia_probe.errors import BadInputError
from pythia_probe.summary.table import FLAGGED, above_chance_column, column, effect_column

OPTIONAL_FLOATS = ("chance", "chance_sd", "ceiling", "ceiling_half", "ci_low", "ci_high",
                   "effect", "above_chance")
#: the steps of the paper's Figures 6-8 (leading-terms section 5), besides step 0
PAPER_STEPS = tuple(2**k for k in range(10))


def select(df: pd.DataFrame, analysis: str, metric: str) -> pd.DataFrame:
    """The rows of one (analysis, metric); a BadInputError naming what the table has."""
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric)]
    if sel.empty:
        have = sorted(set(zip(df["analysis"], df["metric"], strict=True)))
        raise BadInputError(f"no rows for analysis={analysis!r} metric={metric!r}; "
                            f"the table has {have}")
    return sel


def cell_values(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` of ``df`` as floats: ``effect`` (the table's, else computed) and
    ``above_chance`` (1.0 / 0.0, NaN where not judged) as the summary reads them."""
    if name == "effect":
        return effect_column(df)
    if name == "above_chance":
        return above_chance_column(df).astype("Float64").to_numpy(float, na_value=np.nan)
    return column(df, name)


def pivots(df: pd.DataFrame, analysis: str, metric: str, names, *, rows: str = "layer",
           layer: int | None = None) -> dict[str, pd.DataFrame]:
    """``rows`` x step tables of each column in ``names`` (rows = "layer", or "head" within
    ``layer``; see :func:`pivot`)."""
    sel = select(df, analysis, metric)
    if rows == "layer":
        sel = sel[sel["head"].isna() & sel["layer"].notna()]
    else:
        sel = sel[(sel["layer"] == layer) & sel["head"].notna()]
    if sel.empty:
        raise BadInputError(f"no {rows} rows for {analysis}/{metric}" +
                            (f" at layer {layer}" if layer is not None else ""))
    if sel.duplicated([rows, "step"]).any():
        raise BadInputError(f"duplicate ({rows}, step) cells for {analysis}/{metric}: "
                            "mixed models or runs in one table?")
    index = pd.Index(sel[rows].astype(int), name=rows)
    steps = pd.Index(sel["step"].astype(int), name="step")
    out = {}
    for name in names:
        t = pd.DataFrame({rows: index, "step": steps,
                          "_v": np.asarray(cell_values(sel, name), dtype=float)})
        t = t.pivot(index=rows, columns="step", values="_v")
        t.index.name, t.columns.name = rows, "step"
        out[name] = t.sort_index().sort_index(axis=1)
    return out


def pivot(df: pd.DataFrame, analysis: str, metric: str, *, rows: str = "layer",
          layer: int | None = None, values: str = "value") -> pd.DataFrame:
    """A ``rows`` x step table of ``values`` (rows = "layer", or "head" within ``layer``).

    Only rows with a null head are used for a layer pivot. Duplicate cells are an error.
    """
    return pivots(df, analysis, metric, [values], rows=rows, layer=layer)[values]


def step_status(df: pd.DataFrame) -> dict[int, str]:
    """step -> "suspect" or "duplicate" for the flagged steps of ``df`` (suspect wins)."""
    status = column(df, "revision_status")
    mask = status.isin(FLAGGED).fillna(False).astype(bool)
    out: dict[int, str] = {}
    for step, s in zip(df.loc[mask, "step"], status[mask], strict=True):
        if out.get(int(step)) != "suspect":
            out[int(step)] = str(s)
    return out


def figure_steps(steps, paper: bool) -> list[int]:
    """The steps a figure shows: all of them, or (``paper``) step 0 and 1, 2, 4, ..., 512 where
    the table has any of those (else all, so nothing is drawn empty)."""
    steps = sorted({int(s) for s in steps})
    if not paper:
        return steps
    chosen = [s for s in steps if s == 0 or s in PAPER_STEPS]
    return chosen if any(s in PAPER_STEPS for s in chosen) else steps


def n_layers(df: pd.DataFrame) -> int:
    """The number of layers of the model of ``df`` (its largest 1-based layer)."""
    layers = df["layer"].dropna()
    return int(layers.max()) if len(layers) else 0


def head_layers(wanted, available) -> list[int]:
    """``wanted`` (the paper's 2, 13, 24) clipped to the model's layers and kept where the table
    has per-head rows."""
    available = sorted({int(x) for x in available})
    if not available:
        return []
    top = available[-1]
    return sorted({min(int(x), top) for x in wanted} & set(available))


def short_model(model: str) -> str:
    """``EleutherAI/pythia-1.4b`` -> ``pythia-1.4b``."""
    return str(model).rstrip("/").rsplit("/", 1)[-1]


def safe_name(text: str) -> str:
    """A file-name part: letters, digits and ``._=-``, the rest ``_``."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", str(text)).strip("._") or "x"


def series(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(name, rows) per model and settings in ``df``: the figures of one run never mix them.

    The name is "" when the table holds one model with one setting."""
    keys = df[["model", "settings"]].astype("string").fillna("")
    groups = list(df.groupby([keys["model"], keys["settings"]], sort=True))
    if len(groups) == 1:
        return [("", df)]
    return [(safe_name(short_model(m) + (f"_{s}" if s else "")), g) for (m, s), g in groups]
