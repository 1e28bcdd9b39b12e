"""The sweep as a library: validate, plan, then score this process's share of the (model, step)
tasks and write one shard each.

:func:`run` takes the configuration's parts (:class:`~pythia_probe.sweep.config.SweepParts`)
and the process group (:class:`~pythia_probe.ranks.Ranks`, built by the entry point); each
component gets only its part. Order: checks that need no network (flags, model names, --steps
grammar), each model's steps and config, the tokenizers and statistics (one build per
tokenizer: every Pythia size shares one), the plan (printed; the dry run stops here), the
revision ledgers, the output folder's lock (shared by the shards of one run), the statistics
builds if needed, the targets, then this process's share of the tasks (:mod:`.tasks`), and at
the end, once every share is done, the summary and the figures (:mod:`.report`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from pythia_probe.analysis import Analysis, combined_needs, get_analyses
from pythia_probe.analysis.targets import statistic_of
from pythia_probe.errors import FolderLockedError, HubError, MissingFileError, user_message
from pythia_probe.fileio import (
    FolderLock,
    check_folders,
    empty_only,
    remove,
    with_subfolders,
)
from pythia_probe.hub import PYTHIA_STEPS, is_pythia, parse_steps, plan_downloads, write_ledger
from pythia_probe.progress import JobProgress, Stage
from pythia_probe.ranks import Ranks
from pythia_probe.results import make_rows, write_shard
from pythia_probe.stats.recipe import ensure
from pythia_probe.stats.result import part_counts
from pythia_probe.sweep.claims import Claims, one_builder
from pythia_probe.sweep.config import SweepParts
from pythia_probe.sweep.layout import CLAIMS, FAILED, SHARDS, Layout
from pythia_probe.sweep.manifest import (
    RunRecord,
    models_record,
    planned_run_key,
    previous_run_id,
    run_checkpoints,
    run_choices,
    run_stats_id,
    run_steps,
)
from pythia_probe.sweep.plan import (
    check_heads,
    check_local,
    check_step_fits,
    checkpoint_plan,
    measure_rates,
    model_downloads,
    plan_lines,
    targets_held,
    total_lines,
)
from pythia_probe.sweep.report import finish, pending_line
from pythia_probe.sweep.scoring import Scorer, build_scorer
from pythia_probe.sweep.source import (
    ModelRun,
    asked_steps,
    disk_limit,
    lacking_lines,
    ledger_lines,
    load_weights,
    model_config,
    offline_advice,
    open_source,
    revision_ledger,
    stream,
    tensor_names,
    timed_tokenizer,
    to_weights,
)
from pythia_probe.sweep.statistics import LazyStats, choose_for_models, read_stats_meta
from pythia_probe.sweep.targets import prepare_scale, prepare_targets
from pythia_probe.sweep.tasks import ShardInfo, Work, share, sweep_share
from pythia_probe.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)
REVISIONS = "revisions.parquet"  # OUT/revisions.parquet: the revision ledger of the run


def run_step(loaded, step: int, scorer: Scorer, where: ShardInfo) -> Path:
    """Score one loaded checkpoint and write its shard."""
    sc = scorer.scoring
    weights = to_weights(loaded, sc.device, sc.torch_dtype)
    rows = scorer.rows(loaded.config, weights)
    df = make_rows(rows, model=where.model, step=step, stats_id=scorer.stats_id,
                   dtype=sc.dtype, run_id=where.run_id, revision_status=where.status.get(step))
    return write_shard(df, where.shard(step), where.run)


def prepare_scorer(parts: SweepParts, analyses: list[Analysis], lazy: LazyStats,
                   ranks: Ranks, together: bool = True) -> Scorer:
    """Targets prepared once (their norms cached by stats_id) and shared by every step;
    rank 0 builds a missing cache, the others then reuse it (``together``: the plan's
    :class:`~pythia_probe.sweep.plan.Held`)."""
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


def run(parts: SweepParts, ranks: Ranks | None = None, argv: list[str] | None = None, *,
        shard: tuple[int, int] | None = None) -> int:
    """Validate everything, then sweep this process's share of the tasks; 0 if every task
    succeeded, else 1. ``shard`` (index, count): which share (default: ``--shard`` or the
    Slurm array task, combined with this rank of ``ranks``: :meth:`Ranks.share`)."""
    ranks = ranks or Ranks(device=parts.scoring.device)
    analyses = get_analyses(list(parts.scoring.analyses))
    sources = [open_source(parts.source, m) for m in parts.source.models]
    try:
        return _run(parts, analyses, sources, ranks, argv,
                    shard or ranks.share(parts.plan.share))
    finally:
        for source in sources:
            source.close()  # leases of planning fetches (config, tokenizer) released


def _models(parts: SweepParts, sources) -> list[ModelRun]:
    """Each model's steps, first revision and config: the hub's (or cache's) listing, nothing
    downloaded but config.json; an unreachable hub is one line saying what to do offline."""
    src = parts.source
    with _offline_advice(parts, sources):
        found = asked_steps(parts.plan.steps, sources)
    runs = []
    for model, source, (steps, lacks) in zip(src.models, sources, found, strict=True):
        if not steps:
            log.warning("%s has none of the asked steps (%s): left out", model, parts.plan.steps)
            continue
        with _offline_advice(parts, [source]):
            first = source.resolve(steps[:1])[0]
        runs.append(ModelRun(model, src.name_of(model), source, steps, lacks, first,
                             model_config(source, first)))
    return runs


@contextlib.contextmanager
def _offline_advice(parts: SweepParts, sources) -> Iterator[None]:
    try:
        yield
    except (HubError, MissingFileError) as err:
        source = sources[0]
        unreachable = isinstance(err, HubError) or source.offline
        if source.local_dir is not None or not unreachable:
            raise  # a local folder's or the hub's own answer (e.g. no such repository)
        if parts.plan.dry_run:
            print("\n".join(line for s in sources for line in _local_lines(parts, s)),
                  flush=True)
        raise offline_advice(source.model, err, source.offline) from err


def _local_lines(parts: SweepParts, source) -> list[str]:
    """What the plan can say without the hub: the asked steps (Pythia's schedule is known) and
    which of them the cache holds (read without the network)."""
    sc, spec, model = parts.scoring, parts.plan.steps, source.model
    asked = parse_steps(spec, PYTHIA_STEPS) if is_pythia(model) else None
    known = f"{len(asked)} steps of the Pythia schedule" if asked else "steps not known offline"
    cached = source.cached_steps()
    held = [s for s in cached if asked is None or s in asked]
    where = (f"the cache {source.storage} holds {len(held)} of them"
             + (f" ({held[:6]}{' ...' if len(held) > 6 else ''}); HF_HUB_OFFLINE=1 plans and "
                "scores from it" if held else ""))
    return [f"model {model}: --steps {spec} ({known}); analyses {','.join(sc.analyses)}; "
            f"results in {parts.output.out}", where]


def _prepare(parts: SweepParts, sources) -> list[ModelRun]:
    """Each model's steps, config, tokenizer and statistics choice: nothing downloaded but
    config and tokenizer files."""
    st, sc = parts.statistics, parts.scoring
    check_local(parts)
    runs = _models(parts, sources)
    for r in runs:
        check_heads(sc, r.config.n_layers)
        r.tokenizer, r.fetch_rate = timed_tokenizer(r.source, r.first, st.tokenizer, r.model)
        r.fingerprint = None if r.tokenizer is None else tokenizer_fingerprint(r.tokenizer)
    choose_for_models(st, runs, sc.device)
    return runs


def build_statistics(parts: SweepParts, ranks: Ranks | None = None) -> list[Path]:
    """The statistics files the sweep of ``parts`` scores against (one per tokenizer), built
    now where missing, as :func:`run` would; nothing else is done."""
    ranks = ranks or Ranks(device=parts.scoring.device)
    sources = [open_source(parts.source, m) for m in parts.source.models]
    try:
        return list(_statistics(parts, _prepare(parts, sources), ranks, None))
    finally:
        for source in sources:
            source.close()


def _run(parts: SweepParts, analyses, sources, ranks: Ranks, argv, shard) -> int:
    sc = parts.scoring
    runs = _prepare(parts, sources)
    targets = {r.stats.path: targets_held(r.stats.factored) for r in runs}
    shapes = {path: _shape(runs, path, held.mode) for path, held in targets.items()}
    targets = _check_fits(sc, runs, targets, shapes, [r for r in runs if r.stats.exact_nnz
                                                      or targets[r.stats.path].mode != "factored"])
    for r in runs:
        r.ledger = revision_ledger(r.source, r.steps, r.name)  # metadata only, before weights
    layout = Layout(parts.output.out, tuple(r.name for r in runs),
                    planned_run_key(parts.identity(), runs))  # another run's shard: not done
    layout.check_strays()
    names = tensor_names(combined_needs(analyses))
    plan = plan_downloads([r.source for r in runs], {r.source.model: r.steps for r in runs})
    dls = {r.name: model_downloads(r, plan, layout, sc.analyses, names,
                                   disk_limit(parts.source, r.source)) for r in runs}
    if ranks.is_main:
        rates = measure_rates(sc.device, sc.torch_dtype)
        print("\n".join(_plan(parts, runs, dls, targets, shapes, rates, shard)), flush=True)
    for dl in dls.values():
        dl.check()
    check_folders(parts.output.out, [f for kind in (SHARDS, FAILED, CLAIMS) for f in
                                     layout.folders(kind)]
                  + (with_subfolders(parts.output.figures) if parts.output.plots else []))
    if parts.plan.dry_run:
        return 0
    with _folder_lock(parts, runs, argv, ranks) as run_id:
        progress = _progress(parts, runs, ranks)
        try:
            lazies = _statistics(parts, runs, ranks, progress)
            built = [r for r in runs if not r.stats.exact_nnz
                     and targets[r.stats.path].mode == "factored"]
            targets = _check_fits(sc, runs, targets, {p: (part_counts(p), g) for p, (_, g)
                                                      in shapes.items()}, built)  # no weight yet
            record = RunRecord(parts.output.out, {**parts.record(), "stats_id": run_stats_id(runs,
                               lazies)}, argv, run_steps(runs), run_choices(parts, runs, lazies,
                               targets), ranks, models=models_record(runs, lazies))
            return _sweep(parts, runs, plan, layout, analyses, lazies, targets, record, ranks,
                          progress, shard, run_id, dls)
        finally:
            if progress is not None:
                progress.close()


def _check_fits(sc, runs, targets: dict, shapes, which) -> dict:
    """Refuse, with the numbers, a model whose one step cannot fit the device's budget: up
    front where the statistics' non-zeros are known, else right after their build, before any
    weight is fetched (a recipe's bound would refuse runs that fit). ``targets`` (each
    statistics file's :class:`~pythia_probe.sweep.plan.Held`) back, with the interval
    replicates' target sets one at a time where a step fits only that way."""
    out = dict(targets)
    for r in which:
        fitted = check_step_fits(checkpoint_plan(sc, r.config, r.stats.rows, out[r.stats.path],
                                                 *shapes[r.stats.path]), sc)
        if not fitted.together:
            out[r.stats.path] = out[r.stats.path]._replace(together=False)
    return out


def _shape(runs: list[ModelRun], path, mode: str) -> tuple[dict[str, int] | None, int]:
    """(nnz, groups) of the statistics at ``path``: the factored parts' non-zeros (factored
    targets only) and the document groups scored for the ceiling and intervals."""
    stats = next(r.stats for r in runs if r.stats.path == path)
    return (stats.parts_nnz() if mode == "factored" else None), stats.groups


def _plan(parts, runs, dls, targets, shapes, rates, shard) -> list[str]:
    """What every run prints first (and --dry-run only)."""
    sc, lines, seen = parts.scoring, [], set()
    for r in runs:
        if r.stats.path not in seen:
            seen.add(r.stats.path)
            users = [x.model for x in runs if x.stats.path == r.stats.path]
            shared = f" (shared by {', '.join(users)})" if len(users) > 1 else ""
            lines += [line + shared if line.startswith("statistics") else line
                      for line in r.stats.lines()]
    for r in runs:
        lines += plan_lines(parts.source, sc, r, dls[r.name], targets[r.stats.path],
                            *shapes[r.stats.path], rates=rates,
                            memory=len(runs) == 1)
        lines += ledger_lines(r.ledger, r.model)
    lines += lacking_lines(runs) + total_lines(parts.source, sc, runs, dls, targets, shapes,
                                               rates)
    if shard[1] > 1:
        i, n = shard
        lines.append(f"this process: share {i} of {n} (the plan's groups of identical weights "
                     f"number {i}, {i + n}, {i + 2 * n}, ...)")
    return lines


def _statistics(parts, runs, ranks, progress) -> dict[Path, LazyStats]:
    """Each distinct statistics file built once if missing, then read (by its path, which is
    named by its content)."""
    out = {}
    for r in runs:
        path = r.stats.path
        if path in out:
            continue
        if not r.stats.built:  # shards started together build it once
            with one_builder(path, ranks, f"statistics for {r.model}"):
                ensure(r.stats.recipe, r.tokenizer, r.fingerprint, parts.scoring.device,
                       ranks, progress if not out else None, show=parts.output.progress)
        out[path] = LazyStats(path, read_stats_meta(path, r.fingerprint))
    return out


def _lock_key(parts: SweepParts, runs) -> str:
    """What makes two processes shards of one run: the identity and the statistics."""
    ident = {**parts.identity(), "stats": sorted({str(r.stats.path) for r in runs})}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _folder_lock(parts: SweepParts, runs, argv, ranks: Ranks) -> Iterator[str]:
    """Rank 0 holds the output folder's lock for the whole launch, shared with the other
    shards of this run (same identity and statistics) and refused to any other run; every
    rank learns whether it got it, and the run id (the first shard's, or the folder's earlier
    compatible run's)."""
    out = parts.output.out
    what = "sweep " + " ".join(argv if argv is not None else [])
    lock = FolderLock(out, {"what": what[:300], "since": datetime.now(timezone.utc).isoformat(),
                            "run_id": previous_run_id(out, parts.identity())},
                      key=_lock_key(parts, runs))
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


def _progress(parts: SweepParts, runs, ranks: Ranks) -> JobProgress | None:
    """One display across the statistics (when they are built now) and the sweep (rank 0)."""
    if not parts.output.progress or not ranks.is_main:
        return None
    unbuilt = next((r.stats for r in runs if not r.stats.built), None)
    stages = [] if unbuilt is None else [
        Stage("statistics pass 1", unbuilt.recipe.docs * (unbuilt.recipe.seq_len + 1), "tok"),
        Stage("statistics pass 2", None, "tok")]
    return JobProgress(stages + [Stage("sweep", sum(len(r.steps) for r in runs), "step")])


def _sweep(parts, runs, plan, layout, analyses, lazies, targets, record: RunRecord,
           ranks: Ranks, progress, shard, run_id, dls) -> int:
    out = parts.output.out
    run_id = record.start(parts.identity(), record.config["stats_id"], run_checkpoints(runs),
                          run_id)  # refuses a folder of another run before anything is written
    if ranks.is_main:
        write_ledger(pd.concat([r.ledger for r in runs], ignore_index=True), Path(out) / REVISIONS)
    infos = {r.source.model: ShardInfo(out, r.name, run_id, r.status, layout, record.run_key)
             for r in runs}
    try:
        scorers = _scorers(parts, runs, analyses, lazies, targets, ranks)
        mine = share(plan.groups, *shard)
        with Claims(Path(out) / CLAIMS, run_id) as claims:
            work = Work(infos, scorers, {r.source.model: r.source for r in runs},
                        tensor_names(combined_needs(analyses)), parts.scoring.analyses,
                        parts.plan.retries, parts.source.prefetch,
                        min((d.limit for d in dls.values() if d.limit is not None),
                            default=None), claims, ranks.rank)
            outcome = sweep_share(mine, work, run_step, stream, load_weights,
                                  _bar(mine, work, progress))
    except KeyboardInterrupt:
        record.end("interrupted", "stopped by a signal (SIGINT/SIGTERM); rerun to resume")
        raise
    except BaseException as err:
        record.end("failed", user_message(err) or f"{type(err).__name__}: {err}")
        raise
    ranks.barrier()
    status = _finish_record(parts, runs, layout, scorers, record)
    if progress is not None:
        progress.close()
    print(f"rank {ranks.rank}: {len(outcome.done)} steps done, {len(outcome.skipped)} already "
          f"done, {len(outcome.failed)} failed" + (f", {len(outcome.elsewhere)} being scored "
                                                   "elsewhere" if outcome.elsewhere else "")
          + "".join(f"\n  {t.model} step {t.step}: {m}" if len(runs) > 1 else
                    f"\n  step {t.step}: {m}" for t, m in outcome.failed.items()), flush=True)
    if ranks.is_main:
        print("\n".join(finish(parts.output) if status != "incomplete" else
                        [pending_line(out)]), flush=True)
    return 1 if outcome.failed else 0


def _scorers(parts, runs, analyses, lazies, targets, ranks) -> dict:
    """One Scorer per statistics file, shared by the models that use it (by source model)."""
    built = {}
    for r in runs:
        if r.stats.path not in built:
            built[r.stats.path] = prepare_scorer(parts, analyses, lazies[r.stats.path], ranks,
                                                 targets[r.stats.path].together)
    return {r.source.model: built[r.stats.path] for r in runs}


def _bar(groups, work: Work, progress):
    total = sum(1 for g in groups for t in g.tasks if not work.done(t))
    if progress is not None:
        return progress.counter("sweep", total)
    # no job display: --no-progress, or a rank other than 0 (rank 0's is the job's one display)
    return tqdm(total=total, disable=True)


def _finish_record(parts, runs, layout: Layout, scorers, record: RunRecord) -> str:
    """The run's status from the folder (every share's tasks), recorded under the manifest's
    own lock so that two shards finishing together cannot leave a stale status."""
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
