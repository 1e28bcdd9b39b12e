"""The sweep's last stage: a checked plan executed as it is. The output folder's lock (shared
by the shards of one run), the run's manifest, the revision ledger, the targets prepared once
per statistics file (held as the plan says), then this process's share of the (model, step)
tasks (:mod:`.tasks`: ranks, claims, one shard each), and at the end, once every share is done,
the run's status, the summary and the figures (:mod:`.report`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from tqdm import tqdm

from pythia_probe.analysis import combined_needs
from pythia_probe.analysis.targets import statistic_of
from pythia_probe.errors import FolderLockedError, user_message
from pythia_probe.fileio import FolderLock, empty_only, remove
from pythia_probe.hub import write_ledger
from pythia_probe.planner.sweep import SweepPlan
from pythia_probe.progress import JobProgress, Stage
from pythia_probe.ranks import Ranks
from pythia_probe.results import make_rows, write_shard
from pythia_probe.sweep.claims import Claims
from pythia_probe.sweep.held import prepare_scale, prepare_targets
from pythia_probe.sweep.layout import CLAIMS, Layout
from pythia_probe.sweep.manifest import (
    RunRecord,
    models_record,
    previous_run_id,
    run_checkpoints,
    run_choices,
    run_stats_id,
    run_steps,
)
from pythia_probe.sweep.prepare import Prepared
from pythia_probe.sweep.report import finish, pending_line
from pythia_probe.sweep.scoring import Scorer, build_scorer
from pythia_probe.sweep.source import load_weights, stream, tensor_names, to_weights
from pythia_probe.sweep.statistics import LazyStats
from pythia_probe.sweep.tasks import ShardInfo, Work, share, sweep_share

log = logging.getLogger(__name__)
REVISIONS = "revisions.parquet"  # OUT/revisions.parquet: the revision ledger of the run


class Run(NamedTuple):
    """What the stage executes: the prepared job, its checked plan, the output folder's layout,
    the download plan's groups of identical weights (the unit of a share) and each statistics
    file, read (by path)."""

    job: Prepared
    plan: SweepPlan
    layout: Layout
    groups: list
    lazies: dict[Path, LazyStats]


class Launch(NamedTuple):
    """This process: its ranks, its share (index, count), the run id the folder's lock gave,
    the job's display (rank 0) and the command line the manifest records."""

    ranks: Ranks
    shard: tuple[int, int]
    run_id: str | None
    progress: JobProgress | None
    argv: list[str] | None


def run_step(loaded, step: int, scorer: Scorer, where: ShardInfo) -> Path:
    """Score one loaded checkpoint and write its shard."""
    sc = scorer.scoring
    weights = to_weights(loaded, sc.device, sc.torch_dtype)
    rows = scorer.rows(loaded.config, weights)
    df = make_rows(rows, model=where.model, step=step, stats_id=scorer.stats_id,
                   dtype=sc.dtype, run_id=where.run_id, revision_status=where.status.get(step))
    return write_shard(df, where.shard(step), where.run)


def prepare_scorer(parts, analyses: list, lazy: LazyStats, ranks: Ranks,
                   together: bool = True) -> Scorer:
    """Targets prepared once (their norms cached by stats_id) and shared by every step;
    rank 0 builds a missing cache, the others then reuse it (``together``: the plan's
    :class:`~pythia_probe.planner.sweep.Held`)."""
    needs = combined_needs(analyses)
    names, progress = held_targets(needs, lazy), parts.output.progress and ranks.is_main
    for turn in (True, False):  # rank 0 first (it builds missing caches), then the others
        if ranks.is_main == turn:
            targets = prepare_targets(lazy, names, parts.scoring, progress and turn)
            scale = prepare_scale(lazy, names, parts.scoring, together, progress and turn,
                                  needs.raw)
        if turn:
            ranks.barrier()
    return build_scorer(parts.scoring, analyses, needs, lazy, targets, scale)


def held_targets(needs, lazy: LazyStats) -> list[str]:
    """The needed targets the statistics can give; a missing one (QbarHeadT of statistics
    built before QbarHead existed) is left out with one warning naming the rows it costs."""
    names = [n for n in needs.targets if lazy.holds(statistic_of(n))]
    for n in (m for m in needs.targets if m not in names):
        log.warning("statistics %s hold no %s (built before it existed): no %s rows; rebuild "
                    "them for those", lazy.stats_id, statistic_of(n),
                    "cos_head_authors" if n == "QbarHeadT" else n)
    return names


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


def job_progress(job: Prepared, ranks: Ranks) -> JobProgress | None:
    """One display across the statistics (when they are built now) and the sweep (rank 0)."""
    if not job.parts.output.progress or not ranks.is_main:
        return None
    unbuilt = next((r.stats for r in job.runs if not r.stats.built), None)
    stages = [] if unbuilt is None else [
        Stage("statistics pass 1", unbuilt.recipe.docs * (unbuilt.recipe.seq_len + 1), "tok"),
        Stage("statistics pass 2", None, "tok")]
    return JobProgress(stages + [Stage("sweep", sum(len(r.steps) for r in job.runs), "step")])


