"""Heat maps and curves drawn from tidy result tables only (pythia_probe.results).

- :func:`heatmap`: layer x step for one (analysis, metric), the shape of the paper's Figure 6.
- :func:`head_heatmaps`: head x step for chosen layers, like Figure 7.
- :func:`curves`: value against step, one line per layer.
- :func:`plot_run`: every figure for a run folder; ``python -m pythia_probe.plots RUN_DIR``.

Steps are placed as equally spaced categorical columns labelled by their value, since the
Pythia schedule (0, 1, 2, 4, ..., 512, 1000, 2000, ...) is neither linear nor logarithmic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.cli import parse_config, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import read_results  # noqa: E402


def _select(df: pd.DataFrame, analysis: str, metric: str) -> pd.DataFrame:
    sel = df[(df["analysis"] == analysis) & (df["metric"] == metric)]
    if sel.empty:
        have = sorted(set(zip(df["analysis"], df["metric"], strict=True)))
        raise BadInputError(f"no rows for analysis={analysis!r} metric={metric!r}; "
                            f"the table has {have}")
    return sel


def pivot(df: pd.DataFrame, analysis: str, metric: str, *, rows: str = "layer",
          layer: int | None = None) -> pd.DataFrame:
    """A ``rows`` x step table of values (rows = "layer", or "head" within ``layer``).

    Only rows with a null head are used for a layer pivot. Duplicate cells are an error.
    """
    sel = _select(df, analysis, metric)
    if rows == "layer":
        sel = sel[sel["head"].isna()]
    else:
        sel = sel[(sel["layer"] == layer) & sel["head"].notna()]
    if sel.empty:
        raise BadInputError(f"no {rows} rows for {analysis}/{metric}" +
                            (f" at layer {layer}" if layer is not None else ""))
    if sel.duplicated([rows, "step"]).any():
        raise BadInputError(f"duplicate ({rows}, step) cells for {analysis}/{metric}: "
                            "mixed models or runs in one table?")
    out = sel.pivot(index=rows, columns="step", values="value")
    out.index, out.columns = out.index.astype(int), out.columns.astype(int)
    return out.sort_index().sort_index(axis=1)


def _draw(ax, table: pd.DataFrame, ylabel: str, vmin=None, vmax=None):
    im = ax.imshow(table.to_numpy(dtype=float), aspect="auto", origin="lower",
                   cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(table.shape[1]), [str(s) for s in table.columns], rotation=90,
                  fontsize=7)
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index], fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    return im


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def heatmap(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike,
            title: str | None = None) -> Path:
    """Save a layer x step heat map of ``value`` for one (analysis, metric)."""
    table = pivot(df, analysis, metric)
    fig = Figure(figsize=(1.2 + 0.28 * table.shape[1], 1.2 + 0.22 * table.shape[0]))
    ax = fig.subplots()
    fig.colorbar(_draw(ax, table, "layer"), ax=ax, label=metric)
    ax.set_title(title or f"{analysis}: {metric}")
    return _save(fig, path)


def head_heatmaps(df: pd.DataFrame, analysis: str, metric: str, layers: Sequence[int],
                  path: str | os.PathLike) -> Path:
    """Save head x step heat maps for each layer in ``layers`` side by side (Figure 7)."""
    tables = [pivot(df, analysis, metric, rows="head", layer=layer) for layer in layers]
    lo = min(float(t.min().min()) for t in tables)
    hi = max(float(t.max().max()) for t in tables)
    fig = Figure(figsize=(4 * len(tables), 3.2))
    axes = fig.subplots(1, len(tables), squeeze=False)
    for ax, layer, t in zip(axes[0], layers, tables, strict=True):
        im = _draw(ax, t, "head", lo, hi)
        ax.set_title(f"layer {layer}")
    fig.colorbar(im, ax=list(axes[0]), label=metric)
    fig.suptitle(f"{analysis}: {metric} per head", y=1.04)
    return _save(fig, path)


def curves(df: pd.DataFrame, analysis: str, metric: str, path: str | os.PathLike) -> Path:
    """Save value against step (symlog x axis), one line per layer."""
    table = pivot(df, analysis, metric)
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for layer, values in table.iterrows():
        ax.plot(table.columns, values.to_numpy(dtype=float), marker=".", label=f"layer {layer}")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{analysis}: {metric}")
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


def default_head_layers(n_layers: int) -> list[int]:
    """First, middle and last layer (Figure 7 used 2, 13, 24 of Pythia-1.4b's 24)."""
    return sorted({min(1, n_layers - 1), n_layers // 2, n_layers - 1})


def plot_run(df: pd.DataFrame, out_dir: str | os.PathLike,
             head_layers: Sequence[int] | None = None) -> list[Path]:
    """Every figure for one table: layer heat maps + curves per (analysis, metric with layers),
    and head heat maps for metrics with per-head rows."""
    out_dir, paths = Path(out_dir), []
    layered = df[df["layer"].notna()]
    for (analysis, metric), sel in layered.groupby(["analysis", "metric"], sort=True):
        if sel["head"].isna().any():
            paths.append(heatmap(df, analysis, metric, out_dir / f"{analysis}_{metric}.png"))
            paths.append(curves(df, analysis, metric, out_dir / f"{analysis}_{metric}_curve.png"))
        if sel["head"].notna().any():
            have = sorted(int(x) for x in sel.loc[sel["head"].notna(), "layer"].unique())
            layers = [x for x in (head_layers or default_head_layers(max(have) + 1)) if x in have]
            paths.append(head_heatmaps(df, analysis, metric, layers or have[:3],
                                       out_dir / f"{analysis}_{metric}_heads.png"))
    return paths


@dataclass(frozen=True)
class PlotsConfig:
    """Draw every figure of a results folder: layer x step heat maps and curves per (analysis,
    metric), head x step maps for per-head metrics."""

    results: str
    """Folder of Parquet result shards (a sweep's --out)."""
    out: str | None = None
    """Where the PNGs go (default: RESULTS/plots)."""
    head_layers: tuple[int, ...] = ()
    """Layers for the per-head maps, e.g. 1,12,23 (default: first, middle and last)."""


def main(argv: list[str] | None = None) -> int:
    """CLI: draw every figure for a results folder."""
    cfg = parse_config(PlotsConfig, argv, "python -m pythia_probe.plots")
    for path in plot_run(read_results(cfg.results), cfg.out or Path(cfg.results) / "plots",
                         list(cfg.head_layers) or None):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.plots"))
