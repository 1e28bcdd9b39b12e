"""The sweep's last stage: a checked plan executed as it is (under the folder's lock of
:func:`.manifest.folder_lock`): the run's manifest, the revision ledger, the targets prepared
once per statistics file (held as the plan says), then this process's share of the (model,
step) tasks (:mod:`.tasks`: ranks, claims, one shard each), and at the end, once every share
is done, the run's status, the summary and the figures (:mod:`.report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from pythia_probe.planner.sweep import SweepPlan
from pythia_probe.progress import JobProgress, Stage
from pythia_probe.ranks import Ranks
from pythia_probe.sweep.claims import Claims, clear_claims
from pythia_probe.sweep.layout import CLAIMS, Layout
from pythia_probe.sweep.manifest import (
    RunRecord,
    models_record,
    run_checkpoints,
    run_choices,
    run_stats_id,
    run_steps,
    write_revisions,
)
from pythia_probe.sweep.prepare import Prepared
from pythia_probe.sweep.report import finish, pending_line
from pythia_probe.sweep.scoring import prepare_scorer
from pythia_probe.sweep.source import load_weights, stream, tensor_names
from pythia_probe.sweep.statistics import LazyStats
from pythia_probe.sweep.tasks import ShardInfo, Work, run_step, share, sweep_share


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
        write_revisions(out, runs)
    infos = {r.source.model: ShardInfo(out, r.name, run_id, r.status, run.layout,
                                       record.run_key) for r in runs}
    try:
        scorers = _scorers(run, ranks)
        mine = share(run.groups, *launch.shard)
        with Claims(Path(out) / CLAIMS, run_id) as claims:
            work = Work(infos, scorers, {r.source.model: r.source for r in runs},
                        tensor_names(run.job.needs), parts.scoring.analyses,
                        parts.plan.retries, parts.source.prefetch,
                        min((d.limit for d in run.plan.downloads.values()
                             if d.limit is not None), default=None), claims, ranks.rank)
            outcome = sweep_share(mine, work, run_step, stream, load_weights,
                                  _bar(mine, work, launch.progress))
    except KeyboardInterrupt:
        record.end("interrupted", "stopped by a signal (SIGINT/SIGTERM); rerun to resume")
        raise
    except BaseException as err:
        record.fail(err)
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
        clear_claims(layout.folders(CLAIMS) if complete else [], parts.output.out)
    return status
