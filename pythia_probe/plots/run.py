"""Every figure of a results table, and the ``python -m pythia_probe.plots`` command.

:func:`plot_run` is what a sweep calls: the paper's Figures 6 and 7 (:mod:`.paper`), then for
every metric a picture: layer x step heat map and curves for per-layer metrics, head x step
maps for per-head metrics, curves for layerless ones (one figure per analysis). A table holding
several models (or settings) gets one subfolder each, and the models side by side
(:mod:`.compare`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pythia_probe.cli import parse_config
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import check_folders, check_writable, with_subfolders
from pythia_probe.plots import figures
from pythia_probe.plots.compare import compare_run
from pythia_probe.plots.config import PlotsConfig
from pythia_probe.plots.paper import PAPER_HEAD_LAYERS, paper_figures
from pythia_probe.plots.table import head_layers as clip_layers
from pythia_probe.plots.table import series
from pythia_probe.results import MANIFEST, ResultsError, read_manifest, read_results
from pythia_probe.summary.table import paper_layers


def metric_figures(df: pd.DataFrame, out_dir: str | os.PathLike, *,
                   manifest: dict[str, Any] | None = None,
                   head_layers: Sequence[int] = PAPER_HEAD_LAYERS) -> list[Path]:
    """A picture of every metric of one model's table, over all its steps."""
    out, paths = Path(out_dir), []
    layered = df[df["layer"].notna()]
    for (analysis, metric), sel in layered.groupby(["analysis", "metric"], sort=True):
        name = f"{analysis}_{metric}"
        if sel["head"].isna().any():
            paths.append(figures.layer_figure(df, analysis, metric, out / f"{name}.png",
                                              manifest=manifest))
            paths.append(figures.curve_figure(df, analysis, metric, out / f"{name}_curve.png",
                                              manifest=manifest))
        if sel["head"].notna().any():
            layers = clip_layers(head_layers, sel.loc[sel["head"].notna(), "layer"])
            paths.append(figures.head_figure(df, analysis, metric, layers,
                                             out / f"{name}_heads.png",
                                             texts=figures.Texts(manifest)))
    flat = df[df["layer"].isna() & df["head"].isna()]
    for analysis, sel in flat.groupby("analysis", sort=True):
        metrics = sorted(sel["metric"].unique())
        paths.append(figures.layerless_figure(df, analysis, metrics, out / f"{analysis}.png",
                                              manifest=manifest))
    return paths


def plot_run(df: pd.DataFrame, out_dir: str | os.PathLike, *,
             manifest: dict[str, Any] | None = None,
             head_layers: Sequence[int] | None = None, paper: bool = True,
             every_metric: bool = True, sizes: Mapping[str, float] | None = None) -> list[Path]:
    """Draw the figures of a results table into ``out_dir``; returns the paths written.

    ``paper``: Figures 6 and 7 (``figure6.png``, ``figure7.png``); ``every_metric``: a picture
    of every metric. ``head_layers``: layers of the per-head maps (1-based; default the paper's
    2, 13, 24, clipped to the model's layers). ``manifest``: the run's manifest.json, for the
    statistics named in the titles. A table of several models gets a folder per model and, in
    ``out_dir``, the comparative figures and tables (:func:`~.compare.compare_run`; ``sizes``:
    parameters per model where the names hold none)."""
    layers = tuple(head_layers or PAPER_HEAD_LAYERS)
    df = paper_layers(df)
    paths: list[Path] = compare_run(df, out_dir, manifest=manifest, sizes=sizes)
    for name, part in series(df):
        out = Path(out_dir) / name if name else Path(out_dir)
        if paper:
            paths += paper_figures(part, out, manifest=manifest, head_layers=layers)
        if every_metric:
            paths += metric_figures(part, out, manifest=manifest, head_layers=layers)
    return paths


def run_manifest(results: str | os.PathLike) -> dict[str, Any] | None:
    """The results folder's manifest.json, or None when it has none."""
    if not (Path(results) / MANIFEST).exists():
        return None
    try:
        return read_manifest(results)
    except ResultsError:
        return None


def main(argv: list[str] | None = None) -> int:
    """CLI: draw the figures of a results folder and print their paths."""
    return draw(parse_config(PlotsConfig, argv, "python -m pythia_probe.plots"))


def draw(cfg: PlotsConfig) -> int:
    """The command once its flags are parsed: draw the figures, print their paths."""
    figures = cfg.out or Path(cfg.results) / "plots"
    df = read_results(cfg.results)
    check_folders(cfg.results, with_subfolders(figures))
    check_writable(figures, "--out" if cfg.out else "--results")
    paths = plot_run(df, figures, manifest=run_manifest(
        cfg.results), head_layers=cfg.head_layers or None, paper=True,
        every_metric=not cfg.paper)
    if not paths:
        raise BadInputError(f"nothing to draw for Figures 6 and 7 in {cfg.results}: they need "
                            "embedding cos_post/cos_attn or attention cos_mean/cos_head rows")
    for path in paths:
        print(path)
    return 0
