"""Helpers for the analyses/icrecall_*.py scripts: settings keys, result tables, figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import torch
from matplotlib.figure import Figure

from pythia_probe.results import write_shard
from pythia_probe.toy.icrecall.experiment import Outcome, metric_rows
from pythia_probe.toy.repro import save_figure, write_csv  # noqa: F401 - write_csv re-exported

OUT = Path("results/icrecall")


def key(**kw) -> str:
    """Settings of one run as a stable string, stored in the table's settings column."""
    return ";".join(f"{k}={v}" for k, v in kw.items())


def parse_key(s: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in s.split(";") if part)


def outcome_rows(out: Outcome, analysis: str, steps: int, **settings) -> pd.DataFrame:
    """Final metrics of one run, tagged with its settings (settings = key(**settings))."""
    return metric_rows(out.metrics, analysis, steps, int(out.metrics["n_all"]),
                       settings=key(**settings))


def save(frames: list[pd.DataFrame], name: str, out_dir: Path = OUT) -> Path:
    """Concatenate and write ``out_dir/name.parquet`` atomically."""
    return write_shard(pd.concat(frames, ignore_index=True), Path(out_dir) / f"{name}.parquet")


def wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (settings split into columns), one column per metric.

    Rows without settings (null, e.g. the pre-trained memory's own recall) form one run.
    """
    df = df.assign(settings=df["settings"].fillna(""))
    w = df.pivot_table(index="settings", columns="metric", values="value", aggfunc="first")
    settings = pd.DataFrame([parse_key(r) for r in w.index], index=w.index)
    return pd.concat([settings, w], axis=1).reset_index(drop=True)


def config_dict(*cfgs) -> dict:
    return {type(c).__name__: dataclasses.asdict(c) for c in cfgs}


def row_labels(k: int) -> list[str]:
    return [f"{x}{i}" for i in range(1, k + 1) for x in "sa"] + [f"s{k + 1}", "?"]


def plot_rows(ax, rows: dict[str, torch.Tensor], title: str = "") -> None:
    """Grouped bars: one group per position, one bar per named attention row."""
    names = list(rows)
    L = len(next(iter(rows.values())))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([j + i * width for j in range(L)], rows[name].tolist(), width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(L)])
    ax.set_xticklabels(row_labels((L - 2) // 2))
    ax.set_ylabel("attention at '?'")
    ax.set_title(title)
    ax.legend(fontsize=7)


def subplots(nrows: int = 1, ncols: int = 1, **kw):
    """(figure, axes) without pyplot (no backend is chosen by importing or drawing)."""
    figsize = kw.pop("figsize", None)
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def savefig(fig, name: str, out_dir: Path = OUT) -> Path:
    """``out_dir/name.png`` through the one atomic writer."""
    fig.tight_layout()
    return save_figure(fig, Path(out_dir) / f"{name}.png", dpi=110)
