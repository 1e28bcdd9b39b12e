"""The answer to the paper's question from a results table: when does each layer's (and head's)
agreement with the leading terms peak, and when does it leave?

Per (model, settings, analysis, metric, layer, head), over the steps sorted, on one ``scale``:

- ``scale`` "effect" where every row has one: effect = (value - chance) / (ceiling - chance),
  0 = chance, 1 = the ceiling (the table's ``effect`` column, else computed from value, chance
  and ceiling); "value - chance" otherwise (rows without a ceiling: unembedding, runs with
  ``--no-intervals``). ``chance`` is the table's column; where the table has none (older tables)
  it is taken as 0 and ``chance_source`` says so.
- ``peak_step``: the step where the score on that scale is largest (the earliest of ties);
  ``peak_value``, ``peak_chance``, ``peak_effect`` (NaN off the effect scale) at that step.
- ``exit_step``: the first step after the peak whose score < peak / 2 (``half_above``, on the
  same scale), i.e. agreement fell below half of its peak above chance. ``censored`` is True
  when it never does within the steps measured (the exit is later than ``last_step``, or the
  peak is the last step). Where the peak is not above chance (``peak_above_chance`` False)
  there is no exit to speak of: exit and censored are null. Above chance is the table's
  ``above_chance`` test at the peak where the table has it, else the interval's lower end (or
  the value) above chance; ``above_chance_rule`` says which.
- Intervals, from the table's ``ci_low``/``ci_high`` (an interval over documents for each
  cell), mapped to the scale as the value is: ``peak_step_low``..``peak_step_high`` spans the
  steps whose interval overlaps the peak's, the steps the documents cannot tell apart from the
  peak; the exit lies between ``exit_step_low``, the first step after the peak whose interval's
  lower end is below the half level (it may have fallen), and ``exit_step_high``, the first
  whose upper end is (it surely has). Without ci columns the intervals are null and
  ``interval`` says so: the spread over documents is only seen by the sweep, and a table of one
  number per cell holds nothing to resample.
- Steps whose ``revision_status`` is "suspect" or "duplicate" (weights that may not be the
  step they claim) are left out and listed in ``excluded_steps``.

``layer`` is numbered from 1, as the paper; tables written before that convention (a layer 0
present) are shifted by one with a warning (:func:`paper_layers`).

Every name here is also ``pythia_probe.summary.NAME`` (the package reads it on first use);
the command is ``python -m pythia_probe.summary`` (:func:`pythia_probe.summary.main`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pythia_probe.errors import ResultsError
from pythia_probe.fileio import atomic_write
from pythia_probe.results import check_cells

log = logging.getLogger(__name__)

SUMMARY = "summary.parquet"
#: revision_status values whose weights may not be the step the row names
FLAGGED = ("suspect", "duplicate")
KEYS = ["model", "settings", "analysis", "metric", "layer", "head"]
STEP_COLUMNS = ["first_step", "last_step", "peak_step", "peak_step_low", "peak_step_high",
                "exit_step", "exit_step_low", "exit_step_high"]
INTERVAL = "steps whose ci_low..ci_high overlaps the peak's; exit between lower and upper end"
NO_INTERVAL = "none: the table has no ci_low/ci_high for these cells"
#: the two scales peaks and exits are judged on (the ``scale`` column)
EFFECT, ABOVE = "effect", "value - chance"


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """``df[name]`` as float (revision_status as string); all null when the table lacks it."""
    if name == "revision_status":
        if name not in df:
            return pd.Series(pd.NA, index=df.index, dtype="string")
        return df[name].astype("string")
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[name], errors="coerce").astype("float64")


def to_effect(x: pd.Series | np.ndarray, chance, ceiling):
    """``x`` (a value or an interval end) on the effect scale: (x - chance) / (ceiling -
    chance); NaN where there is no ceiling above chance."""
    span = ceiling - chance
    return np.where(span > 0, (x - chance) / np.where(span > 0, span, 1.0), np.nan)


def effect_column(df: pd.DataFrame) -> pd.Series:
    """Each row's effect, (value - chance) / (ceiling - chance): 0 = chance, 1 = the ceiling.
    The table's ``effect`` where it has one, else computed (older tables); NaN where a row has
    no chance or no ceiling above it."""
    computed = to_effect(column(df, "value"), column(df, "chance"), column(df, "ceiling"))
    return column(df, "effect").fillna(pd.Series(computed, index=df.index))


#: how a row was judged above chance: the table's calibrated test, or the older rules
ABOVE_RULES = {"table": "the table's above_chance (one-sided test, z > 1.96 against the null's "
                        "spread and the interval over documents: unrelated weights flagged "
                        "<= 5%)",
               "interval": "older table: the interval's lower end above chance",
               "value": "older table without intervals: the value above chance"}


def above_chance_column(df: pd.DataFrame) -> pd.Series:
    """Each row's ``above_chance`` (boolean, NA where it cannot be judged): the table's column
    where it has one; on older tables the rule they were drawn with, ci_low (else the value)
    above chance, NA without a chance."""
    chance = column(df, "chance")
    low = column(df, "ci_low").fillna(column(df, "value"))
    old = (low > chance).astype("boolean").mask(chance.isna())
    if "above_chance" not in df:
        return old
    return df["above_chance"].astype("boolean").fillna(old)


def above_chance_rule(df: pd.DataFrame) -> str:
    """Which rule :func:`above_chance_column` used for ``df`` (a key of :data:`ABOVE_RULES`):
    the table's column when any row has it, else the interval's, else the value's."""
    if "above_chance" in df and df["above_chance"].notna().any():
        return "table"
    return "interval" if column(df, "ci_low").notna().any() else "value"


