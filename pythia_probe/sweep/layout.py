"""The results folder of a sweep, and which of its (model, step) tasks are done.

    OUT/manifest.json                 the run: argv, configuration as used, choices, status
    OUT/revisions.parquet             the revision ledger of every model (before any weight)
    OUT/shards/[<model>/]step{N}.parquet  one shard per task, written atomically: the folder
                                      is the table (no merge step)
    OUT/failed/[<model>/]step{N}.json a task that failed after its retries (error, traceback)
    OUT/claims/[<model>/]step{N}.json a task being scored now, by whom (:mod:`.claims`)
    OUT/summary.parquet, OUT/plots/   written once every task is done (:mod:`.report`)
    OUT/.lock                         held while runs write the folder (shared by the shards
                                      of one run, :class:`~pythia_probe.fileio.FolderLock`)

The unit of work is one (model, step) task. A folder of one model keeps the flat
``shards/step{N}.parquet`` it always had; a folder of several models has one sub-folder per
model (``EleutherAI--pythia-70m``, the hub id with ``/`` as ``--``). A task counts as done only if
its shard reads back valid, for this step and model (and stats_id), with rows of every asked
analysis.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pythia_probe.results import ResultsError, read_shard

SHARDS, FAILED, CLAIMS = "shards", "failed", "claims"


@dataclass(frozen=True)
class Layout:
    """Where the files of each (model, step) task go; ``models``: the table's model names."""

    out: str
    models: tuple[str, ...] = ()

    def _folder(self, kind: str, model: str | None) -> Path:
        root = Path(self.out) / kind
        if len(self.models) <= 1:
            return root
        return root / str(model).replace("/", "--")

    def folders(self, kind: str) -> list[Path]:
        """Every folder of ``kind`` the run writes, each model's before the top one."""
        top = Path(self.out) / kind
        return [self._folder(kind, m) for m in self.models if len(self.models) > 1] + [top]

    def shard(self, model: str | None, step: int) -> Path:
        return self._folder(SHARDS, model) / f"step{step}.parquet"

    def failure(self, model: str | None, step: int) -> Path:
        return self._folder(FAILED, model) / f"step{step}.json"

    def claim(self, model: str | None, step: int) -> Path:
        return self._folder(CLAIMS, model) / f"step{step}.json"

    def done(self, model: str | None, step: int, analyses: Iterable[str],
             stats_id: str | None = None) -> bool:
        """A valid shard of the task (for ``stats_id``) holding rows of every analysis asked;
        an empty, truncated or partial shard is recomputed."""
        return _valid(self.shard(model, step), step, analyses, stats_id,
                      None if len(self.models) <= 1 else model)

    def failed(self) -> list[tuple[str | None, int]]:
        """(model, step) of every failure record in ``OUT/failed/`` (files there that are not
        the tool's records are no failures)."""
        root = Path(self.out) / FAILED
        if len(self.models) <= 1:
            model = self.models[0] if self.models else None
            return [(model, s) for s in _steps(root, model)]
        by_folder = {m.replace("/", "--"): m for m in self.models}
        return [(by_folder[d.name], s) for d in sorted(root.glob("*")) if d.name in by_folder
                for s in _steps(d, by_folder[d.name])]


def _steps(folder: Path, model: str | None) -> list[int]:
    return sorted(int(p.stem[4:]) for p in folder.glob("step*.json") if p.stem[4:].isdigit()
                  and p.is_file() and failure_proof(model, int(p.stem[4:]))(p.read_bytes()))


def failure_proof(model: str | None, step: int) -> Callable[[bytes], bool]:
    """Whether some bytes are the failure record the tool wrote for (model, step) (any model's
    when ``model`` is None)."""
    def ours(data: bytes) -> bool:
        try:
            seen = json.loads(data)
        except ValueError:
            return False
        return (isinstance(seen, dict) and seen.get("step") == step and "traceback" in seen
                and model in (None, seen.get("model")))
    return ours


def _valid(path: Path, step: int, analyses: Iterable[str], stats_id: str | None,
           model: str | None) -> bool:
    if not path.is_file():
        return False
    try:
        df = read_shard(path)
    except ResultsError:
        return False
    if df.empty or not (df["step"] == step).all():
        return False
    if model is not None and not (df["model"] == model).all():
        return False
    if stats_id is not None and not (df["stats_id"] == stats_id).all():
        return False
    return set(analyses) <= set(df["analysis"])


# ---- one model's folder, as before (kept for callers of the flat layout) -----------------------
def shard_path(out: str | os.PathLike, step: int) -> Path:
    return Layout(str(out)).shard(None, step)


def failure_path(out: str | os.PathLike, step: int) -> Path:
    return Layout(str(out)).failure(None, step)


def failed_steps(out: str | os.PathLike) -> list[int]:
    """Steps with a failure record in ``OUT/failed/`` (a folder of one model)."""
    return [s for _, s in Layout(str(out)).failed()]


def shard_done(out: str | os.PathLike, step: int, analyses: Iterable[str],
               stats_id: str | None = None) -> bool:
    return Layout(str(out)).done(None, step, analyses, stats_id)


def split_steps(steps: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The steps process ``rank`` of ``world_size`` handles (round-robin, disjoint, complete)."""
    return list(steps[rank::world_size])
