"""The work of one sweep: (model, step) tasks, grouped by weights so that no checkpoint is
downloaded twice, split into shares, claimed, scored (or copied) and written one shard each.

- The plan (:func:`pythia_probe.hub.checkpoints.plan_downloads`, metadata only) groups every task
  by its weights digest: step1 = step0 within a model, byte-identical weights across models
  (a branch serving another's weights), each group fetched once through its first task.
- A share is every N-th group from the i-th (:func:`share`): ``--shard i/N``, a Slurm array
  task, a rank of ``torchrun``/``accelerate launch`` (combined in
  :meth:`pythia_probe.ranks.Ranks.share`). Groups, not tasks, are split, so a task and the copy
  of its weights land in one process. The split is a function of the plan alone: every process
  computes the same one.
- Each task not done yet is claimed (:mod:`.claims`) before its group is fetched; a task
  claimed by a live holder elsewhere is left to it. Within a group, the first task of each
  statistics is scored; every other task with the same statistics gets its rows copied (model,
  step and revision status its own), from a shard already on disk without any download.
- A failing group is fetched again (``--retries``), then each of its tasks is recorded in
  ``OUT/failed/`` while the sweep goes on; a full disk or memory stops it.
"""

from __future__ import annotations

import itertools
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pythia_probe.errors import DiskFullError, ResourceError, user_message
from pythia_probe.fileio import remove, write_json
from pythia_probe.hub import Group, Task
from pythia_probe.results import make_rows, read_shard, write_shard
from pythia_probe.sweep.layout import Layout, failure_proof
from pythia_probe.sweep.scoring import Scorer
from pythia_probe.sweep.source import to_weights

log = logging.getLogger(__name__)
WAIT_POLL = 1.0  # seconds between looks at tasks of this share another process is scoring


@dataclass(frozen=True)
class ShardInfo:
    """Where one model's shards go and what every row carries besides the scores."""

    out: str
    model: str  # the table's model name
    run_id: str
    status: Mapping[int, str] = field(default_factory=dict)  # step -> the ledger's status
    layout: Layout | None = None
    run_key: str | None = None  # the run's content key (sweep.manifest.run_key)

    @property
    def run(self) -> dict:
        """The identity every shard of the run carries."""
        return {"run_id": self.run_id, "run_key": self.run_key}

    def shard(self, step: int) -> Path:
        return (self.layout or Layout(self.out)).shard(self.model, step)

    def failure(self, step: int) -> Path:
        return (self.layout or Layout(self.out)).failure(self.model, step)


def run_step(loaded, step: int, scorer: Scorer, where: ShardInfo) -> Path:
    """Score one loaded checkpoint and write its shard."""
    sc = scorer.scoring
    weights = to_weights(loaded, sc.device, sc.torch_dtype)
    rows = scorer.rows(loaded.config, weights)
    df = make_rows(rows, model=where.model, step=step, stats_id=scorer.stats_id,
                   dtype=sc.dtype, run_id=where.run_id, revision_status=where.status.get(step))
    return write_shard(df, where.shard(step), where.run)


@dataclass
class Outcome:
    done: list[Task] = field(default_factory=list)
    skipped: list[Task] = field(default_factory=list)
    elsewhere: list[Task] = field(default_factory=list)  # claimed by a live holder elsewhere
    failed: dict[Task, str] = field(default_factory=dict)


def share(groups: Sequence[Group], index: int, count: int) -> list[Group]:
    """The groups of share ``index`` of ``count`` (every count-th from index: disjoint, together
    complete, each model's groups still in order)."""
    return list(groups[index::count])


@dataclass
class Work:
    """What the loop needs per model: its ShardInfo and Scorer (by the source's model id), the
    sources, the tensor names, the run's flags, the claims."""

    infos: Mapping[str, ShardInfo]
    scorers: Mapping[str, object]
    sources: Mapping[str, object]
    names: object
    analyses: Sequence[str]
    retries: int
    prefetch: int
    max_disk: float | None
    claims: object
    rank: int = 0

    def done(self, t: Task) -> bool:
        info = self.infos[t.model]
        return info.layout.done(info.model, t.step, self.analyses, self.scorers[t.model].stats_id,
                                info.run_key)

    def claim_path(self, t: Task) -> Path:
        info = self.infos[t.model]
        return info.layout.claim(info.model, t.step)


def sweep_tasks(groups: Sequence[Group], work: Work, run_step: Callable, stream: Callable,
                load_weights: Callable, bar=None) -> Outcome:
    """Every task of ``groups`` not done yet, model after model (each model's fetches in one
    prefetching stream); ``run_step(loaded, step, scorer, info)`` scores one."""
    result = Outcome()
    pending = []
    for g in groups:
        todo = [t for t in g.tasks if not work.done(t)]
        for t in g.tasks:
            if t not in todo:
                result.skipped.append(t)
                work.claims.clear_stale(work.claim_path(t))
        pending.append((g, todo))
    bar = bar or tqdm(total=sum(len(t) for _, t in pending), disable=True)
    for model, items in itertools.groupby(pending, key=lambda x: x[0].leader.model):
        fetch = []
        for g, todo in items:
            left = _claim_and_copy(g, todo, work, result)
            bar.update(len(todo) - len(left))
            if left:
                fetch.append((g, left))
        source = work.sources[model]
        revs = source.resolve([g.leader.step for g, _ in fetch])
        for (g, left), (rev, first) in zip(fetch, stream(source, revs, work.names, work.prefetch,
                                                         work.max_disk), strict=True):
            n = len(left)
            _score_group(g, left, first, lambda s=source, r=rev: load_weights(s, r, work.names),
                         work, run_step, result)
            bar.update(n)
    bar.close()
    return result


