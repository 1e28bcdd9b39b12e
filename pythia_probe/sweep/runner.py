"""The sweep as a library: validate, plan, then score every step and write its shard.

:func:`run` takes the configuration's parts (:class:`~pythia_probe.sweep.config.SweepParts`)
and the process group (:class:`~pythia_probe.ranks.Ranks`, built by the entry point); each
component gets only its part. Order: checks that need no network (flags, model name, --steps
grammar), the model's steps and config, the tokenizer and statistics, the plan (printed; the
dry run stops here), the lock on the output folder, the statistics build if needed, the
targets, then this process's share of the steps (``shard``: default this rank of the group).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tqdm import tqdm

from pythia_probe.analysis import Analysis, combined_needs, get_analyses
from pythia_probe.errors import (
    DiskFullError,
    FolderLockedError,
    HubError,
    MissingFileError,
    ResourceError,
    user_message,
)
from pythia_probe.fileio import FolderLock, remove, write_json
from pythia_probe.progress import JobProgress, Stage
from pythia_probe.ranks import Ranks
from pythia_probe.results import make_rows, read_shard, write_shard
from pythia_probe.revisions import write_ledger
from pythia_probe.stats.recipe import ensure
from pythia_probe.steps import PYTHIA_STEPS, is_pythia, parse_steps
from pythia_probe.sweep.config import SweepParts
from pythia_probe.sweep.layout import (
    failed_steps,
    failure_path,
    shard_done,
    shard_path,
    split_steps,
)
from pythia_probe.sweep.manifest import RunRecord
from pythia_probe.sweep.plan import (
    check_heads,
    check_local,
    check_step_fits,
    checkpoint_plan,
    downloads,
    measure_rates,
    plan_lines,
    resolve_targets,
)
from pythia_probe.sweep.report import finish, pending_line
from pythia_probe.sweep.scoring import Scorer, build_scorer
from pythia_probe.sweep.source import (
    disk_limit,
    duplicates,
    ledger_lines,
    load_weights,
    model_config,
    model_tokenizer,
    offline_advice,
    open_source,
    revision_ledger,
    select_steps,
    stream,
    tensor_names,
    to_weights,
)
from pythia_probe.sweep.statistics import (
    LazyStats,
    check_fits_model,
    choose_statistics,
    read_stats_meta,
)
from pythia_probe.sweep.targets import prepare_scale, prepare_targets
from pythia_probe.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)
REVISIONS = "revisions.parquet"  # OUT/revisions.parquet: the revision ledger of the run


@dataclass(frozen=True)
class ShardInfo:
    """Where one run's shards go and what every row carries besides the scores."""

    out: str
    model: str
    run_id: str
    status: Mapping[int, str] = field(default_factory=dict)  # step -> the ledger's status


@dataclass
class Outcome:
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def run_step(loaded, step: int, scorer: Scorer, where: ShardInfo) -> Path:
    """Score one loaded checkpoint and write its shard."""
    sc = scorer.scoring
    weights = to_weights(loaded, sc.device, sc.torch_dtype)
    rows = scorer.rows(loaded.config, weights)
    df = make_rows(rows, model=where.model, step=step, stats_id=scorer.stats_id,
                   dtype=sc.dtype, run_id=where.run_id, revision_status=where.status.get(step))
    return write_shard(df, shard_path(where.out, step))


def _record_failure(out: str, step: int, err: BaseException, tries: int, rank: int) -> str:
    """Write ``OUT/failed/step{N}.json`` atomically; return the one-line message."""
    msg = user_message(err) or f"{type(err).__name__}: {err}"
    write_json(failure_path(out, step),
               {"step": step, "error": msg, "rank": rank, "tries": tries,
                "traceback": "".join(traceback.format_exception(err))})
    return msg


