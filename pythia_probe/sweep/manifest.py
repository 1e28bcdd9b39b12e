"""The record of a sweep in ``OUT/manifest.json``: which run (its id, reused on resume), the
configuration as used, the choices made (vocabulary, statistics, targets), and how it ended:
``running``, ``complete``, ``failed`` (with the reason), ``interrupted`` (SIGINT/SIGTERM; rerun
to resume) or ``incomplete`` (this process's share is done, other shards' steps are not).
Rank 0 writes it; the other ranks read the run id from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pythia_probe.errors import MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.results import LAYERS, MANIFEST, new_run_id, read_manifest, write_manifest


def check_resume(out: str, identity: dict, stats_id: str) -> str | None:
    """Run id of a compatible earlier run in ``out`` (None if fresh); refuse a different one."""
    if not (Path(out) / MANIFEST).exists():
        return None
    old = read_manifest(out)
    want = {**identity, "stats_id": stats_id}
    have = {k: old.get("config", {}).get(k) for k in want}
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

    def _extra(self, **more) -> dict:
        return {"steps": self.steps, "checkpoints": self.checkpoints, "layers": LAYERS,
                "world": self.ranks.world, **self.choices, **more}

    def start(self, identity: dict, stats_id: str, checkpoints) -> str:
        """Rank 0 picks the run id (a compatible earlier run's, else new) and writes the
        manifest with status running; every rank returns the id."""
        if self.ranks.is_main:
            self.run_id = check_resume(self.out, identity, stats_id) or new_run_id()
            self.checkpoints = checkpoints() if checkpoints is not None else None
            write_manifest(self.out, self.config, argv=self.argv, run_id=self.run_id,
                           started=self.started, extra=self._extra(status="running"))
        self.ranks.barrier()
        if not self.ranks.is_main:
            manifest = Path(self.out) / MANIFEST
            self.run_id = read_manifest(self.out)["run_id"] if manifest.exists() else \
                new_run_id()
        return self.run_id

    def end(self, status: str, reason: str | None, failed=()) -> None:
        """Rank 0 records how the run ended."""
        if not self.ranks.is_main:
            return
        write_manifest(self.out, self.config, argv=self.argv, started=self.started,
                       run_id=self.run_id, extra=self._extra(status=status, reason=reason,
                                                             failed_steps=list(failed)))