def paper_layers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with layers numbered from 1. A layer 0 cannot occur in a 1-based table, so a model
    whose rows hold one (0-based, older tables) has its layers shifted by one, with a warning."""
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


def _first(mask: np.ndarray, after: int) -> int | None:
    hits = np.nonzero(mask[after + 1:])[0]
    return int(after + 1 + hits[0]) if hits.size else None


def curve_summary(steps: np.ndarray, score: np.ndarray, lo: np.ndarray | None = None,
                  hi: np.ndarray | None = None, above: np.ndarray | None = None) -> dict:
    """Peak, exit and their intervals of one curve on its scale (``score``: effect, or value
    - chance; ``lo``/``hi`` its interval on the same scale or None; ``above``: each step's
    above-chance flag, or None to judge the peak by ``lo`` (else ``score``) > 0)."""
    i = int(np.argmax(score))
    half = score[i] / 2
    out = {"peak_index": i, "peak_step": steps[i], "half_above": half, "peak_step_low": None,
           "peak_step_high": None, "exit_index": None, "exit_step": None,
           "exit_step_low": None, "exit_step_high": None, "censored": None}
    if above is not None and not pd.isna(above[i]):
        out["peak_above_chance"] = bool(above[i])
    else:
        out["peak_above_chance"] = bool(score[i] > 0 if lo is None else lo[i] > 0)
    if lo is not None:
        close = (lo <= hi[i]) & (hi >= lo[i])
        out["peak_step_low"], out["peak_step_high"] = steps[close].min(), steps[close].max()
    if not out["peak_above_chance"]:
        return out
    j = _first(score < half, i)
    out["censored"] = j is None
    if j is not None:
        out["exit_index"], out["exit_step"] = j, steps[j]
    if lo is not None:
        for key, bound in (("exit_step_low", lo), ("exit_step_high", hi)):
            k = _first(bound < half, i)
            out[key] = None if k is None else steps[k]
    return out


def cell_summary(steps: np.ndarray, value: np.ndarray, chance: np.ndarray,
                 ci: tuple[np.ndarray, np.ndarray] | None = None,
                 ceiling: np.ndarray | None = None, above: np.ndarray | None = None,
                 effect: np.ndarray | None = None) -> dict:
    """Peak, exit and their intervals of one cell's curve (arrays sorted by step; chance
    already 0 where unknown; ``ci`` (ci_low, ci_high), None when there are none). On the effect
    scale when
    ``ceiling`` puts every step's effect in reach (``effect``: the table's, else computed),
    else on value - chance; ``above`` as :func:`curve_summary`."""
    ci_low, ci_high = (None, None) if ci is None else ci
    if effect is None and ceiling is not None:
        effect = to_effect(value, chance, ceiling)
    on_effect = effect is not None and bool(np.isfinite(effect).all())
    if on_effect:
        score = np.asarray(effect, dtype=float)
        lo, hi = ((None, None) if ci_low is None or ceiling is None else
                  (to_effect(ci_low, chance, ceiling), to_effect(ci_high, chance, ceiling)))
        if lo is not None and not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            lo = hi = None
    else:
        score = value - chance
        lo = None if ci_low is None else ci_low - chance
        hi = None if ci_high is None else ci_high - chance
    out = curve_summary(steps, score, lo, hi, above)
    i, j = out.pop("peak_index"), out.pop("exit_index")
    return {**out, "scale": EFFECT if on_effect else ABOVE, "peak_value": value[i],
            "peak_chance": chance[i], "peak_effect": score[i] if on_effect else np.nan,
            "exit_value": np.nan if j is None else value[j]}


def _floats(g: pd.DataFrame, name: str) -> np.ndarray | None:
    """``g[name]`` as floats, or None when any row lacks it."""
    x = column(g, name)
    return x.to_numpy(float) if x.notna().all() else None


def _group_summary(g: pd.DataFrame) -> dict:
    g = g.sort_values("step")
    chance = column(g, "chance")
    low, high = _floats(g, "ci_low"), _floats(g, "ci_high")
    intervals = low is not None and high is not None
    rule = above_chance_rule(g)
    row = cell_summary(g["step"].to_numpy(np.int64), g["value"].to_numpy(float),
                       chance.fillna(0.0).to_numpy(float), (low, high) if intervals else None,
                       _floats(g, "ceiling"),
                       above_chance_column(g).to_numpy(object, na_value=None)
                       if rule == "table" else None,
                       _floats(g, "effect") if chance.notna().all() else None)
    source = ("table" if chance.notna().all() else "assumed 0: no chance in the table"
              if chance.isna().all() else "table, 0 where missing")
    return {**row, "steps": len(g), "first_step": int(g["step"].iloc[0]),
            "last_step": int(g["step"].iloc[-1]), "chance_source": source,
            "above_chance_rule": ABOVE_RULES[rule],
            "interval": INTERVAL if intervals else NO_INTERVAL}


def _key(values) -> tuple:
    return tuple(None if pd.isna(v) else v for v in values)


def _excluded(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[tuple, str]]:
    """(rows kept, key -> the steps of its rows left out as suspect or duplicate)."""
    flagged = column(df, "revision_status").isin(FLAGGED).fillna(False).astype(bool)
    gone = {_key(k): ",".join(str(int(x)) for x in sorted(set(g["step"])))
            for k, g in df[flagged].groupby(KEYS, dropna=False, sort=False)}
    return df[~flagged], gone


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, settings, analysis, metric, layer, head) of ``df``: peak and exit
    steps with intervals (see the module docstring). A cell held twice (two runs' rows in one
    table) is refused naming the runs."""
    missing = [c for c in [*KEYS, "step", "value"] if c not in df]
    if missing:
        raise ResultsError(f"the table lacks the columns {missing}: summary_table takes a "
                           "results table (pp.read_results of a results folder)")
    check_cells(df, "the table")
    df = paper_layers(df)
    kept, gone = _excluded(df)
    rows = []
    for key, g in kept.groupby(KEYS, dropna=False, sort=True):
        rows.append({**dict(zip(KEYS, key, strict=True)), **_group_summary(g),
                     "excluded_steps": gone.get(_key(key), "")})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    for col in [*STEP_COLUMNS, "layer", "head", "steps"]:
        out[col] = pd.array([None if pd.isna(v) else int(v) for v in out[col]], dtype="Int64")
    out["censored"] = out["censored"].astype("boolean")
    for col in ("model", "settings", "analysis", "metric", "scale", "chance_source",
                "above_chance_rule", "interval", "excluded_steps"):
        out[col] = out[col].astype("string")
    return out


