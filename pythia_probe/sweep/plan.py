"""The sweep's plan, made before any weight is downloaded: per model the steps (done, copied
from identical weights, to score), bytes to download and the disk they may hold, how the
targets are held (sparse parts, or dense matrices of top-k statistics), what computing their
norms costs, the memory of one step; over all models the totals and
a time estimate from rates measured now (:mod:`.estimate`); and the checks that need a model's
config (per-head layers). What ``--dry-run`` prints and every run prints first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from pythia_probe.analysis import rates as device_rates
from pythia_probe.analysis.plan import Plan, StepShape, memory_plan, one_set_at_a_time, with_groups
from pythia_probe.arch import NeoXConfig
from pythia_probe.errors import BadInputError, MissingFileError, ResourceError
from pythia_probe.hub import PYTHIA_STEPS, DownloadPlan, is_pythia, parse_steps
from pythia_probe.resources import human_bytes, memory_budget
from pythia_probe.sweep.config import ScoringConfig, SourceConfig
from pythia_probe.sweep.estimate import Rate, estimate
from pythia_probe.sweep.held import uncached
from pythia_probe.sweep.layout import Layout


class Held(NamedTuple):
    """How one statistics file's targets are held, the plan's choice: ``mode`` (factored or
    dense, :func:`targets_held`) and why; ``together``: the interval replicates' target sets
    held at once (one forward pass per step) or, where they do not fit the device
    (:func:`check_step_fits`), prepared one at a time (a forward pass per set); the same
    numbers either way."""

    mode: str
    why: str
    together: bool = True


def checkpoint_plan(sc: ScoringConfig, c: NeoXConfig, rows: int, held: Held,
                    nnz: dict[str, int] | None = None, groups: int = 0) -> Plan:
    """The memory and compute plan of one checkpoint of model config ``c``, targets ``held``
    as the plan chose (``nnz``: the factored statistics' non-zeros by part;
    ``groups``: G document groups of the statistics, scored for the ceiling and intervals unless
    those are off)."""
    n_params = c.d_vocab * c.d_model * 2 + c.n_layers * (
        4 * c.d_model**2 + 2 * c.d_model * c.d_mlp + 4 * c.d_model)
    shape = StepShape(rows, c.d_model, c.n_layers, c.n_heads, c.d_mlp, n_params)
    heads = c.n_layers if sc.per_head is True else 0 if sc.per_head is False else len(
        sc.per_head)
    plan = memory_plan(shape, sc.analyses,
                       dtype_bytes=torch.tensor([], dtype=sc.torch_dtype).element_size(),
                       mode=held.mode, max_rank=sc.max_rank, nnz=nnz,
                       per_head_layers=heads, batch_size=sc.batch_size)
    plan = with_groups(plan, groups if sc.intervals else 0)
    return plan if held.together else one_set_at_a_time(plan)


def targets_held(factored: bool) -> Held:
    """(how the targets are held, why): ``factored``, the statistics' sparse parts, for
    full-vocabulary factored statistics; else ``dense``, each target matrix its own single
    factor."""
    if factored:
        return Held("factored", "full-vocabulary factored statistics: their sparse parts, no "
                    "V x V")
    return Held("dense", "top-k or first-format statistics: each target matrix its own factor")


def check_step_fits(plan: Plan, sc: ScoringConfig,
                    budget: tuple[float | None, str] | None = None) -> Plan:
    """The plan one step runs under: ``plan`` when its peak fits the device's budget, else
    with the interval replicates' target sets one at a time where that fits
    (:func:`~pythia_probe.analysis.plan.one_set_at_a_time`); else refused up front, with the
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


def measure_rates(device: str, dtype: torch.dtype) -> dict[str, float]:
    """The device's dense and sparse multiply-add rates, measured now (about a second), from
    which the plan's expected seconds per step follow."""
    return device_rates.measure(device, dtype)


def check_local(parts) -> None:
    """What needs no network, checked before any network call: files named on the command
    line exist, and a Pythia model's --steps are steps of Pythia's schedule."""
    if all(is_pythia(m) for m in parts.source.models):  # StepError names the nearest steps
        parse_steps(parts.plan.steps, PYTHIA_STEPS)
    stats, text = parts.statistics.stats, parts.scoring.text
    if stats is not None and not Path(stats).is_file():
        raise MissingFileError(f"--stats {stats}: no such statistics file; compute one with "
                               "`python -m pythia_probe.stats compute ...`, or leave --stats "
                               "out to build the paper's recipe")
    if text is not None and not Path(text).is_file():
        raise MissingFileError(f"--text {text}: no such file (a safetensors file with "
                               "'tokens' [N, T+1], e.g. the demo's tokens.safetensors)")


def check_heads(sc: ScoringConfig, n_layers: int) -> None:
    """Refuse --heads layers the model does not have, naming the valid ones."""
    if isinstance(sc.per_head, list):
        bad = [layer for layer in sc.per_head if not 1 <= layer <= n_layers]
        if bad:
            raise BadInputError(f"--heads {sc.heads}: the model has layers 1..{n_layers} "
                                f"(numbered from 1, as in the paper), not {bad}")


@dataclass(frozen=True)
class Downloads:
    """What one model's tasks still to do will fetch, and the disk they may hold at once."""

    todo: list[int]
    copied: int  # tasks given the rows of identical weights (step1 = step0, another model's)
    fetch: list
    bytes: int
    biggest: int
    limit: float | None
    limit_why: str

    def check(self) -> None:
        """Refuse up front a checkpoint larger than the disk the loader may use."""
        big = max(self.fetch, key=lambda r: r.nbytes, default=None)
        if big is not None and self.limit is not None and big.nbytes > self.limit:
            raise ResourceError(f"step {big.step} needs {human_bytes(big.nbytes)} of disk, more "
                                f"than the downloads may hold ({human_bytes(self.limit)}: "
                                f"{self.limit_why}); free space or raise --max-disk-gb")

    def held(self, prefetch: int) -> int:
        """Disk the downloads hold at any time: the checkpoint scored and those prefetched."""
        return (prefetch + 1) * self.biggest


