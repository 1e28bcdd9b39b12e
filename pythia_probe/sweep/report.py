"""What a sweep prints first, its plan (:func:`plan_lines`), and what it leaves besides its
shards once every task of the run is done: the summary (per layer and head, the step where
agreement peaks and the step it leaves, :mod:`pythia_probe.summary`) written to
``OUT/summary.parquet`` and printed, and the figures (:func:`pythia_probe.plots.plot_run`: the
paper's Figures 6 and 7, a picture of every metric, the models side by side when the table holds
several) drawn into ``OUT/plots``. Takes the :class:`~pythia_probe.sweep.config.OutputConfig`
part.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pythia_probe import plots, summary
from pythia_probe.planner.sweep import SweepPlan
from pythia_probe.results import NOT_SHARDS, read_manifest, read_results
from pythia_probe.sweep.config import OutputConfig
from pythia_probe.sweep.held import uncached
from pythia_probe.sweep.prepare import Prepared
from pythia_probe.sweep.source import lacking_lines, ledger_lines

log = logging.getLogger(__name__)


def finish(output: OutputConfig) -> list[str]:
    """Summarise the folder's table (``OUT/summary.parquet``) and draw its figures (unless
    ``--no-plots``); returns the lines to print."""
    out = Path(output.out)
    if not any(p.name not in NOT_SHARDS for p in out.rglob("*.parquet")):
        return ["summary and figures: none, no task wrote a shard"]
    df = read_results(out)
    lines = [summary.report(df, out)]
    if output.plots:
        lines.append(_draw(df, output))
    return lines


def _draw(df, output: OutputConfig) -> str:
    """The figures; a failure to draw them leaves the tables as they are and says so."""
    try:
        paths = plots.plot_run(df, output.figures, manifest=read_manifest(output.out))
    except Exception as err:  # noqa: BLE001 - the shards and summary are written already
        log.warning("figures not drawn (%s: %s); the tables are complete: draw them with "
                    "`python -m pythia_probe.plots --results %s`", type(err).__name__, err,
                    output.out)
        return "figures: not drawn (see the warning)"
    return (f"drew {len(paths)} figures into {output.figures} (Figures 6 and 7: "
            f"{_paper(paths)})")


def _paper(paths: list[Path]) -> str:
    paper = [str(p) for p in paths if p.name.endswith(("figure6.png", "figure7.png"))]
    return ", ".join(paper) if paper else "not drawn: the table has no embedding or attention rows"


def pending_line(out: str) -> str:
    """What a share of a run that finished before the others says instead."""
    return (f"summary and figures: when every share of the run is done (the last one to finish "
            f"writes them), or now with `python -m pythia_probe.summary --results {out}` and "
            f"`python -m pythia_probe.plots --results {out}`")


def plan_lines(job: Prepared, planned: SweepPlan, rates, shard) -> list[str]:
    """What every run prints first (and --dry-run only)."""
    runs, lines, seen = job.runs, [], set()
    for r in runs:
        if r.stats.path not in seen:
            seen.add(r.stats.path)
            users = [x.model for x in runs if x.stats.path == r.stats.path]
            shared = f" (shared by {', '.join(users)})" if len(users) > 1 else ""
            lines += [line + shared if line.startswith("statistics") else line
                      for line in r.stats.lines()]
    for r in runs:
        lines += planned.model_lines(r, rates, uncached, memory=len(runs) == 1)
        lines += ledger_lines(r.ledger, r.model)
    lines += lacking_lines(runs) + planned.total_lines(rates)
    if shard[1] > 1:
        i, n = shard
        lines.append(f"this process: share {i} of {n} (the plan's groups of identical weights "
                     f"number {i}, {i + n}, {i + 2 * n}, ...)")
    return lines
