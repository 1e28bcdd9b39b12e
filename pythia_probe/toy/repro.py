"""Shared pieces of the toy reproduction scripts (analyses/toy_*.py): their flags (one config
dataclass, parsed with the commands' idiom), the settings line, markdown tables, and writing
tables and figures through the one atomic writer."""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pythia_probe.cli import parse_configs
from pythia_probe.fileio import atomic_write, write_text
from pythia_probe.results import read_manifest
from pythia_probe.toy.config import TrainConfig


@dataclass(frozen=True)
class ReproFlags:
    """Where a reproduction trains and writes."""

    paper: bool = False
    """The paper's exact settings (TinyStories from the hub; needs a GPU)."""
    run_dir: str | None = None
    """Training run folder (default: results/toy/runs/<name>, with _paper for --paper)."""
    results: str = "results/toy"
    """Where tables and figures go."""


def parse_flags(argv: list[str] | None, name: str, prog: str, doc: str | None,
                extra: tuple[type, ...] = ()) -> tuple[ReproFlags, ...]:
    """ReproFlags (run_dir resolved for ``name``) and any ``extra`` configs from ``argv``."""
    values = parse_configs([ReproFlags, *extra], argv, prog, doc)
    flags = ReproFlags(**values[0])
    if flags.run_dir is None:
        flags = dataclasses.replace(
            flags, run_dir=f"results/toy/runs/{name}{'_paper' if flags.paper else ''}")
    return (flags, *(cls(**v) for cls, v in zip(extra, values[1:], strict=True)))


def settings_line(cfg: TrainConfig, run_dir: str | Path) -> str:
    """One line naming the run's settings, with the effective |V| from its manifest."""
    d_vocab = read_manifest(run_dir)["config"]["d_vocab"]
    return (f"settings: dataset={cfg.dataset} tokenizer={cfg.tokenizer} |V|={d_vocab} "
            f"T={cfg.seq_len} N={cfg.n_seqs} batch={cfg.batch_size} epochs={cfg.epochs} "
            f"lr={cfg.lr} L={cfg.layers} (SGD, zero init; theory from the first batch)")


def markdown(table: pd.DataFrame) -> str:
    """A GitHub markdown table (floats to 6 decimals; missing values as "-")."""
    def fmt(v) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and pd.isna(v)):
            return "-"
        return f"{v:.6f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    return "\n".join(lines)


def write_csv(path: str | Path, table: pd.DataFrame) -> Path:
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    return write_text(path, buf.getvalue())


def save_figure(fig: Figure, path: str | Path, **kw) -> Path:
    """A PNG through the atomic writer (no pyplot: no backend is chosen)."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", **kw))