def write_summary(summary: pd.DataFrame, out_dir: str | os.PathLike) -> Path:
    """Write ``OUT/summary.parquet`` through :func:`pythia_probe.fileio.atomic_write`."""
    table = pa.Table.from_pandas(summary, preserve_index=False)
    return atomic_write(Path(out_dir) / SUMMARY, lambda tmp: pq.write_table(table, tmp),
                        table.nbytes)


def step_label(step: int) -> str:
    """``512`` -> "512", ``1000`` -> "1k", ``143000`` -> "143k", ``1500`` -> "1500"."""
    return f"{step // 1000}k" if step >= 1000 and step % 1000 == 0 else str(step)


def _steps(v, lo, hi) -> str:
    if pd.isna(lo):
        return step_label(int(v))
    span = step_label(int(lo)) if lo == hi else f"{step_label(int(lo))}-{step_label(int(hi))}"
    return f"{step_label(int(v))} [{span}]"


def _exit(r) -> str:
    if pd.isna(r.censored):
        return "peak not above chance"
    if r.censored:
        return f"> {step_label(int(r.last_step))} (censored)"
    if pd.isna(r.exit_step_low):
        return step_label(int(r.exit_step))
    lo = step_label(int(r.exit_step_low))
    hi = "never" if pd.isna(r.exit_step_high) else step_label(int(r.exit_step_high))
    return f"{step_label(int(r.exit_step))} [{lo if lo == hi else f'{lo}-{hi}'}]"


