"""The record of a sweep in ``OUT/manifest.json``: which run (its id, reused on resume), the
configuration as used, the choices made (vocabulary, statistics, targets), and how it ended:
``running``, ``complete``, ``failed`` (with the reason), ``interrupted`` (SIGINT/SIGTERM; rerun
to resume) or ``incomplete`` (this process's share is done, other shards' steps are not).
Rank 0 writes it; the other ranks read the run id from it. The shards of one run on several
machines share one run id (the first one's, handed on through the folder's lock) and write
their end status under the manifest's own lock (:meth:`RunRecord.locked`), from what the
folder holds then, so the last one to finish says ``complete``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from pythia_probe.errors import FolderLockedError, MismatchError, ResultsError, user_message
from pythia_probe.fileio import FolderLock
from pythia_probe.hub import write_ledger
from pythia_probe.ranks import Ranks
from pythia_probe.results import LAYERS, MANIFEST, new_run_id, read_manifest, write_manifest
from pythia_probe.sweep.prepare import Prepared

MANIFEST_WAIT = 60.0  # seconds a shard waits for another one writing its end status
REVISIONS = "revisions.parquet"  # OUT/revisions.parquet: the revision ledger of the run


class _ManifestLock(FolderLock):
    NAME = ".manifest.lock"


def recorded(config: dict, key: str):
    """An identity field as an earlier run recorded it; a manifest from before ``intervals``
    was part of the identity says it under ``scoring`` (and before that, had none)."""
    if key == "intervals" and key not in config:
        return config.get("scoring", {}).get("intervals", False)
    return config.get(key)


def previous_run_id(out: str, identity: dict) -> str:
    """The run id a launch proposes: the folder's earlier run's when its identity is this one
    (a resume), else a new one (a different earlier run is refused later, naming the
    difference)."""
    try:
        old = read_manifest(out) if (Path(out) / MANIFEST).exists() else None
    except ResultsError:
        old = None  # refused with its one line when the run starts
    if old and all(recorded(old.get("config", {}), k) == v for k, v in identity.items()):
        return old.get("run_id") or new_run_id()
    return new_run_id()


def run_key(identity: dict, stats_id) -> str:
    """The run's content key: what a resume must match (:func:`check_resume`), hashed. Every
    shard carries it, so a folder tells its own shards from another run's."""
    text = json.dumps({**identity, "stats_id": stats_id}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_resume(out: str, identity: dict, stats_id: str) -> str | None:
    """Run id of a compatible earlier run in ``out`` (None if fresh); refuse a different one."""
    if not (Path(out) / MANIFEST).exists():
        return None
    old = read_manifest(out)
    want = {**identity, "stats_id": stats_id}
    have = {k: recorded(old.get("config", {}), k) for k in want}
    if have != want:
        diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
        raise MismatchError(f"{out} holds a different run ({diff}: old, new); choose a new "
                            "--out or the same settings to resume")
    return old.get("run_id")


@dataclass
class RunRecord:
    """One run's manifest: written when the run starts and again when it ends."""

    out: str
    config: dict
    argv: list[str] | None
    steps: list[int]
    choices: dict
    ranks: Ranks
    run_id: str | None = None
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    checkpoints: dict | None = None
    models: dict | None = None  # several models: each one's steps, lacking steps, stats_id
    run_key: str | None = None  # the content key (:func:`run_key`), set by start

    def _extra(self, **more) -> dict:
        models = {} if self.models is None else {"models": self.models}
        return {"run_key": self.run_key, "steps": self.steps, "checkpoints": self.checkpoints,
                "layers": LAYERS,
                "world": self.ranks.world, **models, **self.choices, **more}

    def start(self, identity: dict, stats_id, checkpoints, run_id: str | None = None) -> str:
        """Rank 0 checks the folder holds no other run, takes the run id (``run_id``: the one
        the shards share; else a compatible earlier run's, else new) and writes the manifest
        with status running; every rank returns the id."""
        self.run_key = run_key(identity, stats_id)
        if self.ranks.is_main:
            earlier = check_resume(self.out, identity, stats_id)
            self.run_id = run_id or earlier or new_run_id()
            self.checkpoints = checkpoints() if checkpoints is not None else None
            write_manifest(self.out, self.config, argv=self.argv, run_id=self.run_id,
                           started=self.started, extra=self._extra(status="running"))
        self.ranks.barrier()
        if not self.ranks.is_main:
            manifest = Path(self.out) / MANIFEST
            self.run_id = read_manifest(self.out)["run_id"] if manifest.exists() else \
                new_run_id()
        return self.run_id

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Rank 0 holds the manifest's own lock inside (shards ending together take turns)."""
        if not self.ranks.is_main:
            yield
            return
        lock = _ManifestLock(self.out, {"what": "manifest end"})
        deadline = time.monotonic() + MANIFEST_WAIT
        while True:
            try:
                lock.acquire()
                break
            except FolderLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            yield
        finally:
            lock.release()

    def end(self, status: str, reason: str | None, failed=()) -> None:
        """Rank 0 records how the run ended."""
        if not self.ranks.is_main:
            return
        write_manifest(self.out, self.config, argv=self.argv, started=self.started,
                       run_id=self.run_id, extra=self._extra(status=status, reason=reason,
                                                             failed_steps=list(failed)))

    def fail(self, err: BaseException) -> None:
        """Rank 0 records the run as failed with ``err``'s one line."""
        self.end("failed", user_message(err) or f"{type(err).__name__}: {err}")


# ---- what the manifest says about the models of a run ------------------------------------
def run_stats_id(runs, lazies) -> str | dict[str, str]:
    """The run's stats_id: one, or one per model where the models' statistics differ."""
    ids = {r.name: lazies[r.stats.path].stats_id for r in runs}
    return next(iter(ids.values())) if len(set(ids.values())) == 1 else ids


def planned_run_key(identity: dict, runs) -> str | None:
    """The run's content key as the plan knows it (:func:`run_key` of :func:`run_stats_id`),
    or None while some model's statistics are not built yet (their stats_id unknown)."""
    ids = {r.name: r.stats.stats_id for r in runs}
    if not ids or None in ids.values():
        return None
    return run_key(identity, next(iter(ids.values())) if len(set(ids.values())) == 1 else ids)


def run_steps(runs) -> list[int]:
    return sorted({s for r in runs for s in r.steps})


def models_record(runs, lazies) -> dict | None:
    if len(runs) == 1:
        return None
    return {r.name: {"model": r.model, "steps": r.steps, "lacks": r.lacks,
                     "stats_id": lazies[r.stats.path].stats_id} for r in runs}


def run_choices(parts, runs, lazies, targets) -> dict:
    """The manifest's record of what was chosen (per statistics file when the models differ)."""
    by_file = {}
    for r in runs:
        held = targets[r.stats.path]
        meta = lazies[r.stats.path].meta
        by_file.setdefault(r.stats.path, {
            "targets_choice": {"held": held.mode, "reason": held.why,
                               "together": held.together},
            "vocabulary": {"rows": r.stats.rows, "reason": r.stats.vocab_reason},
            "statistics": {**r.stats.record(), "stats_id": meta["stats_id"]}})
    choices = list(by_file.values())
    return choices[0] if len(choices) == 1 else {
        "statistics_by_model": {r.name: by_file[r.stats.path] for r in runs}}


def run_checkpoints(runs):
    """The manifest's commits and file hashes (hub models), computed by rank 0 only."""
    hub = [r for r in runs if r.source.local_dir is None]
    if not hub:
        return None
    if len(runs) == 1:
        return lambda: hub[0].source.manifest(hub[0].source.resolve(hub[0].steps))
    return lambda: {r.name: r.source.manifest(r.source.resolve(r.steps)) for r in hub}


def write_revisions(out: str, runs) -> None:
    """OUT/revisions.parquet: the revision ledger of the run (every model's steps)."""
    write_ledger(pd.concat([r.ledger for r in runs], ignore_index=True), Path(out) / REVISIONS)


def _lock_key(parts, runs) -> str:
    """What makes two processes shards of one run: the identity and the statistics."""
    ident = {**parts.identity(), "stats": sorted({str(r.stats.path) for r in runs})}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def folder_lock(job: Prepared, argv, ranks: Ranks) -> Iterator[str]:
    """Rank 0 holds the output folder's lock for the whole launch, shared with the other
    shards of this run (same identity and statistics) and refused to any other run; every
    rank learns whether it got it, and the run id (the first shard's, or the folder's earlier
    compatible run's)."""
    parts = job.parts
    out = parts.output.out
    what = "sweep " + " ".join(argv if argv is not None else [])
    lock = FolderLock(out, {"what": what[:300], "since": datetime.now(timezone.utc).isoformat(),
                            "run_id": previous_run_id(out, parts.identity())},
                      key=_lock_key(parts, job.runs))
    err, run_id = None, None
    if ranks.is_main:
        try:
            run_id = lock.acquire().info.get("run_id")
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then raised
            err = e
    said = ranks.gather(None if err is None else user_message(err) or str(err))[0]
    if err is not None:
        raise err
    if said:
        raise FolderLockedError(said)
    try:
        yield run_id
    finally:
        lock.release()
