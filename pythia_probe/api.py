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

import dataclasses
import logging
import os
from pathlib import Path

import pandas as pd

from pythia_probe.errors import BadInputError
from pythia_probe.ranks import from_env
from pythia_probe.results import MANIFEST, read_manifest, read_results
from pythia_probe.stats import CorpusStats
from pythia_probe.summary import summary_table
from pythia_probe.sweep import SweepConfig
from pythia_probe.sweep.runner import build_statistics
from pythia_probe.sweep.runner import run as run_parts

__all__ = ["read_results", "run_sweep", "statistics", "summary_table"]

log = logging.getLogger(__name__)
_TUPLES = {f.name for f in dataclasses.fields(SweepConfig) if "tuple" in str(f.type)}


def _config(flags: dict) -> SweepConfig:
    """The command's config from keywords (a comma-separated string or a list where the flag
    takes a list)."""
    unknown = sorted(set(flags) - {f.name for f in dataclasses.fields(SweepConfig)})
    if unknown:
        raise BadInputError(f"run_sweep got unknown flags {unknown}; valid: the fields of "
                            "`python -m pythia_probe.sweep --help` with _ for -")
    for name in _TUPLES & set(flags):
        if isinstance(flags[name], str):
            flags[name] = tuple(p.strip() for p in flags[name].split(",") if p.strip())
    return SweepConfig(**flags)


def _argv(flags: dict) -> list[str]:
    """The command line a run_sweep call stands for (recorded in the manifest)."""
    argv = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            argv += [flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    return argv


def run_sweep(model: str = "EleutherAI/pythia-1.4b", steps: str = "all",
              stats: str | None = None, out: str | None = None, **flags) -> pd.DataFrame:
    """Sweep ``model`` (one hub id or folder, or several comma-separated) at ``steps`` against
    ``stats`` (a statistics file; default: the paper's recipe, built once and cached) into
    ``out`` (default ``runs/<model>``) and return the table of those tasks. Failed tasks are
    listed in ``out/failed/`` and named in a warning; the rest of the table is returned."""
    flags = {"model": model, "steps": steps, "stats": stats, "out": out, **flags}
    cfg = _config(dict(flags))
    ranks = from_env(cfg.device)
    rc = run_parts(cfg.split(ranks.device), ranks, _argv(flags))
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
    cfg = _config({"model": model or SweepConfig.model, "out": "unused", **flags})
    ranks = from_env(cfg.device)
    [path] = build_statistics(cfg.split(ranks.device), ranks)
    return CorpusStats.load(path)


def _statistics_file(source: Path, model: str | None) -> Path:
    if not (source / MANIFEST).is_file():
        return source
    m = read_manifest(source)
    by_model = m.get("statistics_by_model")
    if by_model is None:
        return Path(m["statistics"]["file"])
    if model not in by_model:
        raise BadInputError(f"{source}: the models' statistics differ; give model= one of "
                            f"{sorted(by_model)}")
    return Path(by_model[model]["statistics"]["file"])
