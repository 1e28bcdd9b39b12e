"""The results folder of a sweep, and which steps in it are done.

    OUT/manifest.json          the run: argv, configuration as used, choices, status
    OUT/shards/step{N}.parquet one shard per step, written atomically (the folder is the table)
    OUT/failed/step{N}.json    a step that failed after its retries (error, traceback)
    OUT/.lock                  held while a run writes the folder (:class:`~fileio.FolderLock`)

A step counts as done only if its shard reads back valid, for this step (and stats_id), with
rows of every asked analysis. The unit of work is one (model, step) task; with one model per
folder today its shard is ``shards/step{N}.parquet``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from pythia_probe.results import ResultsError, read_shard

SHARDS, FAILED = "shards", "failed"


def shard_path(out: str | os.PathLike, step: int) -> Path:
    return Path(out) / SHARDS / f"step{step}.parquet"


def failure_path(out: str | os.PathLike, step: int) -> Path:
    return Path(out) / FAILED / f"step{step}.json"


def failed_steps(out: str | os.PathLike) -> list[int]:
    """Steps with a failure record in ``OUT/failed/``."""
    return sorted(int(p.stem[4:]) for p in (Path(out) / FAILED).glob("step*.json"))


def shard_done(out: str | os.PathLike, step: int, analyses: Iterable[str],
               stats_id: str | None = None) -> bool:
    """A valid shard of ``step`` (and ``stats_id``) holding rows of every analysis asked; an
    empty, truncated or partial shard is recomputed."""
    path = shard_path(out, step)
    if not path.is_file():
        return False
    try:
        df = read_shard(path)
    except ResultsError:
        return False
    if df.empty or not (df["step"] == step).all():
        return False
    if stats_id is not None and not (df["stats_id"] == stats_id).all():
        return False
    return set(analyses) <= set(df["analysis"])


def split_steps(steps: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The steps process ``rank`` of ``world_size`` handles (round-robin, disjoint, complete)."""
    return list(steps[rank::world_size])
