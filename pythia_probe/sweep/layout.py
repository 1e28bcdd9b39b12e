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
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pythia_probe.errors import MismatchError
from pythia_probe.results import NOT_SHARDS, ResultsError, named_files, read_shard, shard_run

SHARDS, FAILED, CLAIMS = "shards", "failed", "claims"


@dataclass(frozen=True)
class Layout:
    """Where the files of each (model, step) task go; ``models``: the table's model names;
    ``run_key``: the run's content key where the plan knows it (:meth:`done` then counts
    another run's shard as not done, as the tasks do)."""

    out: str
    models: tuple[str, ...] = ()
    run_key: str | None = None

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
             stats_id: str | None = None, run_key: str | None = None) -> bool:
        """A valid shard of the task (for ``stats_id``) holding rows of every analysis asked,
        written by a run of this ``run_key`` (the same settings: one shape per table) where it
        says; an empty, truncated, partial or other run's shard is recomputed."""
        path = self.shard(model, step)
        run_key = self.run_key if run_key is None else run_key
        if run_key is not None and (shard_run(path) or {}).get("run_key", run_key) != run_key:
            return False
        return _valid(path, step, analyses, stats_id, None if len(self.models) <= 1 else model)

    def check_strays(self) -> None:
        """Refuse up front tables below OUT that are no task's shard here (another run's shard
        dropped in, a copy of shards/, a folder where a shard goes): the folder's table would
        count them twice or mix runs (:func:`~pythia_probe.results.read_results` refuses it)."""
        root, folders = Path(self.out), {str(m).replace("/", "--") for m in self.models}
        strays = [p.relative_to(root) for p in sorted(root.rglob("*.parquet"))
                  if p.name not in NOT_SHARDS and not (p.is_file() and _in_place(
                      p.relative_to(root).parts, folders))]
        if strays:
            raise MismatchError(f"{root} holds tables that are not this run's shards "
                                f"({named_files(strays)}): "
                                f"the folder's table would mix them in; move them out of {root}")

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


def _in_place(parts: tuple[str, ...], folders: set[str]) -> bool:
    """``shards/step{N}.parquet`` (one model) or ``shards/<model>/step{N}.parquet``."""
    inner = parts[1:-1]
    return parts[0] == SHARDS and re.fullmatch(r"step\d+\.parquet", parts[-1]) is not None \
        and (inner == () if len(folders) <= 1 else len(inner) == 1 and inner[0] in folders)


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