def sweep_share(groups: Sequence[Group], work: Work, run_step: Callable, stream: Callable,
                load_weights: Callable, bar=None) -> Outcome:
    """:func:`sweep_tasks` over the share, then, for tasks of it that another live process
    had claimed (two launches of one share: the same command twice, two ``pp.run_sweep``
    calls), wait until each is done or its claim is gone and take up those still not done: a
    launch returns when every task of its share is in the folder (or failed), or is held by a
    claim file that cannot be read and is not yet stale (no live holder to wait for)."""
    outcome = sweep_tasks(groups, work, run_step, stream, load_weights, bar)
    while any(work.claims.live(work.claim_path(t)) for t in outcome.elsewhere):
        waiting = set(outcome.elsewhere)
        log.info("waiting for %d tasks another process is scoring (%s)", len(waiting),
                 work.claims.holder(work.claim_path(outcome.elsewhere[0])))
        while any(work.claims.live(work.claim_path(t)) and not work.done(t) for t in waiting):
            time.sleep(WAIT_POLL)
        again = sweep_tasks([g for g in groups if waiting & set(g.tasks)], work, run_step,
                            stream, load_weights)
        outcome.done += again.done
        outcome.skipped += [t for t in again.skipped if t in waiting]
        outcome.failed.update(again.failed)
        outcome.elsewhere = again.elsewhere
    return outcome


def _claim_and_copy(g: Group, todo: list[Task], work: Work, result: Outcome) -> list[Task]:
    """Claim the group's tasks to do, then look again whether each is done (another worker may
    have scored it since the first look: claim before work); copy rows where a done task has
    the same statistics; return the claimed tasks that need the weights."""
    mine = []
    for t in todo:
        path = work.claim_path(t)
        if not work.claims.take(path):
            result.elsewhere.append(t)
            who = work.claims.holder(path)
            (log.warning if who.startswith("a claim file") else log.info)(
                "%s step %d is claimed by %s: left to it", t.model, t.step, who)
        elif work.done(t):
            work.claims.release(path)
            result.skipped.append(t)
        else:
            mine.append(t)
    donors = _donors(g, work, set(mine) | set(result.elsewhere))
    left = []
    for t in mine:
        src = donors.get(id(work.scorers[t.model]))
        if src is None:
            left.append(t)
        else:
            _copy(src, t, work)
            _finished(t, work, result)
    return left


def _donors(g: Group, work: Work, not_done: set[Task]) -> dict[int, Path]:
    """Scorer -> the shard of a done task of the group scored with it."""
    out: dict[int, Path] = {}
    for t in g.tasks:
        if t not in not_done:
            out.setdefault(id(work.scorers[t.model]), work.infos[t.model].shard(t.step))
    return out


def _score_group(g: Group, left: list[Task], first, load: Callable, work: Work,
                 run_step: Callable, result: Outcome) -> None:
    """Score (or copy within the group) every task in ``left``; retry the whole group's load
    on failure, then record each task still left."""
    written: dict[int, Path] = {}
    for attempt in range(work.retries + 1):
        try:
            loaded = first if attempt == 0 else load()
            if isinstance(loaded, Exception):
                raise loaded
            for t in list(left):
                key = id(work.scorers[t.model])
                if key in written:
                    _copy(written[key], t, work)
                else:
                    written[key] = run_step(loaded, t.step, work.scorers[t.model],
                                            work.infos[t.model])
                _finished(t, work, result)
                left.remove(t)
            return
        except (DiskFullError, ResourceError):
            raise  # no later step can succeed either: stop the sweep
        except Exception as e:  # noqa: BLE001 - a bad checkpoint must not stop the sweep
            if attempt == work.retries:
                for t in left:
                    _failed(t, e, attempt + 1, work, result)


def _copy(src: Path, t: Task, work: Work) -> None:
    """The rows of ``src`` (same weights, same statistics) as task ``t``'s."""
    info = work.infos[t.model]
    df = read_shard(src).assign(model=info.model, step=t.step, run_id=info.run_id,
                                revision_status=info.status.get(t.step))
    write_shard(df, info.shard(t.step), info.run)


def _finished(t: Task, work: Work, result: Outcome) -> None:
    info = work.infos[t.model]
    remove(info.failure(t.step), [info.out], failure_proof(info.model, t.step))
    work.claims.release(work.claim_path(t))
    result.done.append(t)


def _failed(t: Task, err: BaseException, tries: int, work: Work, result: Outcome) -> None:
    """Write ``OUT/failed/[<model>/]step{N}.json`` atomically and release the claim."""
    info = work.infos[t.model]
    msg = user_message(err) or f"{type(err).__name__}: {err}"
    write_json(info.failure(t.step), {"model": info.model, "step": t.step, "error": msg,
                                      "rank": work.rank, "tries": tries,
                                      "traceback": "".join(traceback.format_exception(err))})
    work.claims.release(work.claim_path(t))
    result.failed[t] = msg
    log.warning("%s step %d failed after %d tries: %s", info.model, t.step, tries, msg)