def sweep_steps(source, steps: Sequence[int], scorer: Scorer, parts: SweepParts,
                where: ShardInfo, max_disk: float | None, rank: int = 0,
                progress: JobProgress | None = None) -> Outcome:
    """Every step not already done; retry each failure, then record it and go on."""
    out, analyses, retries = where.out, parts.scoring.analyses, parts.plan.retries
    result = Outcome()
    todo = [s for s in steps if not shard_done(out, s, analyses, scorer.stats_id)]
    result.skipped = [s for s in steps if s not in todo]
    names = tensor_names(scorer.needs)
    revs = source.resolve(todo)
    dups = duplicates(source, revs, steps)
    bar = (progress.counter("sweep", len(todo)) if progress is not None else
           tqdm(total=len(todo), desc=f"sweep rank {rank}", unit="step",
                disable=not parts.output.progress))
    fetch = [r for r in revs if r.step not in dups]
    for rev, first in stream(source, fetch, names, parts.source.prefetch, max_disk):
        for attempt in range(retries + 1):
            try:
                loaded = first if attempt == 0 else load_weights(source, rev, names)
                if isinstance(loaded, Exception):
                    raise loaded
                run_step(loaded, rev.step, scorer, where)
                remove(failure_path(out, rev.step), [out])
                result.done.append(rev.step)
                break
            except (DiskFullError, ResourceError):
                raise  # no later step can succeed either: stop the sweep
            except Exception as e:  # noqa: BLE001 - a bad checkpoint must not stop the sweep
                if attempt == retries:
                    result.failed[rev.step] = _record_failure(out, rev.step, e, attempt + 1, rank)
                    log.warning("step %d failed after %d tries: %s", rev.step, attempt + 1,
                                result.failed[rev.step])
        bar.update(1)
    _copy_duplicates(dups, scorer, where, result, rank)
    bar.update(len(dups))
    bar.close()
    return result


def _copy_duplicates(dups: dict[int, int], scorer: Scorer, where: ShardInfo, result: Outcome,
                     rank: int) -> None:
    """Steps whose weights are byte-identical to an earlier one (Pythia's step1 == step0)
    get that step's rows."""
    for step, same in dups.items():
        if shard_done(where.out, same, scorer.scoring.analyses, scorer.stats_id):
            df = read_shard(shard_path(where.out, same)).assign(
                step=step, run_id=where.run_id, revision_status=where.status.get(step))
            write_shard(df, shard_path(where.out, step))
            result.done.append(step)
        else:
            result.failed[step] = _record_failure(where.out, step, RuntimeError(
                f"weights identical to step {same}, which has no results"), 0, rank)


def prepare_scorer(parts: SweepParts, analyses: list[Analysis], lazy: LazyStats, mode: str,
                   ranks: Ranks) -> Scorer:
    """Targets prepared once (cached on disk unless memory mode) and shared by every step;
    rank 0 builds a missing cache, the others then reuse it."""
    needs = combined_needs(analyses)
    names, progress = list(needs.targets), parts.output.progress and ranks.is_main
    for turn in (True, False):  # rank 0 first (it builds missing caches), then the others
        if ranks.is_main == turn:
            targets = prepare_targets(lazy, names, parts.targets, mode, parts.scoring,
                                      progress and turn)
            scale = prepare_scale(lazy, names, parts.targets, mode, parts.scoring,
                                  progress and turn)
        if turn:
            ranks.barrier()
    return build_scorer(parts.scoring, analyses, needs, lazy, targets, scale)


def run(parts: SweepParts, ranks: Ranks | None = None, argv: list[str] | None = None, *,
        shard: tuple[int, int] | None = None) -> int:
    """Validate everything, then sweep this process's share of the steps; 0 if every step
    succeeded, else 1. ``shard`` (index, count): which share (default: this rank of
    ``ranks``)."""
    ranks = ranks or Ranks(device=parts.scoring.device)
    analyses = get_analyses(list(parts.scoring.analyses))
    source = open_source(parts.source)
    try:
        return _run(parts, analyses, source, ranks, argv, shard or (ranks.rank, ranks.world))
    finally:
        source.close()  # leases of planning fetches (config, tokenizer) released


