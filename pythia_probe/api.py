"""The Python API, for notebooks: the sweep as one call that returns its table.

    import pythia_probe as pp
    df = pp.run_sweep(model="EleutherAI/pythia-70m,EleutherAI/pythia-160m", steps="early",
                      out="runs/notebook")
    df = pp.read_results("runs/notebook")        # any results folder
    st = pp.statistics("runs/notebook")           # the statistics a run used (or build some)

:func:`run_sweep` takes the command's flags as keywords (``python -m pythia_probe.sweep
--help``: ``analyses="embedding,attention"``, ``top_k="5000"``, ``suite="pythia"``,
``plots=False``, ...), runs exactly what the command runs (the plan, the same progress display,
resume: a second call scores nothing twice) and returns the tidy table of the asked (model,
step) tasks as written in ``out``. Bad input raises the one-line error the command prints.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from pythia_probe.cli import keywords_argv, parse_configs
from pythia_probe.errors import BadInputError, MissingFileError, ResultsError
from pythia_probe.ranks import from_env
from pythia_probe.results import MANIFEST, read_manifest, read_results
from pythia_probe.stats import CorpusStats
from pythia_probe.summary.table import summary_table
from pythia_probe.sweep import SweepConfig
from pythia_probe.sweep.runner import build_statistics
from pythia_probe.sweep.runner import run as run_parts

__all__ = ["read_results", "run_sweep", "statistics", "summary_table"]

log = logging.getLogger(__name__)


def sweep_config(flags: dict, who: str = "run_sweep") -> tuple[SweepConfig, list[str]]:
    """The command's config from keywords, built as the command builds it (the same parser
    and checks, so the same one-line errors), and the command line they stand for."""
    argv = keywords_argv(SweepConfig, flags, who)
    [fields] = parse_configs([SweepConfig], argv, f"pp.{who}", keywords=True)
    return SweepConfig(**fields), argv


def run_sweep(model: str = "EleutherAI/pythia-1.4b", steps: str = "all",
              stats: str | None = None, out: str | None = None, **flags) -> pd.DataFrame:
    """Sweep ``model`` (one hub id or folder, or several comma-separated) at ``steps`` against
    ``stats`` (a statistics file; default: the paper's recipe, built once and cached) into
    ``out`` (default ``runs/<model>``) and return the table of those tasks. Failed tasks are
    listed in ``out/failed/`` and named in a warning; the rest of the table is returned."""
    cfg, argv = sweep_config({"model": model, "steps": steps, "stats": stats, "out": out,
                              **flags})
    ranks = from_env(cfg.device)
    rc = run_parts(cfg.split(ranks.device), ranks, argv)
    if cfg.dry_run:
        return pd.DataFrame()
    if rc != 0:
        log.warning("some tasks failed: see %s/failed/ (the table holds the others)", cfg.out)
    return _asked(read_results(cfg.out), read_manifest(cfg.out))


def _asked(df: pd.DataFrame, manifest: dict) -> pd.DataFrame:
    """The rows of the run's (model, step) tasks (a folder may hold more from earlier runs)."""
    models = manifest.get("models")
    if not models:
        keep = df["step"].isin(manifest.get("steps") or [])
    else:
        keep = pd.Series(False, index=df.index)
        for name, rec in models.items():
            keep |= (df["model"] == name) & df["step"].isin(rec["steps"])
    return df[keep].reset_index(drop=True)


def statistics(source: str | os.PathLike | None = None, *, model: str | None = None,
               **flags) -> CorpusStats:
    """Corpus statistics: ``source`` a statistics file, or a results folder (the file its run
    used; ``model`` picks one where the models' statistics differ); else built (or read from
    the cache) with the sweep's recipe for ``model``'s tokenizer: the keywords of
    :func:`run_sweep` that shape statistics (``dataset``, ``recipe``, ``docs``, ``min_chars``,
    ``seq_len``, ``top_k``, ``tokenizer``, ``device``)."""
    if source is not None:
        return CorpusStats.load(_statistics_file(Path(source), model))
    cfg, _ = sweep_config({"model": model or SweepConfig.model, "out": "unused", **flags},
                          "statistics")
    ranks = from_env(cfg.device)
    [path] = build_statistics(cfg.split(ranks.device), ranks)
    return CorpusStats.load(path)


def _statistics_file(source: Path, model: str | None) -> Path:
    """``source`` itself (a statistics file), or the file a results folder's run used."""
    if not source.exists():
        raise MissingFileError(f"{source}: no such statistics file or results folder")
    if source.is_dir() and not (source / MANIFEST).is_file():
        raise BadInputError(f"{source} is a folder without {MANIFEST}: give a statistics file "
                            "or a sweep's results folder")
    if not source.is_dir():
        return source
    m = read_manifest(source)
    by_model = m.get("statistics_by_model")
    if isinstance(by_model, dict) and model not in by_model:
        raise BadInputError(f"{source}: the models' statistics differ; give model= one of "
                            f"{sorted(by_model)}")
    entry = by_model[model] if isinstance(by_model, dict) else m
    rec = entry.get("statistics") if isinstance(entry, dict) else None
    file = rec.get("file") if isinstance(rec, dict) else None
    if not isinstance(file, str):
        raise ResultsError(f"{source / MANIFEST} names no statistics file (statistics.file): "
                           "not a sweep's results folder; give the statistics file itself")
    return Path(file)
