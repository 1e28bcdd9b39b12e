"""Per layer (and head), when agreement with the leading terms peaks and when it leaves: the
table and its rules are :mod:`pythia_probe.summary.table`, and every name of it is also
``pythia_probe.summary.NAME`` (``summary_table``, ``report``, ``paper_layers``, ...), loaded on
first use; here are only the command's flags and ``main``, so that ``python -m
pythia_probe.summary --help`` imports no pandas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pythia_probe.cli import parse_config
from pythia_probe.fileio import check_writable
from pythia_probe.lazy import forwarding


@dataclass(frozen=True)
class SummaryConfig:
    """Per layer (and head) of a results folder: the step where agreement with the theory
    peaks and the first step after it below half of the peak, on the effect scale (0 =
    chance, 1 = ceiling) where the table has a ceiling, else on value - chance, with
    intervals; written to OUT/summary.parquet and printed."""

    results: str
    """Folder of Parquet result shards (a sweep's --out)."""
    out: str | None = None
    """Where summary.parquet goes (default: RESULTS)."""
    heads: bool = False
    """Print the per-head rows too (always written)."""


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(SummaryConfig, None if argv is None else list(argv),
                       "python -m pythia_probe.summary")
    from pythia_probe.results import read_results  # deferred: --help
    from pythia_probe.summary.table import report  # deferred: --help
    df = read_results(cfg.results)
    check_writable(cfg.out or cfg.results, "--out" if cfg.out else "--results")
    print(report(df, cfg.out or cfg.results, heads=cfg.heads))
    return 0


__getattr__ = forwarding(__name__, "pythia_probe.summary.table")