def _model(parts: SweepParts, source):
    """(steps, first revision, its config): the hub's (or cache's) listing, nothing
    downloaded but config.json; an unreachable hub is one line saying what to do offline."""
    try:
        steps = select_steps(parts.plan.steps, source)
        first = source.resolve(steps[:1])[0]
    except (HubError, MissingFileError) as err:
        unreachable = isinstance(err, HubError) or source.offline
        if source.local_dir is not None or not unreachable:
            raise  # a local folder's or the hub's own answer (e.g. no such repository)
        if parts.plan.dry_run:
            print("\n".join(_local_lines(parts, source)), flush=True)
        raise offline_advice(parts.source.model, err, source.offline) from err
    return steps, first, model_config(source, first)


def _local_lines(parts: SweepParts, source) -> list[str]:
    """What the plan can say without the hub: the asked steps (Pythia's schedule is known) and
    which of them the cache holds (read without the network)."""
    src, sc, spec = parts.source, parts.scoring, parts.plan.steps
    asked = parse_steps(spec, PYTHIA_STEPS) if is_pythia(src.model) else None
    known = f"{len(asked)} steps of the Pythia schedule" if asked else "steps not known offline"
    cached = source.cached_steps()
    held = [s for s in cached if asked is None or s in asked]
    where = (f"the cache {source.storage} holds {len(held)} of them"
             + (f" ({held[:6]}{' ...' if len(held) > 6 else ''}); HF_HUB_OFFLINE=1 plans and "
                "scores from it" if held else ""))
    return [f"model {src.model}: --steps {spec} ({known}); analyses {','.join(sc.analyses)}; "
            f"results in {parts.output.out}", where]


def _run(parts: SweepParts, analyses, source, ranks: Ranks, argv, shard) -> int:
    src, st, sc = parts.source, parts.statistics, parts.scoring
    check_local(parts)
    steps, first, c = _model(parts, source)
    check_heads(sc, c.n_layers)
    tok = model_tokenizer(source, first, st.tokenizer, src.model)
    fingerprint = None if tok is None else tokenizer_fingerprint(tok)
    stats = choose_statistics(st, src.model, tok, fingerprint, sc.device)
    check_fits_model(stats, c.d_vocab, src.model)
    factored = stats.factored
    targets = resolve_targets(parts.targets, sc, c, stats.rows, stats.file_bytes(), factored)
    nnz = stats.parts_nnz() if targets[0] == "factored" else None
    groups = stats.groups
    check_step_fits(checkpoint_plan(sc, c, stats.rows, targets[0], nnz, groups), sc)
    out = parts.output.out
    todo = [s for s in steps if not shard_done(out, s, sc.analyses, stats.stats_id)]
    dl = downloads(source, steps, todo, tensor_names(combined_needs(analyses)),
                   disk_limit(src, source))
    revisions = revision_ledger(source, steps, src.name)  # metadata only, before any weight
    rates = measure_rates(sc.device, sc.torch_dtype) if ranks.is_main else None
    lines = stats.lines() + plan_lines(src, sc, steps, dl, c, stats.rows, targets,
                                       parts.targets.mode, nnz, rates, groups)
    if ranks.is_main:
        print("\n".join(lines + ledger_lines(revisions, src.model)), flush=True)
    dl.check()
    if parts.plan.dry_run:
        return 0
    with _folder_lock(out, argv, ranks):
        progress = _progress(parts, stats, len(steps), ranks)
        try:
            if not stats.built:
                ensure(stats.recipe, tok, fingerprint, sc.device, ranks, progress,
                       show=parts.output.progress)
            meta = read_stats_meta(stats.path, fingerprint)
            choices = {"targets_choice": {"requested": parts.targets.mode,
                                          "resolved": targets[0], "reason": targets[1]},
                       "vocabulary": {"rows": stats.rows, "reason": stats.vocab_reason},
                       "statistics": {**stats.record(), "stats_id": meta["stats_id"]}}
            record = RunRecord(out, {**parts.record(), "stats_id": meta["stats_id"]}, argv,
                               steps, choices, ranks)
            if ranks.is_main:
                write_ledger(revisions, Path(out) / REVISIONS)
            claimed = {int(s): str(v) for s, v in zip(revisions["step"], revisions["status"],
                                                      strict=True)}
            return _sweep(parts, source, steps, analyses, LazyStats(stats.path, meta),
                          targets[0], record, ranks, progress, shard, dl.limit, claimed)
        finally:
            if progress is not None:
                progress.close()


