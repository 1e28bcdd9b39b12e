"""What the figures read from a tidy results table (pythia_probe.results), and nothing else.

- Optional columns (``chance``, ``ceiling``, ``ci_low``, ``ci_high``, ``revision_status``) may
  be absent (older tables) or null: :func:`column` gives an all-null column then.
- ``layer`` is numbered as the paper numbers layers, from 1 (layer l = the l-th transformer
  block). Tables written before that convention number blocks from 0; a layer 0 cannot occur in
  a 1-based table, so :func:`paper_layers` shifts such a model's layers by one and says so.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pandas as pd

from pythia_probe.errors import BadInputError

log = logging.getLogger(__name__)

OPTIONAL_FLOATS = ("chance", "ceiling", "ci_low", "ci_high")
#: revision_status values that mean "these weights may not be the step the row names"
FLAGGED = ("suspect", "duplicate")
#: the steps of the paper's Figures 6-8 (leading-terms section 5), besides step 0
PAPER_STEPS = tuple(2**k for k in range(10))


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """``df[name]`` as float (or string for revision_status); all null when the table lacks it."""
    if name == "revision_status":
        if name not in df:
            return pd.Series(pd.NA, index=df.index, dtype="string")
        return df[name].astype("string")
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[name], errors="coerce").astype("float64")


def has(df: pd.DataFrame, name: str) -> bool:
    """Whether ``df`` holds at least one non-null ``name``."""
    return bool(column(df, name).notna().any())


def paper_layers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with layers numbered from 1; a model whose table holds a layer 0 (0-based, older
    tables) has its layers shifted by one, with a warning."""
    if df.empty or df["layer"].notna().sum() == 0:
        return df
    zero_based = df.loc[df["layer"] == 0, "model"].unique()
    if len(zero_based) == 0:
        return df
    df = df.copy()
    shift = df["model"].isin(zero_based) & df["layer"].notna()
    df.loc[shift, "layer"] = df.loc[shift, "layer"] + 1
    log.warning("%s: the table numbers layers from 0 (written before the 1-based convention); "
                "drawn and summarised as layer + 1, the paper's numbering",
                ", ".join(map(str, zero_based)))
    return df


def select(df: pd.DataFrame, analysis: str, metric: str) -> pd.DataFrame:
    """The rows of one (analysis, metric); a BadInputError naming what the table has."""
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric)]
    if sel.empty:
        have = sorted(set(zip(df["analysis"], df["metric"], strict=True)))
        raise BadInputError(f"no rows for analysis={analysis!r} metric={metric!r}; "
                            f"the table has {have}")
    return sel


def pivot(df: pd.DataFrame, analysis: str, metric: str, *, rows: str = "layer",
          layer: int | None = None, values: str = "value") -> pd.DataFrame:
    """A ``rows`` x step table of ``values`` (rows = "layer", or "head" within ``layer``).

    Only rows with a null head are used for a layer pivot. Duplicate cells are an error.
    """
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
    sel = sel.assign(_v=column(sel, values))
    out = sel.pivot(index=rows, columns="step", values="_v")
    out.index, out.columns = out.index.astype(int), out.columns.astype(int)
    out.index.name, out.columns.name = rows, "step"
    return out.sort_index().sort_index(axis=1)


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
