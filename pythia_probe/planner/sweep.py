"""The sweep's plan, made before any weight is downloaded: :func:`plan` turns the prepared job
(models, their configs and statistics, each model's downloads: ``sweep.prepare``) into a
:class:`SweepPlan`: per statistics file how its targets are held (sparse parts, or dense
matrices of top-k statistics), per model the memory and multiply-adds of one step
(:mod:`.step`), and over all models the totals and a time estimate from rates measured now
(:mod:`.estimate`). :meth:`SweepPlan.check` fits it to the device's budget (the interval
replicates' target sets one at a time where only that fits) or refuses it; the runner executes
the checked plan as it is. What ``--dry-run`` prints and every run prints first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from pythia_probe.errors import ResourceError
from pythia_probe.planner.budget import human_bytes, memory_budget
from pythia_probe.planner.estimate import Rate, estimate
from pythia_probe.planner.step import (
    Plan,
    Scoring,
    StepShape,
    memory_plan,
    one_set_at_a_time,
    with_groups,
)


class Held(NamedTuple):
    """How one statistics file's targets are held, the plan's choice: ``mode`` (factored or
    dense, :func:`targets_held`) and why; ``together``: the interval replicates' target sets
    held at once (one forward pass per step) or, where they do not fit the device
    (:func:`check_step_fits`), prepared one at a time (a forward pass per set); the same
    numbers either way."""

    mode: str
    why: str
    together: bool = True


class StatsPlan(NamedTuple):
    """One statistics file as planned: how its targets are held, the non-zeros of their sparse
    parts (factored targets: counted in a built file, else the recipe's bound), its document
    groups (scored for the ceiling and intervals), whether the non-zeros are counted
    (``exact``: a fit is checked on counts only, a bound would refuse runs that fit) and
    whether the fit was checked."""

    held: Held
    nnz: dict[str, int] | None
    groups: int
    exact: bool
    checked: bool = False


def targets_held(factored: bool) -> Held:
    """(how the targets are held, why): ``factored``, the statistics' sparse parts, for
    full-vocabulary factored statistics; else ``dense``, each target matrix its own single
    factor."""
    if factored:
        return Held("factored", "full-vocabulary factored statistics: their sparse parts, no "
                    "V x V")
    return Held("dense", "top-k or first-format statistics: each target matrix its own factor")


def checkpoint_plan(sc, analyses, c, rows: int, stats: StatsPlan) -> Plan:
    """The memory and compute plan of one checkpoint of model config ``c`` (scoring ``sc``,
    ``analyses``: the Analysis objects, each declaring its cost) against ``rows`` statistic
    rows held as ``stats`` says (G document groups scored unless intervals are off)."""
    n_params = c.d_vocab * c.d_model * 2 + c.n_layers * (
        4 * c.d_model**2 + 2 * c.d_model * c.d_mlp + 4 * c.d_model)
    shape = StepShape(rows, c.d_model, c.n_layers, c.n_heads, c.d_mlp, n_params)
    heads = c.n_layers if sc.per_head is True else 0 if sc.per_head is False else len(
        sc.per_head)
    how = Scoring(torch.tensor([], dtype=sc.torch_dtype).element_size(), heads, sc.max_rank,
                  sc.batch_size)
    plan = memory_plan(shape, analyses, mode=stats.held.mode, nnz=stats.nnz, how=how)
    plan = with_groups(plan, stats.groups if sc.intervals else 0)
    return plan if stats.held.together else one_set_at_a_time(plan)


def check_step_fits(plan: Plan, sc, budget: tuple[float | None, str] | None = None) -> Plan:
    """The plan one step runs under: ``plan`` when its peak fits the device's budget, else
    with the interval replicates' target sets one at a time where that fits
    (:func:`~pythia_probe.planner.step.one_set_at_a_time`); else refused up front, with the
    numbers (before any weight is fetched or any target built)."""
    limit, how = budget if budget is not None else memory_budget(sc.device)
    if limit is None or plan.total <= limit:
        return plan
    alone = one_set_at_a_time(plan)
    if alone.total <= limit:
        return alone
    parts = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in (
        ("targets", alone.targets), ("streams", plan.residuals), ("weights", plan.weights),
        ("products", plan.transient)))
    sets = (f", of which {plan.groups + 2} more target sets for the ceiling and intervals, "
            f"held one at a time (--no-intervals: {plan.targets / (plan.groups + 3) / 1e9:.2f} "
            "GB of targets)" if plan.groups else "")
    raise ResourceError(f"one step with {plan.mode} targets needs {alone.total / 1e9:.1f} "
                        f"GB on {sc.device} ({parts}{sets}), more than the budget "
                        f"{limit / 1e9:.1f} GB ({how}); try --batch-size or --chunk smaller, "
                        "--top-k smaller (dense statistics), "
                        f"{'--no-intervals, ' if plan.groups else ''}or a larger device")


@dataclass(frozen=True)
class SweepPlan:
    """The plan of a sweep: its scoring part, the analyses, the models (``runs``: config,
    steps, statistics choice), each statistics file's :class:`StatsPlan` (by path) and each
    model's :class:`~pythia_probe.planner.disk.Downloads` (by name)."""

    scoring: Any
    prefetch: int
    analyses: tuple
    runs: tuple
    stats: Mapping[Any, StatsPlan]
    downloads: Mapping[str, Any] = field(default_factory=dict)

    def held(self, path) -> Held:
        return self.stats[path].held

    def step(self, run) -> Plan:
        """The plan of one step of ``run``'s model."""
        return checkpoint_plan(self.scoring, self.analyses, run.config, run.stats.rows,
                               self.stats[run.stats.path])

    def check(self, budget: tuple[float | None, str] | None = None) -> SweepPlan:
        """The plan fitted to the device's ``budget`` (default: measured now) for every
        statistics file whose non-zeros are known and not checked yet: each model's step as it
        is, or with the replicate target sets one at a time; else the one-line refusal with
        the numbers."""
        stats = dict(self.stats)
        for r in self.runs:
            s = stats[r.stats.path]
            if s.exact and not s.checked:
                fitted = check_step_fits(checkpoint_plan(self.scoring, self.analyses, r.config,
                                                         r.stats.rows, s), self.scoring, budget)
                if not fitted.together:
                    stats[r.stats.path] = s._replace(held=s.held._replace(together=False))
        return replace(self, stats={p: s._replace(checked=s.checked or s.exact)
                                    for p, s in stats.items()})

    def counted(self, counts: Callable[[Any], dict[str, int]]) -> SweepPlan:
        """The plan with the factored statistics' non-zeros counted (``counts(path)``, once
        they are built) where they were bounds; :meth:`check` then fits those."""
        return replace(self, stats={p: s if s.exact else s._replace(nnz=counts(p), exact=True)
                                    for p, s in self.stats.items()})

    def with_downloads(self, downloads: Mapping[str, Any]) -> SweepPlan:
        """The plan with each model's downloads (by name; :meth:`check_disk` fits them)."""
        return replace(self, downloads=downloads)

    def check_disk(self) -> None:
        """Refuse a checkpoint larger than the disk the loader may use."""
        for dl in self.downloads.values():
            dl.check()

    def model_lines(self, run, rates: dict | None, uncached, memory: bool = True) -> list[str]:
        """One model's plan: steps (done, copied), bytes still to download, disk, targets,
        memory (``memory``: every line of the memory plan, else its peak) and, with measured
        ``rates``, the expected seconds per step; ``uncached(stats_id, names)``: the targets
        whose norms are still to compute."""
        sc, dl, held = self.scoring, self.downloads[run.name], self.held(run.stats.path)
        steps, rows, plan = run.steps, run.stats.rows, self.step(run)
        limit = "" if dl.limit is None else (f"; the loader's limit {human_bytes(dl.limit)} "
                                             f"({dl.limit_why})")
        left = sorted(dl.todo)
        lines = [f"model {run.model}: {len(steps)} steps: {len(steps) - len(left)} done, "
                 f"{len(left)} to score: {left[:6]}{' ...' if len(left) > 6 else ''} "
                 f"({dl.copied} of them with the weights of an earlier step: copied, not "
                 "downloaded)",
                 f"download {human_bytes(dl.bytes)} still (cached files excluded); disk at any "
                 f"time <= {human_bytes(dl.held(self.prefetch))} ({self.prefetch + 1} "
                 f"checkpoints){limit}",
                 f"targets: {held.mode} ({held.why})",
                 intervals_line(sc, self.stats[run.stats.path].groups),
                 norms_line(plan, run.stats.stats_id, rates, uncached)]
        if not memory:
            return lines + [f"memory on {sc.device} ({sc.dtype}, V={rows:,}): peak total "
                            f"{plan.total / 1e9:.2f} GB"]
        return lines + [f"memory on {sc.device} ({sc.dtype}, V={rows:,}):",
                        *("  " + line for line in plan.lines(rates))]

    def total_lines(self, rates: dict[str, float]) -> list[str]:
        """The whole run: tasks, downloads and disk over every model, and how long it should
        take (:mod:`.estimate`: each step's plan at the dense and sparse ``rates`` measured
        now, the ones the per-step lines use)."""
        runs, dls = self.runs, self.downloads
        plans = [(self.step(r), len(dls[r.name].fetch)) for r in runs]
        seconds = sum(p.seconds(rates) * n for p, n in plans)
        flops = sum(p.flops_per_step * n for p, n in plans)
        nbytes = sum(d.bytes for d in dls.values())
        fetches = [r.fetch_rate for r in runs if r.fetch_rate is not None]
        rate = Rate(sum(x.nbytes for x in fetches), sum(x.seconds for x in fetches)) \
            if fetches else None
        when = estimate(seconds, flops, rates, nbytes, rate, self.prefetch)
        if len(runs) == 1:
            return [f"time: {when}"]
        tasks = sum(len(r.steps) for r in runs)
        todo = sum(len(d.todo) for d in dls.values())
        fetched = sum(len(d.fetch) for d in dls.values())
        return [f"all {len(runs)} models: {tasks} (model, step) tasks, {todo} to do: {fetched} "
                f"checkpoints to download ({human_bytes(nbytes)} still), "
                f"{sum(d.copied for d in dls.values())} copied; disk at any time <= "
                f"{human_bytes(max(d.held(self.prefetch) for d in dls.values()))} (the models "
                "one after another)", f"time: {when}"]


def plan(job) -> SweepPlan:
    """The sweep's plan for a prepared ``job`` (``sweep.prepare.Prepared``: its parts, the
    analyses, the models with their statistics), not yet checked against the device
    (:meth:`SweepPlan.check`) nor given its downloads (:meth:`SweepPlan.with_downloads`)."""
    stats = {}
    for r in job.runs:
        if r.stats.path not in stats:
            held = targets_held(r.stats.factored)
            factored = held.mode == "factored"
            stats[r.stats.path] = StatsPlan(held, r.stats.parts_nnz() if factored else None,
                                            r.stats.groups, r.stats.built or not factored)
    return SweepPlan(job.parts.scoring, job.parts.source.prefetch, tuple(job.analyses),
                     tuple(job.runs), stats)


def norms_line(plan: Plan, stats_id: str | None, rates: dict | None, uncached) -> str:
    """What the targets' once-per-statistics norms cost this run: cached for these statistics
    (by stats_id), or how many to compute and, with measured ``rates``, how long at most at the
    host's float64 rate (sparse products for factored targets, dense for dense ones): an upper
    bound, every column of V counted (only those the corpus fills are computed) and, before the
    statistics exist, the recipe's bound on their non-zeros."""
    todo = uncached(stats_id, sorted(plan.norms))
    if not todo:
        return f"target norms: cached for these statistics (stats_id {stats_id})"
    macs = plan.norm_macs(todo)
    rate = (rates or {}).get("host_sparse" if plan.mode == "factored" else "host_dense")
    when = "" if rate is None else (f", at most {macs / rate:,.0f} s at the host's float64 "
                                    f"{rate / 1e9:.2f} G multiply-adds/s measured now")
    sets = f", {plan.groups + 3} target sets" if plan.groups else ""
    return (f"target norms: {len(todo)} of {len(plan.norms)} to compute once (at most "
            f"{macs:.2e} multiply-adds{sets}{when}), then cached by stats_id")


def intervals_line(sc, groups: int) -> str:
    """Whether the rows get ceiling, ci_low and ci_high, and why not where they do not."""
    if not sc.intervals:
        return ("ceiling and intervals: off (--no-intervals): value, chance and chance_sd; "
                "above_chance from chance_sd alone, no effect")
    if groups < 2:
        return ("ceiling and intervals: none: the statistics keep no document groups (build "
                "them with --groups 10, the default, or `stats compute --groups 10`)")
    return (f"ceiling and intervals: on, from G = {groups} document groups (two halves; "
            f"a delete-a-group jackknife, {groups} replicates)")