def _lines(g: pd.DataFrame, heads: bool) -> pd.DataFrame:
    out = pd.DataFrame({
        "layer": ["-" if pd.isna(x) else str(int(x)) for x in g["layer"]],
        "head": ["-" if pd.isna(x) else str(int(x)) for x in g["head"]],
        "peak step [alike]": [_steps(r.peak_step, r.peak_step_low, r.peak_step_high)
                              for r in g.itertuples()],
        "peak": [f"{v:.3f}" for v in g["peak_value"]],
        "chance": [f"{v:.3f}" for v in g["peak_chance"]],
        "effect": ["-" if pd.isna(v) else f"{v:.3f}" for v in g["peak_effect"]],
        "exit step [may-sure]": [_exit(r) for r in g.itertuples()]})
    if (g["scale"] != EFFECT).all():
        out = out.drop(columns="effect")
    return out if heads else out.drop(columns="head")


LEGEND = ("Agreement with the theory, per layer, on the effect scale where the table has a "
          "ceiling: effect = (value - chance) / (ceiling - chance), 0 = chance, 1 = ceiling; "
          "else on value - chance (each block says which).\n"
          "peak = the step of the largest effect (or value - chance); exit = the first step "
          "after it below half of the peak on the same scale.\n"
          "[alike]: the steps whose interval over documents overlaps the peak's. [may-sure]: "
          "the first steps after the peak whose interval's lower / upper end is below that "
          "half level. peak, chance: the value and its chance at the peak step.")

SCALE_TEXT = {EFFECT: "scale: effect, 0 = chance, 1 = ceiling",
              ABOVE: "scale: value - chance (no ceiling)"}


def _notes(g: pd.DataFrame) -> str:
    first = g.iloc[0]
    notes = [" and ".join(SCALE_TEXT[s] for s in sorted(set(g["scale"]))),
             f"chance: {first.chance_source}",
             "intervals: ci_low/ci_high" if first.interval == INTERVAL else "no intervals",
             f"above chance: {first.above_chance_rule}"]
    if first.excluded_steps:
        notes.append(f"left out as suspect/duplicate: steps {first.excluded_steps}")
    return "; ".join(notes)


def format_summary(summary: pd.DataFrame, *, heads: bool = False) -> str:
    """The summary as readable text, one block per (model, analysis, metric); per-head rows
    only with ``heads`` (they are always in summary.parquet)."""
    if summary.empty:
        return "summary: no rows"
    shown = summary if heads else summary[summary["head"].isna()]
    blocks = [LEGEND]
    for (model, settings, analysis, metric), g in shown.groupby(
            ["model", "settings", "analysis", "metric"], dropna=False, sort=True):
        run = "" if pd.isna(settings) else f" [{settings}]"
        table = _lines(g, heads).to_string(index=False)
        blocks.append(f"{model}{run} {analysis} {metric} ({_notes(g)})\n{table}")
    hidden = 0 if heads else int(summary["head"].notna().sum())
    if hidden:
        blocks.append(f"({hidden} per-head rows in {SUMMARY}; --heads prints them)")
    return "\n\n".join(blocks)


def report(df: pd.DataFrame, out_dir: str | os.PathLike, *, heads: bool = False) -> str:
    """What a sweep or the demo calls: summarise ``df``, write ``out_dir/summary.parquet``, and
    return the readable table to print."""
    summary = summary_table(df)
    path = write_summary(summary, out_dir)
    return f"{format_summary(summary, heads=heads)}\n\nwrote {path}"