def execute(run: Run, launch: Launch) -> int:
    """Record the run, then score this process's share of its tasks; 0 if every task
    succeeded, else 1."""
    parts, runs, ranks = run.job.parts, run.job.runs, launch.ranks
    held = {path: s.held for path, s in run.plan.stats.items()}
    record = RunRecord(parts.output.out, {**parts.record(), "stats_id": run_stats_id(
                       runs, run.lazies)}, launch.argv, run_steps(runs),
                       run_choices(parts, runs, run.lazies, held), ranks,
                       models=models_record(runs, run.lazies))
    out = parts.output.out
    run_id = record.start(parts.identity(), record.config["stats_id"], run_checkpoints(runs),
                          launch.run_id)  # refuses a folder of another run before any write
    if ranks.is_main:
        write_ledger(pd.concat([r.ledger for r in runs], ignore_index=True), Path(out) / REVISIONS)
    infos = {r.source.model: ShardInfo(out, r.name, run_id, r.status, run.layout,
                                       record.run_key) for r in runs}
    try:
        scorers = _scorers(run, ranks)
        mine = share(run.groups, *launch.shard)
        with Claims(Path(out) / CLAIMS, run_id) as claims:
            work = Work(infos, scorers, {r.source.model: r.source for r in runs},
                        tensor_names(combined_needs(run.job.analyses)), parts.scoring.analyses,
                        parts.plan.retries, parts.source.prefetch,
                        min((d.limit for d in run.plan.downloads.values()
                             if d.limit is not None), default=None), claims, ranks.rank)
            outcome = sweep_share(mine, work, run_step, stream, load_weights,
                                  _bar(mine, work, launch.progress))
    except KeyboardInterrupt:
        record.end("interrupted", "stopped by a signal (SIGINT/SIGTERM); rerun to resume")
        raise
    except BaseException as err:
        record.end("failed", user_message(err) or f"{type(err).__name__}: {err}")
        raise
    ranks.barrier()
    status = _finish_record(run, scorers, record)
    if launch.progress is not None:
        launch.progress.close()
    _report(outcome, len(runs) > 1, ranks)
    if ranks.is_main:
        print("\n".join(finish(parts.output) if status != "incomplete" else
                        [pending_line(out)]), flush=True)
    return 1 if outcome.failed else 0


def _report(outcome, several: bool, ranks: Ranks) -> None:
    print(f"rank {ranks.rank}: {len(outcome.done)} steps done, {len(outcome.skipped)} already "
          f"done, {len(outcome.failed)} failed" + (f", {len(outcome.elsewhere)} being scored "
                                                   "elsewhere" if outcome.elsewhere else "")
          + "".join(f"\n  {t.model} step {t.step}: {m}" if several else
                    f"\n  step {t.step}: {m}" for t, m in outcome.failed.items()), flush=True)


def _scorers(run: Run, ranks: Ranks) -> dict:
    """One Scorer per statistics file, shared by the models that use it (by source model)."""
    built, job = {}, run.job
    for r in job.runs:
        if r.stats.path not in built:
            built[r.stats.path] = prepare_scorer(job.parts, job.analyses, run.lazies[r.stats.path],
                                                 ranks, run.plan.held(r.stats.path).together)
    return {r.source.model: built[r.stats.path] for r in job.runs}


def _bar(groups, work: Work, progress):
    total = sum(1 for g in groups for t in g.tasks if not work.done(t))
    if progress is not None:
        return progress.counter("sweep", total)
    # no job display: --no-progress, or a rank other than 0 (rank 0's is the job's one display)
    return tqdm(total=total, disable=True)


def _finish_record(run: Run, scorers, record: RunRecord) -> str:
    """The run's status from the folder (every share's tasks), recorded under the manifest's
    own lock so that two shards finishing together cannot leave a stale status."""
    parts, runs, layout = run.job.parts, run.job.runs, run.layout
    with record.locked():
        failed = layout.failed()
        complete = all(layout.done(r.name, s, parts.scoring.analyses,
                                   scorers[r.source.model].stats_id, record.run_key)
                       for r in runs for s in r.steps)
        status = "failed" if failed else "complete" if complete else "incomplete"
        reason = (f"{len(failed)} steps failed (see failed/)" if failed else None if complete
                  else "steps of other shards are not done yet")
        record.end(status, reason, [s for _, s in failed] if len(runs) == 1 else
                   [f"{m} step{s}" for m, s in failed])
        for folder in layout.folders(CLAIMS) if complete else []:
            remove(folder, [parts.output.out], empty_only)  # no claim can come any more
    return status