def model_downloads(run, plan: DownloadPlan, layout: Layout, analyses, names,
                    limit: tuple[float | None, str]) -> Downloads:
    """What one model's tasks still need (``plan``: every model's tasks grouped by weights):
    the groups it leads with a task to do, at the bytes not in the cache yet, and its tasks
    that get the rows of identical weights instead (step1 = step0, another model's
    checkpoint)."""
    todo = [s for s in run.steps if not layout.done(run.name, s, analyses,
                                                    run.stats.stats_id)]
    left, fetch_steps, copied = set(todo), [], 0
    for g in plan.groups:
        mine = sum(1 for t in g.tasks if t.model == run.source.model and t.step in left)
        leads = g.leader.model == run.source.model and g.leader.step in left
        fetch_steps += [g.leader.step] if leads else []
        copied += mine - leads
    fetch = run.source.resolve(fetch_steps)
    need = sum(run.source.bytes_to_download(r, names) for r in fetch)
    return Downloads(todo, copied, fetch, need, max([r.nbytes for r in fetch] or [0]), *limit)


def plan_lines(src: SourceConfig, sc: ScoringConfig, run, dl: Downloads,
               targets: Held, nnz: dict[str, int] | None = None,
               groups: int = 0, rates: dict | None = None, memory: bool = True) -> list[str]:
    """One model's plan: steps (done, copied), bytes still to download, disk, targets, memory
    (``memory``: every line of the memory plan, else its peak) and, with measured ``rates``,
    the expected seconds per step (``nnz``, ``groups``: as :func:`checkpoint_plan`)."""
    steps, rows = run.steps, run.stats.rows
    plan = checkpoint_plan(sc, run.config, rows, targets, nnz, groups)
    limit = "" if dl.limit is None else (f"; the loader's limit {human_bytes(dl.limit)} "
                                         f"({dl.limit_why})")
    left = sorted(dl.todo)
    lines = [f"model {run.model}: {len(steps)} steps: {len(steps) - len(left)} done, {len(left)} "
             f"to score: {left[:6]}{' ...' if len(left) > 6 else ''} ({dl.copied} of them with "
             f"the weights of an earlier step: copied, not downloaded)",
             f"download {human_bytes(dl.bytes)} still (cached files excluded); disk at any time "
             f"<= {human_bytes(dl.held(src.prefetch))} ({src.prefetch + 1} checkpoints){limit}",
             f"targets: {targets.mode} ({targets.why})", intervals_line(sc, groups)]
    lines.append(norms_line(plan, run.stats.stats_id, rates))
    if not memory:
        return lines + [f"memory on {sc.device} ({sc.dtype}, V={rows:,}): peak total "
                        f"{plan.total / 1e9:.2f} GB"]
    return lines + [f"memory on {sc.device} ({sc.dtype}, V={rows:,}):",
                    *("  " + line for line in plan.lines(rates))]


def norms_line(plan: Plan, stats_id: str | None, rates: dict | None) -> str:
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


def intervals_line(sc: ScoringConfig, groups: int) -> str:
    """Whether the rows get ceiling, ci_low and ci_high, and why not where they do not."""
    if not sc.intervals:
        return ("ceiling and intervals: off (--no-intervals): value, chance and chance_sd; "
                "above_chance from chance_sd alone, no effect")
    if groups < 2:
        return ("ceiling and intervals: none: the statistics keep no document groups (build "
                "them with --groups 10, the default, or `stats compute --groups 10`)")
    return (f"ceiling and intervals: on, from G = {groups} document groups (two halves; "
            f"a delete-a-group jackknife, {groups} replicates)")


def total_lines(src: SourceConfig, sc: ScoringConfig, runs, dls: dict,
                targets: dict, shapes: dict, rates: dict[str, float]) -> list[str]:
    """The whole run: tasks, downloads and disk over every model, and how long it should take
    (:mod:`.estimate`: each step's plan at the dense and sparse ``rates`` measured now, the
    ones the per-step lines use; ``shapes``: each statistics file's (nnz, groups))."""
    plans = [(checkpoint_plan(sc, r.config, r.stats.rows, targets[r.stats.path],
                              *shapes[r.stats.path]), len(dls[r.name].fetch)) for r in runs]
    seconds = sum(p.seconds(rates) * n for p, n in plans)
    flops = sum(p.flops_per_step * n for p, n in plans)
    nbytes = sum(d.bytes for d in dls.values())
    fetches = [r.fetch_rate for r in runs if r.fetch_rate is not None]
    rate = Rate(sum(x.nbytes for x in fetches), sum(x.seconds for x in fetches)) \
        if fetches else None
    when = estimate(seconds, flops, rates, nbytes, rate, src.prefetch)
    if len(runs) == 1:
        return [f"time: {when}"]
    tasks = sum(len(r.steps) for r in runs)
    todo = sum(len(d.todo) for d in dls.values())
    fetched = sum(len(d.fetch) for d in dls.values())
    return [f"all {len(runs)} models: {tasks} (model, step) tasks, {todo} to do: {fetched} "
            f"checkpoints to download ({human_bytes(nbytes)} still), "
            f"{sum(d.copied for d in dls.values())} copied; disk at any time <= "
            f"{human_bytes(max(d.held(src.prefetch) for d in dls.values()))} (the models one "
            "after another)", f"time: {when}"]