@contextlib.contextmanager
def _folder_lock(out: str, argv, ranks: Ranks) -> Iterator[None]:
    """Rank 0 holds the output folder's lock for the whole launch; every rank learns whether
    it got it, so a refused launch stops everywhere with the same one line."""
    what = "sweep " + " ".join(argv if argv is not None else [])
    lock = FolderLock(out, {"what": what[:300], "since": datetime.now(timezone.utc).isoformat()})
    err = None
    if ranks.is_main:
        try:
            lock.acquire()
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then raised
            err = e
    refused = ranks.gather(None if err is None else user_message(err) or str(err))[0]
    if err is not None:
        raise err
    if refused:
        raise FolderLockedError(refused)
    try:
        yield
    finally:
        lock.release()


def _progress(parts: SweepParts, stats, n_steps: int, ranks: Ranks) -> JobProgress | None:
    """One display across the statistics (when they are built now) and the sweep (rank 0)."""
    if not parts.output.progress or not ranks.is_main:
        return None
    stages = [] if stats.built else [
        Stage("statistics pass 1", stats.recipe.docs * (stats.recipe.seq_len + 1), "tok"),
        Stage("statistics pass 2", None, "tok")]
    return JobProgress(stages + [Stage("sweep", n_steps, "step")])


def _sweep(parts: SweepParts, source, steps, analyses, lazy: LazyStats, mode: str,
           record: RunRecord, ranks: Ranks, progress, shard, max_disk, claimed) -> int:
    out = parts.output.out
    checkpoints = (lambda: source.manifest(source.resolve(steps))) \
        if source.local_dir is None else None
    run_id = record.start(parts.identity(), lazy.stats_id, checkpoints)
    where = ShardInfo(out, parts.source.name, run_id, claimed)
    try:
        scorer = prepare_scorer(parts, analyses, lazy, mode, ranks)
        outcome = sweep_steps(source, split_steps(steps, *shard), scorer, parts, where,
                              max_disk, ranks.rank, progress)
    except KeyboardInterrupt:
        record.end("interrupted", "stopped by a signal (SIGINT/SIGTERM); rerun to resume")
        raise
    except BaseException as err:
        record.end("failed", user_message(err) or f"{type(err).__name__}: {err}")
        raise
    ranks.barrier()
    failed = failed_steps(out)
    complete = all(shard_done(out, s, parts.scoring.analyses, lazy.stats_id) for s in steps)
    status = "failed" if failed else "complete" if complete else "incomplete"
    reason = (f"{len(failed)} steps failed (see failed/)" if failed else None if complete
              else "steps of other shards are not done yet")
    record.end(status, reason, failed)
    if progress is not None:
        progress.close()
    print(f"rank {ranks.rank}: {len(outcome.done)} steps done, {len(outcome.skipped)} already "
          f"done, {len(outcome.failed)} failed" + "".join(
              f"\n  step {s}: {m}" for s, m in outcome.failed.items()), flush=True)
    if ranks.is_main:
        print("\n".join(finish(parts.output) if status != "incomplete" else
                        [pending_line(out)]), flush=True)
    return 1 if outcome.failed else 0
