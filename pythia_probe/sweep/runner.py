"""The sweep as a library, in three typed stages: :mod:`.prepare` (the models, their steps,
configs, tokenizers and statistics, nothing downloaded but config and tokenizer files) ->
:mod:`pythia_probe.planner` (the plan, checked against the device's memory and the disk; printed,
and the dry run stops here) -> :mod:`.execute` (the folder's lock, the statistics builds if
needed, the targets, this process's share of the (model, step) tasks, the summary).

:func:`run` takes the configuration's parts (:class:`~pythia_probe.sweep.config.SweepParts`)
and the process group (:class:`~pythia_probe.ranks.Ranks`, built by the entry point); each
component gets only its part.
"""

from __future__ import annotations

from pathlib import Path

from pythia_probe.analysis import get_analyses
from pythia_probe.fileio import check_folders, with_subfolders
from pythia_probe.planner.rates import measure
from pythia_probe.planner.sweep import plan
from pythia_probe.ranks import Ranks
from pythia_probe.sweep.config import SweepParts
from pythia_probe.sweep.execute import Launch, Run, execute, job_progress
from pythia_probe.sweep.layout import CLAIMS, FAILED, SHARDS, Layout
from pythia_probe.sweep.manifest import folder_lock, planned_run_key
from pythia_probe.sweep.prepare import Prepared, build_missing, downloads, prepare
from pythia_probe.sweep.report import plan_lines
from pythia_probe.sweep.source import open_source, revision_ledger


def run(parts: SweepParts, ranks: Ranks | None = None, argv: list[str] | None = None, *,
        shard: tuple[int, int] | None = None) -> int:
    """Validate everything, then sweep this process's share of the tasks; 0 if every task
    succeeded, else 1. ``shard`` (index, count): which share (default: ``--shard`` or the
    Slurm array task, combined with this rank of ``ranks``: :meth:`Ranks.share`)."""
    ranks = ranks or Ranks(device=parts.scoring.device)
    analyses = get_analyses(list(parts.scoring.analyses))
    sources = [open_source(parts.source, m) for m in parts.source.models]
    try:
        job = prepare(parts, analyses, sources)
        return _run(job, ranks, argv, shard or ranks.share(parts.plan.share))
    finally:
        for source in sources:
            source.close()  # leases of planning fetches (config, tokenizer) released


def build_statistics(parts: SweepParts, ranks: Ranks | None = None) -> list[Path]:
    """The statistics files the sweep of ``parts`` scores against (one per tokenizer), built
    now where missing, as :func:`run` would; nothing else is done."""
    ranks = ranks or Ranks(device=parts.scoring.device)
    sources = [open_source(parts.source, m) for m in parts.source.models]
    try:
        job = prepare(parts, get_analyses(list(parts.scoring.analyses)), sources)
        return list(build_missing(job, ranks, None))
    finally:
        for source in sources:
            source.close()


def _run(job: Prepared, ranks: Ranks, argv, shard) -> int:
    """Plan the prepared ``job`` (checked where the statistics' non-zeros are known: up front,
    else right after their build, before any weight is fetched), print it, then execute it."""
    parts, runs = job.parts, job.runs
    planned = plan(job).check()
    for r in runs:
        r.ledger = revision_ledger(r.source, r.steps, r.name)  # metadata only, before weights
    layout = Layout(parts.output.out, tuple(r.name for r in runs),
                    planned_run_key(parts.identity(), runs))  # another run's shard: not done
    layout.check_strays()
    groups, fetches = downloads(job, layout)
    planned = planned.with_downloads(fetches)
    if ranks.is_main:
        rates = measure(parts.scoring.device, parts.scoring.torch_dtype)
        print("\n".join(plan_lines(job, planned, rates, shard)), flush=True)
    planned.check_disk()
    check_folders(parts.output.out, [f for kind in (SHARDS, FAILED, CLAIMS) for f in
                                     layout.folders(kind)]
                  + (with_subfolders(parts.output.figures) if parts.output.plots else []))
    if parts.plan.dry_run:
        return 0
    with folder_lock(job, argv, ranks) as run_id:
        progress = job_progress(job, ranks)
        try:
            lazies = build_missing(job, ranks, progress)
            planned = planned.counted(lambda p: lazies[p].parts_nnz()).check()  # no weight yet
            return execute(Run(job, planned, layout, groups, lazies),
                           Launch(ranks, shard, run_id, progress, argv))
        finally:
            if progress is not None:
                progress.close()
